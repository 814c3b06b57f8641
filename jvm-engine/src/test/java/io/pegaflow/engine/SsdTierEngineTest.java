package io.pegaflow.engine;

import static org.assertj.core.api.Assertions.assertThat;

import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.ssd.SsdConfig;
import io.pegaflow.engine.ssd.SsdRecord;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The SSD tier under an embedded engine: write-behind, eviction from DRAM then a hit from SSD
 * ("not yet" answers meanwhile), restarts, and damaged files served as misses.
 */
class SsdTierEngineTest {
    /** 2 layers x (K, V) x 2 KiB: 8 KiB a block; the pool holds 16 of them. */
    private static final long SEGMENT = 2048;
    private static final long BLOCK = 4 * SEGMENT;

    @TempDir
    Path dir;

    private PegaEngine engine(SsdConfig ssd) {
        return PegaEngine.create(EngineConfig.builder().poolBytes(16 * BLOCK).ssd(ssd).build());
    }

    private SsdConfig ssd() {
        return SsdConfig.of(List.of(dir), 8L << 20);
    }

    private static KvWorld world() {
        return new KvWorld("i", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 2, 64, SEGMENT, 0);
    }

    /** Saves hashes[from, to) through device blocks 0.., 8 at a time, letting each batch reach the disk. */
    private static void saveAll(PegaEngine engine, KvWorld world, byte[][] hashes, int from, int to) throws Exception {
        for (int i = from; i < to; i += 8) {
            int n = Math.min(8, to - i);
            long[] ids = new long[n];
            for (int k = 0; k < n; k++) {
                ids[k] = k;
                world.fillPattern(k, hashes[i + k]);
            }
            engine.save("i", 0, ids, BlockHashes.of(Arrays.copyOfRange(hashes, i, i + n))).join();
            assertThat(engine.ssd().awaitWritten(10_000)).isTrue();
        }
    }

    /** Queries until the answer is not "not yet"; returns it with the number of "not yet" answers seen. */
    private static QueryResult settle(PegaEngine engine, byte[][] hashes, int[] notYet) throws InterruptedException {
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (true) {
            QueryResult q = engine.query("i", BlockHashes.of(hashes));
            if (!q.pending()) {
                return q;
            }
            assertThat(q.lease()).as("a 'not yet' answer pins nothing").isNull();
            notYet[0]++;
            assertThat(System.nanoTime()).as("read back finished in time: %s, %s", q, engine.stats()).isLessThan(deadline);
            Thread.sleep(1);
        }
    }

    private static void loadAndCheck(PegaEngine engine, KvWorld world, QueryResult q, byte[][] hashes, long firstDst) {
        long[] dst = new long[q.hitBlocks()];
        for (int k = 0; k < dst.length; k++) {
            dst[k] = firstDst + k;
        }
        CopyResult r = engine.load("i", 0, q.lease(), dst).join();
        assertThat(r.blocks()).isEqualTo(dst.length);
        for (int k = 0; k < dst.length; k++) {
            assertThat(world.holdsPattern(dst[k], hashes[k])).as("block %d loaded back byte-identical", k).isTrue();
        }
    }

    @Test
    void evictedFromDramThenServedFromSsd() throws Exception {
        Random rnd = new Random(1);
        byte[][] hashes = KvWorld.randomHashes(rnd, 48);
        try (PegaEngine engine = engine(ssd()); KvWorld world = world()) {
            world.register(engine);
            saveAll(engine, world, hashes, 0, 48);
            assertThat(engine.stats().get(Counter.EVICTIONS)).as("the pool holds 16 of 48").isGreaterThanOrEqualTo(32);
            assertThat(engine.ssd().blocks()).isEqualTo(48);
            assertThat(PosixFilePermissions.toString(Files.getPosixFilePermissions(dir.resolve("pegaflow-ssd-0.shard"))))
                    .as("KV on disk is the owner's alone").isEqualTo("rw-------");

            byte[][] prefix = Arrays.copyOf(hashes, 6);
            int[] notYet = {0};
            QueryResult q = settle(engine, prefix, notYet);
            assertThat(notYet[0]).as("answered 'not yet' while reading back").isGreaterThan(0);
            assertThat(q.hitBlocks()).isEqualTo(6);
            loadAndCheck(engine, world, q, prefix, 40);
            assertThat(engine.stats().get(Counter.TIER_SSD_BLOCKS)).isEqualTo(6);
            assertThat(engine.stats().get(Counter.SSD_READ_BLOCKS)).isEqualTo(6);

            // Asked again: the blocks are in DRAM now, attributed to it.
            QueryResult again = engine.query("i", BlockHashes.of(prefix));
            assertThat(again.pending()).isFalse();
            assertThat(again.hitBlocks()).isEqualTo(6);
            engine.release("i", again.lease());
            assertThat(engine.stats().get(Counter.TIER_DRAM_BLOCKS)).isGreaterThanOrEqualTo(6);
            engine.verifyInvariants();
        }
    }

