package io.pegaflow.engine;

import static org.assertj.core.api.Assertions.assertThat;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.LongStream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;

/**
 * {@link LayerOverlaps#find} answers exactly what {@link LayerRegion#overlaps} over every pair
 * answers (seeded tries, {@link Seeds}), and does so for 120k layers, including 120k layers
 * interleaved in one tensor where every pair of extents intersects.
 */
class LayerOverlapsTest {
    private static final int MANY = 120_000;

    static LongStream tries() {
        return Seeds.seeds(600);
    }

    @ParameterizedTest(name = "seed {0}")
    @MethodSource("tries")
    void findAgreesWithEveryPair(long seed) {
        Seeds.check(seed, g -> {
            int n = g.intIn("regions", 2, 7);
            long stride = 16L * g.intIn("strideUnits", 1, 6);
            List<LayerRegion> regions = new ArrayList<>();
            while (regions.size() < n) {
                LayerRegion r = region(g, "l" + regions.size(), stride);
                try {
                    r.validate();
                    regions.add(r);
                } catch (InvalidArgumentException invalid) {
                    // draw another: find() takes valid regions only
                }
            }
            int[] pair = LayerOverlaps.find(regions);
            boolean any = false;
            for (int i = 0; i < n; i++) {
                for (int j = i + 1; j < n; j++) {
                    any |= regions.get(i).overlaps(regions.get(j));
                }
            }
            assertThat(pair != null).as("find %s vs pairwise %s for %s", pair == null ? null : List.of(pair[0], pair[1]),
                    any, regions).isEqualTo(any);
            if (pair != null) {
                assertThat(pair[0]).isLessThan(pair[1]);
                assertThat(regions.get(pair[0]).overlaps(regions.get(pair[1]))).isTrue();
            }
        });
    }

    /** Small regions in a small window (overlaps are frequent); one in four of another stride; single blocks may span rows. */
    private static LayerRegion region(Seeds.Gen g, String name, long stride) {
        long s = g.intIn(name + ".otherStride", 0, 3) == 0 ? stride + 16 : stride;
        int blocks = g.intIn(name + ".blocks", 1, 4);
        long seg = 16L * g.intIn(name + ".segUnits", 1, (int) (blocks == 1 ? 3 * s / 16 : s / 16));
        long base = 4096 + 16L * g.intIn(name + ".baseUnits", 0, 40);
        boolean split = g.intIn(name + ".split", 0, 1) == 1;
        long segOff = split ? 16L * g.intIn(name + ".segOffUnits", 1, 30) : 0;
        return new LayerRegion(name, split ? KvLayout.SPLIT_KV : KvLayout.MLA, base, 1 << 20, blocks, s, seg, segOff);
    }

    @Test
    void oneHundredTwentyThousandSeparateLayers() {
        List<LayerRegion> regions = new ArrayList<>(MANY);
        long base = 1L << 32;
        for (int i = 0; i < MANY; i++) {
            long stride = 256L << (i % 3);
            LayerRegion r = new LayerRegion("layers." + i, KvLayout.SPLIT_KV, base, 8 * stride, 4, stride, 256, 4 * stride);
            regions.add(r);
            base += 8 * stride + 4096;
        }
        assertThat(timed("120k separate layers", regions)).isNull();
    }

    /** Every layer's extent spans the tensor, so comparing extents alone would leave ~7.2e9 pairs to test. */
    @Test
    void oneHundredTwentyThousandLayersInterleavedInOneTensor() {
        long slot = 64;
        long stride = MANY * slot; // one block holds every layer's slot
        long base = 1L << 32;
        List<LayerRegion> regions = new ArrayList<>(MANY + 1);
        for (int i = 0; i < MANY; i++) {
            regions.add(new LayerRegion("layers." + i, KvLayout.MLA, base + i * slot, 4 * stride, 4, stride, slot, 0));
        }
        assertThat(timed("120k interleaved layers", regions)).isNull();
        // One more layer whose two 16-byte pieces lie inside blocks 1 and 2 of layer 77.
        regions.add(new LayerRegion("intruder", KvLayout.MLA, base + stride + 77 * slot + 8, 4 * stride, 2, stride, 16, 0));
        assertThat(timed("120k interleaved layers + one overlapping", regions)).containsExactly(77, MANY);
    }

    private static int[] timed(String what, List<LayerRegion> regions) {
        return assertTimeoutPreemptively(Duration.ofSeconds(10), () -> {
            long t0 = System.nanoTime();
            int[] pair = LayerOverlaps.find(regions);
            System.out.printf("LayerOverlaps.find, %s: %.1f ms%n", what, (System.nanoTime() - t0) / 1e6);
            return pair;
        });
    }
}
