package io.pegaflow.engine.store;

import static org.assertj.core.api.Assertions.assertThat;

import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.Seeds;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.stream.LongStream;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;

/**
 * The open-addressing block table against a HashMap model under random puts and removes.
 * Seeded tries ({@link Seeds}): a failure names its seed; rerun it alone with
 * {@code -Dpegaflow.seed=<seed>}.
 */
class BlockTableProperties {
    private static final NamespaceIndex NS = new NamespaceIndex("ns", new NamespaceLayout(1,
            List.of(new NamespaceLayout.LayerGeometry("l", KvLayout.MLA, 16))));

    static LongStream tries200() {
        return Seeds.seeds(200);
    }

    @ParameterizedTest(name = "seed {0}")
    @MethodSource("tries200")
    void behavesLikeAMap(long trySeed) {
        Seeds.check(trySeed, g -> behavesLikeAMap(g.intIn("steps", 1, 2000), g.longIn("seed", 0, Long.MAX_VALUE)));
    }

    void behavesLikeAMap(int steps,
            long seed) {
        Random rnd = new Random(seed);
        BlockTable table = new BlockTable();
        Map<HashKey, Block> model = new HashMap<>();
        List<byte[]> universe = new ArrayList<>();
        byte[] sharedPrefix = new byte[32];
        rnd.nextBytes(sharedPrefix);
        for (int i = 0; i < 300; i++) {
            byte[] h = switch (rnd.nextInt(4)) {
                case 0 -> new byte[1 + rnd.nextInt(7)]; // shorter than one word
                case 1 -> Arrays.copyOf(sharedPrefix, 33 + rnd.nextInt(31)); // same first 32 bytes, longer
                default -> new byte[32];
            };
            for (int b = (h.length > 32 ? 32 : 0); b < h.length; b++) {
                h[b] = (byte) rnd.nextInt();
            }
            universe.add(h);
        }
        for (int s = 0; s < steps; s++) {
            byte[] h = universe.get(rnd.nextInt(universe.size()));
            HashKey key = HashKey.of(h);
            Block present = model.get(key);
            assertThat(table.get(h)).isSameAs(present);
            if (present == null) {
                Block b = new Block(NS, key, 0);
                table.put(b);
                model.put(key, b);
            } else if (rnd.nextBoolean()) {
                assertThat(table.remove(present)).isTrue();
                model.remove(key);
            }
            assertThat(table.size()).isEqualTo(model.size());
        }
        for (byte[] h : universe) {
            assertThat(table.get(h)).isSameAs(model.get(HashKey.of(h)));
        }
        assertThat(table.values()).containsExactlyInAnyOrderElementsOf(model.values());
    }
}
