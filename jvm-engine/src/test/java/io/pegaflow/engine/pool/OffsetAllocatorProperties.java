package io.pegaflow.engine.pool;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;
import net.jqwik.api.ForAll;
import net.jqwik.api.Property;
import net.jqwik.api.constraints.IntRange;
import net.jqwik.api.constraints.LongRange;
import org.junit.jupiter.api.Test;

/** The allocator against a reference model of live intervals, under random alloc/free sequences. */
class OffsetAllocatorProperties {

    @Property(tries = 200)
    void liveAllocationsNeverOverlapAndAccountingIsExact(
            @ForAll @IntRange(min = 1, max = 4096) int capacityUnits,
            @ForAll @IntRange(min = 1, max = 600) int steps,
            @ForAll @LongRange(min = 0, max = Long.MAX_VALUE) long seed) {
        long unit = HostPool.ALIGNMENT;
        OffsetAllocator a = new OffsetAllocator(capacityUnits * unit, unit);
        Random rnd = new Random(seed);
        List<Long> live = new ArrayList<>();
        TreeMap<Long, Long> model = new TreeMap<>(); // offset -> end
        for (int step = 0; step < steps; step++) {
            if (!live.isEmpty() && rnd.nextInt(3) == 0) {
                long h = live.remove(rnd.nextInt(live.size()));
                model.remove(a.offsetBytes(h));
                a.free(h);
            } else {
                long bytes = 1 + rnd.nextInt((int) Math.min(capacityUnits * unit, 64 * unit));
                long h = a.allocate(bytes);
                if (h == OffsetAllocator.NO_SPACE) {
                    continue;
                }
                long off = a.offsetBytes(h);
                long end = off + a.sizeBytes(h);
                assertThat(a.sizeBytes(h)).isGreaterThanOrEqualTo(bytes);
                assertThat(off % unit).isZero();
                assertThat(end).isLessThanOrEqualTo(a.capacityBytes());
                Map.Entry<Long, Long> before = model.floorEntry(off);
                Map.Entry<Long, Long> after = model.ceilingEntry(off);
                assertThat(before == null || before.getValue() <= off).as("overlaps the allocation before").isTrue();
                assertThat(after == null || after.getKey() >= end).as("overlaps the allocation after").isTrue();
                model.put(off, end);
                live.add(h);
            }
            long used = model.entrySet().stream().mapToLong(e -> e.getValue() - e.getKey()).sum();
            assertThat(a.usedBytes()).isEqualTo(used);
            assertThat(a.usedBytes() + a.freeBytes()).isEqualTo(a.capacityBytes());
            assertThat(a.liveAllocations()).isEqualTo(live.size());
        }
        for (long h : live) {
            a.free(h);
        }
        // Everything coalesced back into one range: the whole pool is allocatable again.
        assertThat(a.largestFreeBytes()).isEqualTo(a.capacityBytes());
        long all = a.allocate(a.capacityBytes());
        assertThat(all).isNotEqualTo(OffsetAllocator.NO_SPACE);
        assertThat(a.offsetBytes(all)).isZero();
    }

    @Property(tries = 500)
    void binsBracketTheSize(@ForAll @IntRange(min = 1, max = Integer.MAX_VALUE) int units) {
        int up = OffsetAllocator.binRoundUp(units);
        int down = OffsetAllocator.binRoundDown(units);
        assertThat(OffsetAllocator.binSize(up)).isGreaterThanOrEqualTo(units);
        assertThat(OffsetAllocator.binSize(down)).isLessThanOrEqualTo(units);
        assertThat(up - down).isBetween(0, 1);
        // Bins are at most 12.5% apart, so rounding wastes at most that much.
        assertThat((double) OffsetAllocator.binSize(up)).isLessThanOrEqualTo(units * 1.125 + 1);
    }

    @Test
    void exactFitAfterFragmentationAndRejectedFrees() {
        OffsetAllocator a = new OffsetAllocator(8 * 512, 512);
        long[] h = new long[8];
        for (int i = 0; i < 8; i++) {
            h[i] = a.allocate(512);
        }
        assertThat(a.allocate(1)).isEqualTo(OffsetAllocator.NO_SPACE);
        a.free(h[1]);
        a.free(h[3]);
        assertThat(a.allocate(1024)).as("two free units, not adjacent").isEqualTo(OffsetAllocator.NO_SPACE);
        a.free(h[2]);
        long merged = a.allocate(1536);
        assertThat(a.offsetBytes(merged)).isEqualTo(512);
        assertThatThrownBy(() -> a.free(h[1])).isInstanceOf(IllegalArgumentException.class).hasMessageContaining("not live");
        assertThatThrownBy(() -> a.allocate(0)).isInstanceOf(IllegalArgumentException.class);
    }

    @Test
    void unitGrowsSoHugePoolsFitInThirtyOneBits() {
        assertThat(OffsetAllocator.unitFor(30L << 30)).isEqualTo(512);
        assertThat(OffsetAllocator.unitFor(4L << 40)).isEqualTo(4096);
        OffsetAllocator a = new OffsetAllocator(4L << 40);
        long h = a.allocate(1L << 40);
        assertThat(a.sizeBytes(h)).isEqualTo(1L << 40);
    }
}
