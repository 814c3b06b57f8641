package io.pegaflow.engine;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.metrics.Gauge;
import io.pegaflow.engine.ssd.SsdConfig;
import io.pegaflow.engine.store.LocalStore;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The operator's calls on the store (pegaflow-server's /admin): clear drops what no one holds
 * and releases pins; pinned blocks survive pressure that evicts every other block, within half
 * the pool; unknown namespaces change nothing; warm reads a prefix back from a real SSD tier
 * so the next query hits at once. The copies of the pool-only tests are never made.
 */
class AdminOpsTest {
    private static final long SEG = 512; // the allocator's unit: a block takes exactly its bytes
    private final Random rnd = new Random(35);
    private LocalStore store;

    @AfterEach
    void close() {
        if (store != null) {
            store.verifyInvariants();
            store.close();
        }
    }

    /** A pool of 16 blocks of one slot each. */
    private LocalStore store() {
        store = new LocalStore(EngineConfig.builder().poolSize("8kb").sweepInterval(Duration.ZERO).build(), 16 * SEG);
        return store;
    }

    private void register(String id, String ns) {
        PlanOnly.register(store, id, ns, SEG, 64);
    }

    private BlockHashes hashes(int n) {
        return PlanOnly.hashes(rnd, n);
    }

    private void saved(String id, BlockHashes h) {
        PlanOnly.saved(store, id, h);
    }

    private int hit(String id, BlockHashes h) {
        QueryResult q = store.query(id, h);
        if (q.hasLease()) {
            store.release(id, q.lease());
        }
        return q.hitBlocks();
    }

    @Test
    void clearDropsANamespacesUnheldBlocksAndKeepsHeldOnesAndOtherNamespaces() {
        store();
        register("a", "ns-a");
        register("b", "ns-b");
        BlockHashes ha = hashes(4);
        BlockHashes hb = hashes(3);
        saved("a", ha);
        saved("b", hb);
        QueryResult held = store.query("a", ha.slice(0, 1)); // a lease holds block 0
        LocalStore.Cleared c = store.clear("ns-a", true, true);
        assertThat(c.blocks()).isEqualTo(3);
        assertThat(c.bytes()).isEqualTo(3 * SEG);
        assertThat(c.referenced()).isEqualTo(1);
        assertThat(store.stats().get(Gauge.RESIDENT_BLOCKS)).isEqualTo(4);
        assertThat(store.stats().get(Counter.ADMIN_CLEARED_BLOCKS)).isEqualTo(3);
        assertThat(hit("b", hb)).isEqualTo(3);
        store.release("a", held.lease());
        assertThat(hit("a", ha)).isEqualTo(1);
        LocalStore.Cleared all = store.clear(null, true, true);
        assertThat(all.blocks()).isEqualTo(4);
        assertThat(store.stats().get(Gauge.RESIDENT_BLOCKS)).isZero();
        assertThat(store.stats().get(Gauge.POOL_USED_BYTES)).isZero();
    }

    @Test
    void pinnedBlocksSurvivePressureThatEvictsTheRestUntilUnpinned() {
        store();
        register("a", "ns");
        BlockHashes pinned = hashes(4);
        saved("a", pinned);
        LocalStore.Pinned p = store.pin("ns", pinned);
        assertThat(p).isEqualTo(new LocalStore.Pinned(4, 0, 0));
        assertThat(store.pin("ns", pinned)).isEqualTo(new LocalStore.Pinned(0, 4, 0));
        assertThat(store.stats().get(Gauge.ADMIN_PINNED_BLOCKS)).isEqualTo(4);
        assertThat(store.stats().get(Gauge.ADMIN_PINNED_BYTES)).isEqualTo(4 * SEG);
        for (int round = 0; round < 5; round++) {
            saved("a", hashes(12)); // fills the rest of the pool, evicting the previous round
        }
        assertThat(store.stats().get(Counter.EVICTIONS)).isGreaterThanOrEqualTo(48);
        assertThat(hit("a", pinned)).isEqualTo(4);
        assertThat(store.unpin("ns", pinned)).isEqualTo(4);
        assertThat(store.stats().get(Gauge.ADMIN_PINNED_BLOCKS)).isZero();
        saved("a", hashes(16));
        assertThat(hit("a", pinned)).isZero();
    }

    @Test
    void pinsHoldAtMostHalfThePoolAndAPinPastItChangesNothing() {
        store();
        register("a", "ns");
        BlockHashes h = hashes(10);
        saved("a", h);
        assertThat(store.pin("ns", h.slice(0, 6)).pinned()).isEqualTo(6);
        assertThatThrownBy(() -> store.pin("ns", h)).isInstanceOf(QuotaExceededException.class)
                .hasMessageContaining("at most half the pool");
        assertThat(store.stats().get(Gauge.ADMIN_PINNED_BLOCKS)).isEqualTo(6);
        assertThat(store.pin("ns", h.slice(0, 8)).pinned()).isEqualTo(2);
    }

