package io.pegaflow.engine.ssd;

import static org.assertj.core.api.Assertions.assertThat;

import io.pegaflow.engine.metrics.Counter;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.EnumMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.LongAdder;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The tier alone: queue pressure, ring wrap, a full disk, and files of other formats. */
class SsdTierTest {
    private static final long[] SLOTS = {4096, 4096, 2048, 2048}; // 12 KiB payload, a 16 KiB record

    @TempDir
    Path dir;

    private final Map<Counter, LongAdder> counts = new EnumMap<>(Counter.class);

    private long count(Counter c) {
        LongAdder a = counts.get(c);
        return a == null ? 0 : a.sum();
    }

    private SsdTier open(SsdConfig config) {
        return SsdTier.open(config, (c, d) -> counts.computeIfAbsent(c, k -> new LongAdder()).add(d));
    }

    private static byte[] hash(int i) {
        byte[] h = new byte[32];
        for (int k = 0; k < h.length; k++) {
            h[k] = (byte) (i * 31 + k);
        }
        return h;
    }

    private static SsdTier.Source pattern(int i) {
        return dst -> {
            for (long at = 0; at < dst.byteSize(); at++) {
                dst.set(ValueLayout.JAVA_BYTE, at, (byte) (i + at * 7));
            }
            return true;
        };
    }

    private static boolean holds(MemorySegment m, int i) {
        for (long at = 0; at < m.byteSize(); at++) {
            if (m.get(ValueLayout.JAVA_BYTE, at) != (byte) (i + at * 7)) {
                return false;
            }
        }
        return true;
    }

    private static SsdTier.ReadOutcome read(SsdTier tier, int i, MemorySegment dst) throws Exception {
        CompletableFuture<SsdTier.ReadOutcome> f = new CompletableFuture<>();
        tier.read("ns", hash(i), SLOTS, dst, f::complete);
        return f.get(10, TimeUnit.SECONDS);
    }

    @Test
    void aFullQueueDropsTheOfferAtOnceAndCountsIt() throws Exception {
        CountDownLatch taken = new CountDownLatch(1);
        CountDownLatch release = new CountDownLatch(1);
        try (SsdTier tier = open(SsdConfig.of(List.of(dir), 1 << 20).withQueue(1).withThreads(1, 1))) {
            assertThat(tier.offer("ns", hash(0), SLOTS, dst -> {
                taken.countDown();
                try {
                    release.await();
                } catch (InterruptedException e) {
                    return false;
                }
                return pattern(0).fill(dst);
            })).isTrue();
            assertThat(taken.await(10, TimeUnit.SECONDS)).isTrue(); // the only writer is busy with block 0
            assertThat(tier.offer("ns", hash(1), SLOTS, pattern(1))).as("queued").isTrue();
            long t0 = System.nanoTime();
            assertThat(tier.offer("ns", hash(2), SLOTS, pattern(2))).as("queue full: dropped").isFalse();
            assertThat(System.nanoTime() - t0).as("without waiting").isLessThan(TimeUnit.SECONDS.toNanos(1));
            assertThat(count(Counter.SSD_WRITE_QUEUE_FULL)).isEqualTo(1);
            release.countDown();
            assertThat(tier.awaitWritten(10_000)).isTrue();
            assertThat(tier.blocks()).isEqualTo(2);
        }
    }

    @Test
    void theRingWrapsOverItsOldestRecords() throws Exception {
        // 16 shard pages: a header page and room for 3 records of 16 KiB (the 4th wraps).
        try (SsdTier tier = open(new SsdConfig(List.of(dir), 64 * 1024, 1, 64, 1, 1, 8));
                Arena arena = Arena.ofShared()) {
            for (int i = 0; i < 5; i++) {
                tier.offer("ns", hash(i), SLOTS, pattern(i));
                assertThat(tier.awaitWritten(10_000)).isTrue();
            }
            assertThat(count(Counter.SSD_OVERWRITTEN_BLOCKS)).isEqualTo(2);
            MemorySegment dst = arena.allocate(12 * 1024);
            assertThat(read(tier, 0, dst)).isEqualTo(SsdTier.ReadOutcome.GONE);
            assertThat(read(tier, 4, dst)).isEqualTo(SsdTier.ReadOutcome.OK);
            assertThat(holds(dst, 4)).isTrue();
        }
        try (SsdTier tier = open(new SsdConfig(List.of(dir), 64 * 1024, 1, 64, 1, 1, 8))) {
            assertThat(tier.blocks()).as("after a restart, the three newest").isEqualTo(3);
        }
    }