    @Test
    void aFullWriteQueueNeverBlocksASave() throws Exception {
        byte[][] hashes = KvWorld.randomHashes(new Random(2), 16);
        try (PegaEngine engine = engine(ssd().withQueue(1)); KvWorld world = world()) {
            world.register(engine);
            long[] ids = new long[16];
            for (int k = 0; k < 16; k++) {
                ids[k] = k;
                world.fillPattern(k, hashes[k]);
            }
            engine.save("i", 0, ids, BlockHashes.of(hashes)).join();
            QueryResult q = engine.query("i", BlockHashes.of(hashes));
            assertThat(q.hitBlocks()).as("every block stays in DRAM").isEqualTo(16);
            engine.release("i", q.lease());
            assertThat(engine.stats().get(Counter.SSD_WRITE_QUEUE_FULL)).isGreaterThan(0);
            assertThat(engine.ssd().awaitWritten(10_000)).isTrue();
            assertThat(engine.ssd().blocks() + engine.stats().get(Counter.SSD_WRITE_QUEUE_FULL)).isEqualTo(16);
            engine.verifyInvariants();
        }
    }

    @Test
    void aRestartedEngineServesItsSsdBlocks() throws Exception {
        byte[][] hashes = KvWorld.randomHashes(new Random(3), 8);
        try (PegaEngine engine = engine(ssd()); KvWorld world = world()) {
            world.register(engine);
            saveAll(engine, world, hashes, 0, 8);
        }
        try (PegaEngine engine = engine(ssd()); KvWorld world = world()) {
            assertThat(engine.ssd().blocks()).as("index rebuilt from the shard file").isEqualTo(8);
            world.register(engine);
            QueryResult q = settle(engine, hashes, new int[1]);
            assertThat(q.hitBlocks()).isEqualTo(8);
            loadAndCheck(engine, world, q, hashes, 20);
            engine.verifyInvariants();
        }
    }

    @Test
    void aFlippedBitIsAMissNeverWrongBytes() throws Exception {
        byte[][] hashes = KvWorld.randomHashes(new Random(4), 4);
        // One writer: records land in the order the blocks were sealed, so the first is block 0's.
        try (PegaEngine engine = engine(ssd().withThreads(1, 4)); KvWorld world = world()) {
            world.register(engine);
            saveAll(engine, world, hashes, 0, 4);
        }
        Path shard = dir.resolve("pegaflow-ssd-0.shard");
        long firstPayload = 2L * SsdRecord.PAGE; // file header, then the first record's header
        flip(shard, firstPayload + 100);
        try (PegaEngine engine = engine(ssd()); KvWorld world = world()) {
            world.register(engine);
            QueryResult q = settle(engine, hashes, new int[1]);
            assertThat(q.hitBlocks()).as("the damaged first block is a miss, so nothing hits").isZero();
            assertThat(engine.stats().get(Counter.SSD_CHECKSUM_FAILURES)).isEqualTo(1);
            assertThat(engine.stats().get(Counter.SSD_READ_RETRIES)).as("damaged on disk: the staged read fails too").isZero();
            assertThat(engine.ssd().blocks()).as("the damaged record left the index").isEqualTo(3);
            engine.verifyInvariants();
        }
    }

