package io.pegaflow.engine.ssd;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.InvalidArgumentException;
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
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.LongAdder;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The tier alone: queue pressure, ring wrap, a full disk, files of other formats, and reads' destinations. */
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
    void theListenerHearsEveryRecordIndexedAndEveryOneDroppedByTheRingOrForgotten() throws Exception {
        List<String> heard = java.util.Collections.synchronizedList(new java.util.ArrayList<>());
        try (SsdTier tier = open(new SsdConfig(List.of(dir), 64 * 1024, 1, 64, 1, 1, 8))) {
            tier.listen(new SsdTier.Listener() {
                @Override
                public void stored(String namespace, byte[] hash) {
                    heard.add("+" + namespace + ":" + hash[0]);
                }

                @Override
                public void removed(String namespace, byte[] hash) {
                    heard.add("-" + namespace + ":" + hash[0]);
                }
            });
            for (int i = 0; i < 4; i++) { // room for 3: the 4th write overwrites the first
                tier.offer("ns", hash(i), SLOTS, pattern(i));
                assertThat(tier.awaitWritten(10_000)).isTrue();
            }
            assertThat(tier.forget("ns")).isEqualTo(3);
        }
        int[] first = {hash(0)[0], hash(1)[0], hash(2)[0], hash(3)[0]};
        assertThat(heard.subList(0, 3)).containsExactly("+ns:" + first[0], "+ns:" + first[1], "+ns:" + first[2]);
        assertThat(heard.subList(3, 5)).as("the wrap drops the oldest before the 4th is indexed")
                .containsExactly("-ns:" + first[0], "+ns:" + first[3]);
        assertThat(heard.subList(5, 8)).containsExactlyInAnyOrder("-ns:" + first[1], "-ns:" + first[2], "-ns:" + first[3]);
        assertThat(heard).hasSize(8);
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
    void twoReadsIntoOneDestinationAreRefusedOrBothRecordsSurvive() throws Exception {
        // issue 37: pegaflow-bench ssd read block i and i+32 into one slice at once, and the
        // good record whose checksum then failed left the index for good.
        long[] big = {256 * 1024, 256 * 1024, 256 * 1024, 256 * 1024}; // 1 MiB: both reads are in flight together
        int pairs = 20;
        try (SsdTier tier = open(SsdConfig.of(List.of(dir), 64L << 20).withThreads(1, 2));
                Arena arena = Arena.ofShared()) {
            for (int i = 0; i < 2 * pairs; i++) {
                assertThat(tier.offer("ns", hash(i), big, pattern(i))).isTrue();
            }
            assertThat(tier.awaitWritten(30_000)).isTrue();
            assertThat(tier.blocks()).isEqualTo(2 * pairs);
            MemorySegment shared = arena.allocate(1 << 20, SsdRecord.PAGE);
            for (int p = 0; p < pairs; p++) {
                CompletableFuture<SsdTier.ReadOutcome> first = new CompletableFuture<>();
                CompletableFuture<SsdTier.ReadOutcome> second = new CompletableFuture<>();
                tier.read("ns", hash(2 * p), big, shared, first::complete);
                try {
                    tier.read("ns", hash(2 * p + 1), big, shared, second::complete);
                } catch (InvalidArgumentException e) {
                    assertThat(e).hasMessageContaining(Long.toHexString(shared.address()));
                    second.complete(null); // refused: the first read still owned the destination
                }
                first.get(10, TimeUnit.SECONDS);
                second.get(10, TimeUnit.SECONDS);
            }
            assertThat(count(Counter.SSD_CHECKSUM_FAILURES)).as("no good record failed its check").isZero();
            assertThat(tier.blocks()).as("every record stays indexed").isEqualTo(2 * pairs);
            MemorySegment own = arena.allocate(1 << 20, SsdRecord.PAGE);
            for (int i = 0; i < 2 * pairs; i++) {
                CompletableFuture<SsdTier.ReadOutcome> f = new CompletableFuture<>();
                tier.read("ns", hash(i), big, own, f::complete);
                assertThat(f.get(10, TimeUnit.SECONDS)).as("record %d read alone", i).isEqualTo(SsdTier.ReadOutcome.OK);
                assertThat(holds(own, i)).as("record %d's bytes", i).isTrue();
            }
        }
    }

    @Test
    void aReadIntoADestinationOverlappingOneInFlightIsRefusedNamingBothRanges() throws Exception {
        try (SsdTier tier = open(SsdConfig.of(List.of(dir), 1 << 20)); Arena arena = Arena.ofShared()) {
            tier.offer("ns", hash(0), SLOTS, pattern(0));
            tier.offer("ns", hash(1), SLOTS, pattern(1));
            assertThat(tier.awaitWritten(10_000)).isTrue();
            MemorySegment mem = arena.allocate(5 * SsdRecord.PAGE, SsdRecord.PAGE);
            MemorySegment first = mem.asSlice(0, 3 * SsdRecord.PAGE);
            MemorySegment overlapping = mem.asSlice(2 * SsdRecord.PAGE, 3 * SsdRecord.PAGE); // its last page is first's
            CountDownLatch reading = new CountDownLatch(1);
            CountDownLatch release = new CountDownLatch(1);
            tier.afterStraightRead = d -> { // holds the first read in flight
                reading.countDown();
                try {
                    release.await();
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            };
            CompletableFuture<SsdTier.ReadOutcome> f = new CompletableFuture<>();
            tier.read("ns", hash(0), SLOTS, first, f::complete);
            assertThat(reading.await(10, TimeUnit.SECONDS)).isTrue();
            assertThatThrownBy(() -> tier.read("ns", hash(1), SLOTS, overlapping, o -> {
                throw new AssertionError("a refused read completed: " + o);
            })).isInstanceOf(InvalidArgumentException.class)
                    .hasMessageContaining(range(overlapping)).hasMessageContaining(range(first));
            release.countDown();
            assertThat(f.get(10, TimeUnit.SECONDS)).isEqualTo(SsdTier.ReadOutcome.OK);
            assertThat(holds(first, 0)).isTrue();
            tier.afterStraightRead = null;
            assertThat(read(tier, 1, overlapping)).as("accepted once the first read completed").isEqualTo(SsdTier.ReadOutcome.OK);
            assertThat(holds(overlapping, 1)).isTrue();
            assertThat(tier.blocks()).isEqualTo(2);
        }
    }

    @Test
    void aRecordWhoseDestinationIsOverwrittenDuringTheStraightReadIsReadAgainThroughStagingAndKept() throws Exception {
        try (SsdTier tier = open(SsdConfig.of(List.of(dir), 1 << 20)); Arena arena = Arena.ofShared()) {
            tier.offer("ns", hash(0), SLOTS, pattern(0));
            assertThat(tier.awaitWritten(10_000)).isTrue();
            MemorySegment dst = arena.allocate(12 * 1024, SsdRecord.PAGE); // page-aligned: read straight into it
            AtomicInteger straightReads = new AtomicInteger();
            tier.afterStraightRead = d -> {
                if (straightReads.getAndIncrement() == 0) {
                    d.asSlice(5000, 100).fill((byte) 0x5A); // another writer, between the disk and the checksum
                }
            };
            assertThat(read(tier, 0, dst)).isEqualTo(SsdTier.ReadOutcome.OK);
            assertThat(straightReads.get()).isEqualTo(1);
            assertThat(holds(dst, 0)).as("the staged copy replaced the overwritten bytes").isTrue();
            assertThat(count(Counter.SSD_READ_RETRIES)).isEqualTo(1);
            assertThat(count(Counter.SSD_CHECKSUM_FAILURES)).isZero();
            assertThat(tier.contains("ns", hash(0), 0, 32)).as("the record stays indexed").isTrue();
            dst.fill((byte) 0);
            assertThat(read(tier, 0, dst)).isEqualTo(SsdTier.ReadOutcome.OK);
            assertThat(holds(dst, 0)).isTrue();
            assertThat(count(Counter.SSD_READ_RETRIES)).as("a clean read needs no second one").isEqualTo(1);
        }
    }

    @Test
    void aDamagedPayloadFailsTheStagedReadTooAndLeavesTheIndex() throws Exception {
        try (SsdTier tier = open(SsdConfig.of(List.of(dir), 1 << 20).withThreads(1, 1))) {
            tier.offer("ns", hash(0), SLOTS, pattern(0));
            assertThat(tier.awaitWritten(10_000)).isTrue();
        }
        Path shard = dir.resolve("pegaflow-ssd-0.shard");
        try (var ch = java.nio.channels.FileChannel.open(shard, java.nio.file.StandardOpenOption.READ,
                java.nio.file.StandardOpenOption.WRITE); Arena arena = Arena.ofConfined()) {
            MemorySegment page = arena.allocate(SsdRecord.PAGE);
            long at = 2L * SsdRecord.PAGE; // file header, record header, then the payload
            ch.read(page.asByteBuffer(), at);
            page.set(ValueLayout.JAVA_BYTE, 100, (byte) ~page.get(ValueLayout.JAVA_BYTE, 100));
            ch.write(page.asByteBuffer(), at);
        }
        try (SsdTier tier = open(SsdConfig.of(List.of(dir), 1 << 20)); Arena arena = Arena.ofShared()) {
            MemorySegment dst = arena.allocate(12 * 1024, SsdRecord.PAGE);
            assertThat(read(tier, 0, dst)).isEqualTo(SsdTier.ReadOutcome.CORRUPT);
            assertThat(count(Counter.SSD_CHECKSUM_FAILURES)).isEqualTo(1);
            assertThat(count(Counter.SSD_READ_RETRIES)).isZero();
            assertThat(tier.contains("ns", hash(0), 0, 32)).isFalse();
        }
    }

    private static String range(MemorySegment m) {
        return "[0x" + Long.toHexString(m.address()) + ", 0x" + Long.toHexString(m.address() + m.byteSize()) + ")";
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