    @Test
    void aFullDiskDegradesToDramOnlyAndTheShardWrapsWhereTheDiskEnded() throws Exception {
        Path mount = dir.resolve("small");
        Files.createDirectories(mount);
        Process p = new ProcessBuilder("mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", mount.toString())
                .redirectErrorStream(true).start();
        boolean mounted = p.waitFor(10, TimeUnit.SECONDS) && p.exitValue() == 0;
        Assumptions.assumeTrue(mounted, "needs root to mount a 128 KiB tmpfs: " + new String(p.getInputStream().readAllBytes()));
        try (SsdTier tier = open(SsdConfig.of(List.of(mount), 8L << 20).withThreads(1, 1));
                Arena arena = Arena.ofShared()) {
            for (int i = 0; i < 20; i++) {
                tier.offer("ns", hash(i), SLOTS, pattern(i));
                assertThat(tier.awaitWritten(10_000)).isTrue();
            }
            assertThat(count(Counter.SSD_DISK_FULL)).as("ENOSPC seen").isGreaterThan(0);
            assertThat(count(Counter.SSD_WRITE_BLOCKS)).as("writes go on after wrapping").isGreaterThan(8);
            MemorySegment dst = arena.allocate(12 * 1024);
            assertThat(read(tier, 19, dst)).isEqualTo(SsdTier.ReadOutcome.OK);
            assertThat(holds(dst, 19)).isTrue();
        } finally {
            new ProcessBuilder("umount", mount.toString()).start().waitFor(10, TimeUnit.SECONDS);
        }
    }

    @Test
    void aRecordOfOtherSlotGeometryIsNotReadAndLeavesTheIndex() throws Exception {
        try (SsdTier tier = open(SsdConfig.of(List.of(dir), 1 << 20)); Arena arena = Arena.ofShared()) {
            tier.offer("ns", hash(0), SLOTS, pattern(0));
            assertThat(tier.awaitWritten(10_000)).isTrue();
            long[] other = {4096, 4096, 4096}; // same 12 KiB, other slots
            CompletableFuture<SsdTier.ReadOutcome> f = new CompletableFuture<>();
            tier.read("ns", hash(0), other, arena.allocate(12 * 1024), f::complete);
            assertThat(f.get(10, TimeUnit.SECONDS)).isEqualTo(SsdTier.ReadOutcome.GEOMETRY);
            assertThat(count(Counter.SSD_GEOMETRY_MISMATCH)).isEqualTo(1);
            assertThat(tier.contains("ns", hash(0), 0, 32)).as("not offered to the next query again").isFalse();
        }
    }

    @Test
    void aShardOfAnotherFormatVersionIsRefusedAndLeftAlone() throws Exception {
        Path shard = dir.resolve("pegaflow-ssd-0.shard");
        byte[] bytes;
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment page = arena.allocate(SsdRecord.PAGE);
            SsdRecord.writeFileHeader(page, 0, 1 << 20);
            page.set(ValueLayout.JAVA_INT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN), 8, SsdRecord.VERSION + 1);
            page.set(ValueLayout.JAVA_INT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN), SsdRecord.PAGE - 4,
                    SsdRecord.crc(page, 0, SsdRecord.PAGE - 4));
            bytes = page.toArray(ValueLayout.JAVA_BYTE);
        }
        Files.write(shard, bytes);
        try (SsdTier tier = open(SsdConfig.of(List.of(dir), 1 << 20))) {
            assertThat(tier.shardCount()).isZero();
        }
        assertThat(Files.readAllBytes(shard)).isEqualTo(bytes);
    }

    @Test
    void aRecordOfAnotherFormatVersionIsNotIndexed() throws Exception {
        try (SsdTier tier = open(SsdConfig.of(List.of(dir), 1 << 20).withThreads(1, 1))) {
            tier.offer("ns", hash(0), SLOTS, pattern(0));
            assertThat(tier.awaitWritten(10_000)).isTrue();
            tier.offer("ns", hash(1), SLOTS, pattern(1));
            assertThat(tier.awaitWritten(10_000)).isTrue();
        }
        Path shard = dir.resolve("pegaflow-ssd-0.shard");
        try (var ch = java.nio.channels.FileChannel.open(shard, java.nio.file.StandardOpenOption.READ,
                java.nio.file.StandardOpenOption.WRITE); Arena arena = Arena.ofConfined()) {
            MemorySegment page = arena.allocate(SsdRecord.PAGE);
            long at = SsdRecord.PAGE; // the first record's header
            ch.read(page.asByteBuffer(), at);
            page.set(ValueLayout.JAVA_INT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN), 8, SsdRecord.VERSION + 1);
            page.set(ValueLayout.JAVA_INT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN), SsdRecord.PAGE - 4,
                    SsdRecord.crc(page, 0, SsdRecord.PAGE - 4));
            ch.write(page.asByteBuffer(), at);
        }
        try (SsdTier tier = open(SsdConfig.of(List.of(dir), 1 << 20))) {
            assertThat(tier.blocks()).as("only the record of this format").isEqualTo(1);
            assertThat(tier.contains("ns", hash(1), 0, 32)).isTrue();
        }
    }
}