    @Test
    void aTruncatedShardIsAMissAndTheEngineKeepsServingDram() throws Exception {
        byte[][] hashes = KvWorld.randomHashes(new Random(5), 4);
        byte[][] more = KvWorld.randomHashes(new Random(6), 2);
        try (PegaEngine engine = engine(ssd()); KvWorld world = world()) {
            world.register(engine);
            saveAll(engine, world, hashes, 0, 4);
        }
        try (PegaEngine engine = engine(ssd()); KvWorld world = world()) {
            world.register(engine);
            try (RandomAccessFile f = new RandomAccessFile(dir.resolve("pegaflow-ssd-0.shard").toFile(), "rw")) {
                f.setLength(SsdRecord.PAGE); // only the file header is left
            }
            QueryResult q = settle(engine, hashes, new int[1]);
            assertThat(q.hitBlocks()).isZero();
            assertThat(engine.stats().get(Counter.SSD_READ_ERRORS)).isGreaterThan(0);
            saveAll(engine, world, more, 0, 2);
            QueryResult dram = engine.query("i", BlockHashes.of(more));
            assertThat(dram.hitBlocks()).as("DRAM still serves").isEqualTo(2);
            loadAndCheck(engine, world, dram, more, 30);
            engine.verifyInvariants();
        }
    }

    @Test
    void aForeignFileAtAShardPathIsLeftAloneAndNotRead() throws Exception {
        Path shard = dir.resolve("pegaflow-ssd-0.shard");
        byte[] foreign = new byte[3 * SsdRecord.PAGE];
        new Random(7).nextBytes(foreign);
        Files.write(shard, foreign);
        try (PegaEngine engine = engine(ssd()); KvWorld world = world()) {
            assertThat(engine.ssd().shardCount()).isZero();
            assertThat(engine.ssd().blocks()).isZero();
            world.register(engine);
            byte[][] hashes = KvWorld.randomHashes(new Random(8), 2);
            saveAll(engine, world, hashes, 0, 2);
            QueryResult q = engine.query("i", BlockHashes.of(hashes));
            assertThat(q.hitBlocks()).as("DRAM works without the tier").isEqualTo(2);
            engine.release("i", q.lease());
        }
        assertThat(Files.readAllBytes(shard)).as("the foreign file is untouched").isEqualTo(foreign);
    }

    /**
     * Conversations growing over a pool of 16 blocks with the SSD tier below: every request
     * queries its prefix (polling through "not yet"), loads what hit, saves the rest; the
     * engine's invariants hold after every step and every load is byte-identical.
     */
    @Test
    void conversationsOverATinyPoolKeepTheInvariantsAndTheBytes() throws Exception {
        Random rnd = new Random(9);
        byte[][][] convs = new byte[6][][];
        for (int c = 0; c < convs.length; c++) {
            convs[c] = KvWorld.randomHashes(rnd, 7);
        }
        try (PegaEngine engine = engine(ssd()); KvWorld world = world()) {
            world.register(engine);
            for (int step = 0; step < 120; step++) {
                byte[][] conv = convs[rnd.nextInt(convs.length)];
                int len = 1 + rnd.nextInt(conv.length);
                byte[][] prefix = Arrays.copyOf(conv, len);
                QueryResult q = settle(engine, prefix, new int[1]);
                engine.verifyInvariants();
                if (q.hitBlocks() > 0) {
                    loadAndCheck(engine, world, q, prefix, 40);
                }
                int h = q.hitBlocks();
                if (h < len) {
                    long[] ids = new long[len - h];
                    for (int k = 0; k < ids.length; k++) {
                        ids[k] = k;
                        world.fillPattern(k, prefix[h + k]);
                    }
                    engine.save("i", 0, ids, BlockHashes.of(Arrays.copyOfRange(prefix, h, len))).join();
                }
                engine.verifyInvariants();
            }
            assertThat(engine.stats().get(Counter.TIER_SSD_BLOCKS)).isGreaterThan(0);
        }
    }

    private static void flip(Path file, long at) throws IOException {
        try (RandomAccessFile f = new RandomAccessFile(file.toFile(), "rw")) {
            f.seek(at);
            int b = f.read();
            f.seek(at);
            f.write(b ^ 0x10);
        }
    }
}