    @Test
    void pinStopsAtTheFirstBlockNotResidentAndClearReleasesPins() {
        store();
        register("a", "ns");
        BlockHashes h = hashes(5);
        saved("a", h.slice(0, 3));
        assertThat(store.pin("ns", h)).isEqualTo(new LocalStore.Pinned(3, 0, 2));
        LocalStore.Cleared c = store.clear("ns", true, false);
        assertThat(c.unpinned()).isEqualTo(3);
        assertThat(c.blocks()).isEqualTo(3);
        assertThat(store.stats().get(Gauge.ADMIN_PINNED_BLOCKS)).isZero();
    }

    @Test
    void unknownNamespacesAnswerNullAndChangeNothingAndWarmWithoutATierIsRefused() {
        store();
        register("a", "ns");
        BlockHashes h = hashes(2);
        saved("a", h);
        assertThat(store.clear("nope", true, true)).isNull();
        assertThat(store.pin("nope", h)).isNull();
        assertThat(store.unpin("nope", h)).isEqualTo(-1);
        assertThat(store.warm("nope", h)).isNull();
        assertThat(store.stats().get(Gauge.RESIDENT_BLOCKS)).isEqualTo(2);
        assertThatThrownBy(() -> store.warm("ns", h)).isInstanceOf(InvalidArgumentException.class)
                .hasMessageContaining("no SSD tier");
        assertThat(store.namespaces()).containsExactly(new LocalStore.NamespaceSummary("ns", 2, 0, 0));
        store.pin("ns", h.slice(0, 1));
        assertThat(store.namespaces()).containsExactly(new LocalStore.NamespaceSummary("ns", 2, 1, SEG));
    }

    /** 2 layers x (K, V) x 2 KiB: 8 KiB a block; the pool holds 16 of them. */
    private static final long SEGMENT = 2048;

    @TempDir
    Path dir;

    @Test
    void warmReadsAPrefixBackFromSsdSoTheNextQueryHitsAtOnceAndClearForgetsTheSsdRecords() throws Exception {
        byte[][] all = KvWorld.randomHashes(rnd, 32);
        try (PegaEngine engine = PegaEngine.create(EngineConfig.builder().poolBytes(16 * 4 * SEGMENT)
                .ssd(SsdConfig.of(List.of(dir), 8L << 20)).build());
                KvWorld world = new KvWorld("i", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 2, 64, SEGMENT, 0)) {
            world.register(engine);
            for (int i = 0; i < all.length; i += 8) {
                long[] ids = new long[8];
                for (int k = 0; k < 8; k++) {
                    ids[k] = k;
                    world.fillPattern(k, all[i + k]);
                }
                engine.save("i", 0, ids, BlockHashes.of(Arrays.copyOfRange(all, i, i + 8))).join();
                assertThat(engine.ssd().awaitWritten(10_000)).isTrue();
            }
            LocalStore s = engine.localStore();
            BlockHashes prefix = BlockHashes.of(Arrays.copyOf(all, 6)); // evicted from DRAM by the later saves
            assertThat(s.warm("ns", prefix)).isEqualTo(new LocalStore.Warming(0, 6));
            long deadline = System.nanoTime() + 10_000_000_000L;
            while (s.warm("ns", prefix).resident() < 6) {
                assertThat(System.nanoTime()).as("read back in time: %s", s.stats()).isLessThan(deadline);
                Thread.sleep(1);
            }
            assertThat(s.stats().get(Counter.ADMIN_WARMED_BLOCKS)).as("warming again starts nothing new").isEqualTo(6);
            QueryResult q = engine.query("i", prefix);
            assertThat(q.pending()).as("the first query after a warm is answered at once").isFalse();
            assertThat(q.hitBlocks()).isEqualTo(6);
            long[] dst = {40, 41, 42, 43, 44, 45};
            engine.load("i", 0, q.lease(), dst).join();
            for (int k = 0; k < 6; k++) {
                assertThat(world.holdsPattern(dst[k], all[k])).as("block %d warmed byte-identical", k).isTrue();
            }

            engine.flush(10_000); // the load's end lands beside its future: its pins go first
            LocalStore.Cleared c = s.clear("ns", true, true);
            assertThat(c.referenced()).isZero();
            assertThat(c.ssdRecords()).isEqualTo(32);
            assertThat(engine.ssd().blocks()).isZero();
            assertThat(s.stats().get(Counter.ADMIN_CLEARED_SSD_BLOCKS)).isEqualTo(32);
            QueryResult gone = engine.query("i", prefix);
            assertThat(gone.pending()).as("nothing left to read back").isFalse();
            assertThat(gone.hitBlocks()).isZero();
            assertThat(s.warm("ns", prefix)).isEqualTo(new LocalStore.Warming(0, 0));
            engine.verifyInvariants();
        }
    }
}
