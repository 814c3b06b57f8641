package io.pegaflow.engine;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.metrics.Gauge;
import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.store.KvEventLog;
import io.pegaflow.engine.store.LocalStore;
import io.pegaflow.engine.transfer.CopyBatch;
import io.pegaflow.engine.transfer.HostTransferEngine;
import io.pegaflow.engine.transfer.LayerSplit;
import io.pegaflow.engine.transfer.TransferEngine;
import io.pegaflow.engine.transfer.TransferFuture;
import java.time.Duration;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.Function;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The {@link BlockStore} contract, written once and run against every control plane: the
 * embedded {@link LocalStore} ({@code LocalStoreContractTest}) and pegaflow-server's store
 * through its client ({@code RemoteStoreContractTest} in the server module, over grpc's
 * in-process transport). Semantics of the store: dedup, sealing, LRU eviction under
 * pressure, pins, leases and their TTL, unregister, namespace isolation, in-flight GC, copy
 * failures, close. Blocks here are 1 KiB (2 layers x 512 B, one worker) unless a test says
 * otherwise; "pool of N blocks" is N KiB.
 *
 * <p>Subclasses build the engine (or the bare control plane) for a test's
 * {@link EngineConfig}: its pool size, lease TTL and copy engine always; its clock, in-flight
 * TTL and sweep interval where the implementation lets a test set them (see
 * {@link #followsTheConfiguredClock()}). The invariants, open operations and sweeps are
 * those of the control plane wherever it runs.
 *
 * <p>Why one file past 600 lines: a contract is written once and run against every
 * implementation; split, a case could be left out of one of them.
 *
 * <p>Size: the one contract both control planes must meet, written once so neither can drift;
 * its cases share the world and engine fixtures below.
 */
public abstract class BlockStoreContract {
    private final Random rnd = new Random(42);
    private final FakeClock clock = new FakeClock();
    private PegaEngine engine;
    private KvWorld world;

    /** An engine over this implementation's control plane, configured by {@code config}; the test closes it. */
    protected abstract PegaEngine engine(EngineConfig config);

    /** This implementation's control plane alone, configured by {@code config}; the test closes it. */
    protected abstract BlockStore store(EngineConfig config);

    /** Checks the invariants of the control plane behind the test's engine or store ({@link LocalStore#verifyInvariants()}). */
    protected abstract void verifyInvariants();

    /** The control plane's saves and loads between their plan and endCopy ({@link LocalStore#openOperations()}). */
    protected abstract int openOperations();

    /** Expires leases and partially saved blocks now, on the control plane ({@link LocalStore#sweep()}). */
    protected abstract void sweep();

    /**
     * Whether the control plane reads time from {@link EngineConfig#nanoClock()} and honours
     * {@link EngineConfig#inflightTtl()}; tests of expiry need both and are skipped otherwise.
     */
    protected abstract boolean followsTheConfiguredClock();

    /** Stops whatever the factory started besides the engine or store it returned; runs after they are closed. */
    protected void stopControlPlane() {}

    @AfterEach
    void tearDown() {
        try {
            if (engine != null) {
                engine.close();
            }
            if (world != null) {
                world.close();
            }
        } finally {
            stopControlPlane();
        }
    }

    private EngineConfig.Builder config(long poolBytes) {
        return EngineConfig.builder().poolBytes(poolBytes).nanoClock(clock).sweepInterval(Duration.ZERO)
                .leaseTtl(Duration.ofSeconds(10));
    }

    private void start(int poolBlocks, int tp, Function<HostPool, TransferEngine> transfer) {
        EngineConfig.Builder b = config(poolBlocks * 1024L * tp);
        if (transfer != null) {
            b.transfer(transfer);
        }
        engine = engine(b.build());
        world = new KvWorld("inst", "ns", KvWorld.Kind.SPLIT_KFIRST, tp, 1, 2, 32, 256, 0);
        world.register(engine);
    }

    private void start(int poolBlocks) {
        start(poolBlocks, 1, null);
    }

    private void requireTheConfiguredClock() {
        assumeTrue(followsTheConfiguredClock(), "this control plane keeps its own clock; expiry is checked where it is embedded");
    }

    /** Saves hashes[i] from block i (content = pattern of the hash) on every worker. */
    private void saveAll(byte[][] hashes, int firstBlock) {
        long[] ids = new long[hashes.length];
        for (int i = 0; i < hashes.length; i++) {
            ids[i] = firstBlock + i;
            world.fillPattern(ids[i], hashes[i]);
        }
        for (WorkerSpec w : world.workers) {
            engine.save("inst", w.workerRank(), ids, BlockHashes.of(hashes)).join();
        }
        // seals land beside the futures, on their own threads: wait, so that blocks become
        // recent in the order saved (the eviction tests depend on it)
        engine.flush(10_000);
    }

    private int hits(byte[]... hashes) {
        QueryResult q = engine.query("inst", BlockHashes.of(hashes));
        if (q.hasLease()) {
            engine.release("inst", q.lease());
        }
        return q.hitBlocks();
    }

    @Test
    void savingAResidentHashIsANoOp() {
        start(16);
        byte[][] h = KvWorld.randomHashes(rnd, 4);
        saveAll(h, 0);
        long used = engine.stats().get(Gauge.POOL_USED_BYTES);
        CopyResult again = engine.save("inst", 0, new long[] {8, 9, 10, 11}, BlockHashes.of(h)).join();
        assertThat(again).isEqualTo(new CopyResult(0, 4, 0));
        assertThat(engine.stats().get(Gauge.POOL_USED_BYTES)).isEqualTo(used);
        CopyResult dupInCall = engine.save("inst", 0, new long[] {12, 13}, BlockHashes.of(new byte[][] {h[0].clone(), KvWorld.randomHash(rnd)})).join();
        assertThat(dupInCall.blocks()).isEqualTo(1);
        verifyInvariants();
    }

    @Test
    void blockIsVisibleOnlyWhenEverySlotIsSaved() {
        start(16, 2, null);
        byte[] h = KvWorld.randomHash(rnd);
        world.fillPattern(0, h);
        engine.save("inst", 0, new long[] {0}, BlockHashes.of(new byte[][] {h})).join();
        assertThat(hits(h)).as("tp rank 1 has not saved").isZero();
        assertThat(engine.stats().get(Gauge.INFLIGHT_BLOCKS)).isEqualTo(1);
        // Layer by layer on rank 1: still invisible after the first layer.
        engine.save("inst", 1, List.of(KvWorld.layerName(0)), new long[] {0}, BlockHashes.of(new byte[][] {h}), 0).join();
        assertThat(hits(h)).isZero();
        engine.save("inst", 1, List.of(KvWorld.layerName(1)), new long[] {0}, BlockHashes.of(new byte[][] {h}), 0).join();
        assertThat(hits(h)).isEqualTo(1);
        assertThat(engine.stats().get(Gauge.INFLIGHT_BLOCKS)).isZero();
        verifyInvariants();
    }

    @Test
    void evictsLeastRecentlyUsedOnlyWhenAnAllocationFails() {
        start(8);
        byte[][] h = KvWorld.randomHashes(rnd, 9);
        for (int i = 0; i < 8; i++) {
            saveAll(new byte[][] {h[i]}, i);
        }
        assertThat(engine.stats().get(Counter.EVICTIONS)).as("pool exactly full, nothing evicted yet").isZero();
        assertThat(hits(h[0])).isEqualTo(1); // h0 becomes most recently used
        saveAll(new byte[][] {h[8]}, 8);
        assertThat(engine.stats().get(Counter.EVICTIONS)).isEqualTo(1);
        assertThat(hits(h[1])).as("h1 was least recently used").isZero();
        assertThat(hits(h[0])).isEqualTo(1);
        assertThat(hits(h[8])).isEqualTo(1);
        verifyInvariants();
    }

    @Test
    void leasedBlocksSurvivePressureAndAFullyPinnedPoolRefusesWithoutChange() {
        start(8);
        byte[][] h = KvWorld.randomHashes(rnd, 9);
        saveAll(Arrays.copyOf(h, 8), 0);
        QueryResult lease = engine.query("inst", BlockHashes.of(Arrays.copyOf(h, 8)));
        assertThat(lease.hitBlocks()).isEqualTo(8);
        EngineStats before = engine.stats();
        world.fillPattern(8, h[8]);
        assertThatThrownBy(() -> engine.save("inst", 0, new long[] {8}, BlockHashes.of(new byte[][] {h[8]})))
                .isInstanceOf(PoolExhaustedException.class)
                .hasMessageContaining("8 blocks are pinned");
        assertThat(engine.stats().gauges()).isEqualTo(before.gauges());
        verifyInvariants();
        // The pinned blocks are intact: load them into other block ids and check every byte.
        long[] dst = {16, 17, 18, 19, 20, 21, 22, 23};
        engine.load("inst", 0, lease.lease(), dst).join();
        for (int i = 0; i < 8; i++) {
            assertThat(world.holdsPattern(dst[i], h[i])).isTrue();
        }
        // Consumed by the only worker: unpinned, so the next save can evict.
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).isZero();
        saveAll(new byte[][] {h[8]}, 8);
        assertThat(engine.stats().get(Counter.EVICTIONS)).isEqualTo(1);
        verifyInvariants();
    }

    @Test
    void leaseExpiresAfterItsTtlAndUnpins() {
        requireTheConfiguredClock();
        start(8);
        byte[][] h = KvWorld.randomHashes(rnd, 2);
        saveAll(h, 0);
        QueryResult q = engine.query("inst", BlockHashes.of(h));
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).isEqualTo(2);
        clock.advance(Duration.ofSeconds(9));
        sweep();
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).isEqualTo(1);
        clock.advance(Duration.ofSeconds(2));
        sweep();
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).isZero();
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).isZero();
        assertThat(engine.stats().get(Counter.LEASES_EXPIRED)).isEqualTo(1);
        assertThatThrownBy(() -> engine.load("inst", 0, q.lease(), new long[] {4, 5}))
                .isInstanceOf(UnknownLeaseException.class).hasMessageContaining(q.lease().toString());
        assertThatThrownBy(() -> engine.release("inst", q.lease())).isInstanceOf(UnknownLeaseException.class);
        verifyInvariants();
    }

    @Test
    void eachWorkerConsumesOneShareAndReleaseDropsTheRest() {
        start(8, 2, null);
        byte[][] h = KvWorld.randomHashes(rnd, 2);
        saveAll(h, 0);
        QueryResult q = engine.query("inst", BlockHashes.of(h));
        engine.load("inst", 0, q.lease(), new long[] {4, 5}).join();
        assertThatThrownBy(() -> engine.load("inst", 0, q.lease(), new long[] {6, 7}))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("worker 0 already consumed");
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).isEqualTo(1);
        engine.load("inst", 1, q.lease(), new long[] {4, 5}).join();
        assertThat(world.holdsPattern(4, h[0]) && world.holdsPattern(5, h[1])).isTrue();
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).as("consumed by both workers").isZero();

        QueryResult q2 = engine.query("inst", BlockHashes.of(h));
        engine.load("inst", 1, q2.lease(), new long[] {6, 7}).join();
        engine.release("inst", q2.lease());
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).isZero();
        assertThatThrownBy(() -> engine.load("inst", 0, q2.lease(), new long[] {6, 7})).isInstanceOf(UnknownLeaseException.class);
        verifyInvariants();
    }

    @Test
    void aQueryThatBeginsALoadLetsItsWorkerCopyWithoutAskingAgain() {
        start(8);
        byte[][] h = KvWorld.randomHashes(rnd, 2);
        saveAll(h, 0);
        long loadsBefore = engine.stats().get(Counter.LOAD_REQUESTS);
        QueryResult q = engine.queryAndBegin("inst", BlockHashes.of(h), 0);
        assertThat(q.hitBlocks()).isEqualTo(2);
        assertThat(q.begun()).as("the worker's plan came with the lease").isNotNull();
        assertThat(q.begun().blocks()).isEqualTo(2);
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).as("its only share consumed").isZero();
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).isEqualTo(2);
        assertThat(engine.stats().get(Counter.LOAD_REQUESTS) - loadsBefore).as("counted once a copy took it").isZero();

        engine.load("inst", 0, q.lease(), new long[] {4, 5}).join();
        engine.flush(10_000);
        assertThat(world.holdsPattern(4, h[0]) && world.holdsPattern(5, h[1])).isTrue();
        assertThat(engine.stats().get(Counter.LOAD_REQUESTS) - loadsBefore).as("one load, no second plan asked for")
                .isEqualTo(1);
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).isZero();
        assertThatThrownBy(() -> engine.load("inst", 0, q.lease(), new long[] {6, 7}))
                .as("the plan is taken once; the lease is gone").isInstanceOf(UnknownLeaseException.class);

        QueryResult miss = engine.queryAndBegin("inst", BlockHashes.of(KvWorld.randomHashes(rnd, 2)), 0);
        assertThat(miss.hitBlocks()).isZero();
        assertThat(miss.begun()).isNull();
        verifyInvariants();
    }

    @Test
    void anAnsweredQueryTimesItsLookupLeaseAndThePlanOfTheLoadItBegan() {
        start(8);
        byte[][] h = KvWorld.randomHashes(rnd, 2);
        saveAll(h, 0);
        EngineStats before = engine.stats();
        QueryResult plain = engine.query("inst", BlockHashes.of(h));
        engine.release("inst", plain.lease());
        EngineStats afterPlain = engine.stats();
        assertThat(afterPlain.get(Counter.QUERY_LOOKUP_NANOS)).isGreaterThan(before.get(Counter.QUERY_LOOKUP_NANOS));
        assertThat(afterPlain.get(Counter.QUERY_LEASE_NANOS)).isGreaterThan(before.get(Counter.QUERY_LEASE_NANOS));
        assertThat(afterPlain.get(Counter.QUERY_PLAN_NANOS)).as("no load begun: nothing planned")
                .isEqualTo(before.get(Counter.QUERY_PLAN_NANOS));
        QueryResult begun = engine.queryAndBegin("inst", BlockHashes.of(h), 0);
        assertThat(begun.begun()).isNotNull();
        assertThat(engine.stats().get(Counter.QUERY_PLAN_NANOS)).isGreaterThan(afterPlain.get(Counter.QUERY_PLAN_NANOS));
        engine.release("inst", begun.lease());
        verifyInvariants();
    }

    @Test
    void releasingALeaseWhoseLoadBeganRollsTheLoadBackAndTheOtherSharesGo() {
        start(8, 2, null);
        byte[][] h = KvWorld.randomHashes(rnd, 2);
        saveAll(h, 0);
        long failures = engine.stats().get(Counter.LOAD_FAILURES);
        QueryResult q = engine.queryAndBegin("inst", BlockHashes.of(h), 1);
        assertThat(q.begun()).isNotNull();
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).as("worker 0's share remains").isEqualTo(1);
        long requests = engine.stats().get(Counter.LOAD_REQUESTS);
        engine.release("inst", q.lease());
        assertThat(engine.stats().get(Counter.LOADS_UNUSED)).as("counted as unused").isEqualTo(1);
        assertThat(engine.stats().get(Counter.LOAD_REQUESTS)).as("never a load that ran").isEqualTo(requests);
        assertThat(engine.stats().get(Counter.LOAD_FAILURES)).as("not as failed").isEqualTo(failures);
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).isZero();
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).isZero();

        // both workers load: one from the begun plan, the other asking for its own
        QueryResult q2 = engine.queryAndBegin("inst", BlockHashes.of(h), 0);
        engine.load("inst", 1, q2.lease(), new long[] {4, 5}).join();
        engine.load("inst", 0, q2.lease(), new long[] {4, 5}).join();
        engine.flush(10_000);
        assertThat(world.holdsPattern(4, h[0]) && world.holdsPattern(5, h[1])).isTrue();
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).isZero();
        verifyInvariants();
    }

    @Test
    void aBegunLoadIntoBadBlockIdsIsRefusedAndRolledBack() {
        start(8);
        byte[][] h = KvWorld.randomHashes(rnd, 2);
        saveAll(h, 0);
        long failures = engine.stats().get(Counter.LOAD_FAILURES);
        QueryResult q = engine.queryAndBegin("inst", BlockHashes.of(h), 0);
        assertThatThrownBy(() -> engine.load("inst", 0, q.lease(), new long[] {4, 5, 6}))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("3 destination block ids for 2 leased blocks");
        assertThat(engine.stats().get(Counter.LOAD_FAILURES)).as("refused: a failed load, not an unused one")
                .isEqualTo(failures + 1);
        assertThat(engine.stats().get(Counter.LOADS_UNUSED)).isZero();
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).isZero();

        QueryResult q2 = engine.queryAndBegin("inst", BlockHashes.of(h), 0);
        assertThatThrownBy(() -> engine.loadLayered("inst", 0, q2.lease(), new long[] {4, 32}))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("dstBlockIds[1] = 32 out of range [0, 32)");
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).isZero();
        assertThatThrownBy(() -> engine.release("inst", q2.lease())).as("its only share went with the begun load")
                .isInstanceOf(UnknownLeaseException.class);
        verifyInvariants();
    }

    @Test
    void aQueryBeginsNoLoadForAWorkerNotRegisteredAndLeasesNothing() {
        start(8);
        byte[][] h = KvWorld.randomHashes(rnd, 2);
        saveAll(h, 0);
        assertThatThrownBy(() -> engine.queryAndBegin("inst", BlockHashes.of(h), -1))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("worker rank -1");
        QueryResult elsewhere = engine.queryAndBegin("inst", BlockHashes.of(h), 3);
        assertThat(elsewhere.begun()).as("rank 3's regions are not in this process: a plain query").isNull();
        engine.release("inst", elsewhere.lease());
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).isZero();
        verifyInvariants();
    }

    @Test
    void aStoreBeginsNoLoadForARankTheInstanceDoesNotHave() {
        byte[][] h = KvWorld.randomHashes(rnd, 2);
        try (BlockStore store = store(config(1 << 20).build());
                KvWorld w = new KvWorld("half", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 2, 32, 256, 0)) {
            store.registerInstance(w.spec);
            store.registerWorker("half", w.workers.get(0));
            CopyPlan save = store.reserveSave("half", 0, null, new long[] {0, 1}, BlockHashes.of(h));
            store.endCopy("half", save.id(), true, 0, 0);
            assertThatThrownBy(() -> store.queryAndBegin("half", BlockHashes.of(h), 1))
                    .isInstanceOf(UnknownInstanceException.class).hasMessageContaining("worker rank 1");
            assertThat(store.stats().get(Gauge.ACTIVE_LEASES)).as("nothing leased").isZero();
            assertThat(store.stats().get(Gauge.PINNED_BLOCKS)).isZero();
            QueryResult q = store.queryAndBegin("half", BlockHashes.of(h), 0);
            assertThat(q.begun().runBlock()).containsExactly(0, 1);
            assertThat(openOperations()).isEqualTo(1);
            CopyPlan other = store.reserveSave("half", 0, null, new long[] {2}, BlockHashes.of(KvWorld.randomHashes(rnd, 1)));
            assertThatThrownBy(() -> store.dropBegun("half", other.id())).isInstanceOf(InvalidArgumentException.class)
                    .hasMessageContaining("is not a load a query began");
            store.endCopy("half", other.id(), false, 0, 0);
            assertThat(openOperations()).as("the refused drop changed nothing").isEqualTo(1);
            store.endCopy("half", q.begun().id(), true, 0, 0);
            assertThat(store.stats().get(Gauge.PINNED_BLOCKS)).isZero();
            assertThat(openOperations()).isZero();
            CopyPlan asked = store.beginLoad("half", 0, store.query("half", BlockHashes.of(h)).lease(), new long[] {4, 5});
            assertThatThrownBy(() -> store.dropBegun("half", asked.id())).as("a load its worker began: ended, not dropped")
                    .isInstanceOf(InvalidArgumentException.class);
            QueryResult again = store.queryAndBegin("half", BlockHashes.of(h), 0);
            store.dropBegun("half", again.begun().id());
            assertThatThrownBy(() -> store.dropBegun("half", again.begun().id())).isInstanceOf(InvalidArgumentException.class)
                    .hasMessageContaining("is unknown");
            store.endCopy("half", asked.id(), true, 0, 0);
            assertThat(store.stats().get(Counter.LOADS_UNUSED)).isEqualTo(1);
            assertThat(store.stats().get(Gauge.PINNED_BLOCKS)).isZero();
            assertThat(openOperations()).isZero();
            verifyInvariants();
        }
    }

    /** Registers {@code other} (instance "other" of another namespace) and saves two blocks there; their hashes. */
    private byte[][] savedInAnotherNamespace(KvWorld other) {
        other.register(engine);
        byte[][] o = KvWorld.randomHashes(rnd, 2);
        for (int i = 0; i < 2; i++) {
            other.fillPattern(i, o[i]);
        }
        engine.save("other", 0, new long[] {0, 1}, BlockHashes.of(o)).join();
        engine.flush(10_000);
        return o;
    }

    @Test
    void resetCacheDropsTheNamespacesUnheldBlocksKeepsLeasedOnesAndOtherNamespaces() {
        start(16);
        byte[][] h = KvWorld.randomHashes(rnd, 4);
        saveAll(h, 0);
        try (KvWorld other = new KvWorld("other", "ns-other", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 2, 32, 256, 0)) {
            byte[][] o = savedInAnotherNamespace(other);
            QueryResult held = engine.query("inst", BlockHashes.of(h[0]));
            LocalStore.Cleared c = engine.resetCache("inst");
            assertThat(c.blocks()).isEqualTo(3);
            assertThat(c.referenced()).as("the leased block stays").isEqualTo(1);
            assertThat(engine.stats().get(Counter.ADMIN_CLEARED_BLOCKS)).isEqualTo(3);
            engine.release("inst", held.lease());
            assertThat(hits(h)).as("only the leased first block is left").isEqualTo(1);
            QueryResult q = engine.query("other", BlockHashes.of(o));
            assertThat(q.hitBlocks()).as("another namespace is untouched").isEqualTo(2);
            engine.release("other", q.lease());
            assertThatThrownBy(() -> engine.resetCache("ghost")).isInstanceOf(UnknownInstanceException.class);
            engine.unregisterInstance("other");
        }
        verifyInvariants();
    }

    @Test
    void demotedBlocksAreEvictedBeforeOlderOnesUntilAQueryHitsThemAgain() {
        start(4);
        byte[][] old = KvWorld.randomHashes(rnd, 2);
        byte[][] oneOff = KvWorld.randomHashes(rnd, 2);
        saveAll(old, 0);
        saveAll(oneOff, 2); // the pool (4 blocks) is full; LRU would take `old` first
        byte[][] unknown = KvWorld.randomHashes(rnd, 1);
        assertThat(engine.demote("inst", BlockHashes.of(oneOff[0], oneOff[1], unknown[0]))).as("blocks it does not hold are ignored")
                .isEqualTo(2);
        byte[][] next = KvWorld.randomHashes(rnd, 1);
        saveAll(next, 4);
        assertThat(hits(old)).as("the older blocks stay").isEqualTo(2);
        assertThat(hits(oneOff)).as("the demoted prefix went first, its last block before its first").isEqualTo(1);
        saveAll(KvWorld.randomHashes(rnd, 1), 5); // the hit made oneOff[0] the newest: LRU order takes `next`
        assertThat(hits(oneOff[0])).as("hit again, it is back in LRU order").isEqualTo(1);
        assertThat(hits(next)).isZero();
        assertThatThrownBy(() -> engine.demote("ghost", BlockHashes.of(old))).isInstanceOf(UnknownInstanceException.class);
        verifyInvariants();
    }

    @Test
    void kvEventsGiveTheNamespacesStoredAndRemovedBlocksInOrderAndNoOtherNamespace() {
        start(16);
        byte[][] h = KvWorld.randomHashes(rnd, 3);
        saveAll(h, 0);
        try (KvWorld other = new KvWorld("other", "ns-other", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 2, 32, 256, 0)) {
            byte[][] o = savedInAnotherNamespace(other);
            assertThat(engine.kvEvents("other", 0, 100).events()).extracting(e -> HexFormat.of().formatHex(e.hash()))
                    .containsExactlyInAnyOrder(HexFormat.of().formatHex(o[0]), HexFormat.of().formatHex(o[1]));
            KvEventLog.Batch stored = engine.kvEvents("inst", 0, 100);
            assertThat(stored.events()).extracting(KvEventLog.Event::kind).containsOnly(KvEventLog.Kind.STORED);
            assertThat(stored.events()).extracting(KvEventLog.Event::tier).containsOnly(KvEventLog.CPU);
            assertThat(stored.events()).extracting(e -> HexFormat.of().formatHex(e.hash()))
                    .as("the namespace's own saves, not the other namespace's")
                    .containsExactlyInAnyOrder(HexFormat.of().formatHex(h[0]), HexFormat.of().formatHex(h[1]),
                            HexFormat.of().formatHex(h[2]));
            assertThat(stored.gap()).isFalse();
            engine.resetCache("inst");
            KvEventLog.Batch removed = engine.kvEvents("inst", stored.next(), 100);
            assertThat(removed.events()).hasSize(3).extracting(KvEventLog.Event::kind).containsOnly(KvEventLog.Kind.REMOVED);
            assertThat(removed.events().get(0).seq()).isGreaterThan(stored.next());
            assertThat(engine.kvEvents("inst", removed.next(), 100).events()).as("read once").isEmpty();
            assertThatThrownBy(() -> engine.kvEvents("ghost", 0, 10)).isInstanceOf(UnknownInstanceException.class);
            assertThatThrownBy(() -> engine.kvEvents("inst", -1, 10)).isInstanceOf(InvalidArgumentException.class)
                    .hasMessageContaining("events after -1");
            engine.unregisterInstance("other");
        }
        verifyInvariants();
    }

    @Test
    void unregisterDropsLeasesButKeepsBlocksForTheNextInstanceOfTheNamespace() {
        start(8);
        byte[][] h = KvWorld.randomHashes(rnd, 3);
        saveAll(h, 0);
        QueryResult q = engine.query("inst", BlockHashes.of(h));
        engine.unregisterInstance("inst");
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).isZero();
        assertThatThrownBy(() -> engine.query("inst", BlockHashes.of(h))).isInstanceOf(UnknownInstanceException.class);
        assertThatThrownBy(() -> engine.release("inst", q.lease())).isInstanceOf(UnknownLeaseException.class);
        try (KvWorld restarted = new KvWorld("inst-2", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 2, 32, 256, 0)) {
            restarted.register(engine);
            QueryResult again = engine.query("inst-2", BlockHashes.of(h));
            assertThat(again.hitBlocks()).isEqualTo(3);
            engine.load("inst-2", 0, again.lease(), new long[] {10, 11, 12}).join();
            assertThat(restarted.holdsPattern(10, h[0]) && restarted.holdsPattern(12, h[2])).isTrue();
            engine.unregisterInstance("inst-2");
        }
        verifyInvariants();
    }

    @Test
    void namespaceSharedByIncompatibleLayoutsIsRefusedAndTheWorkerNotKept() {
        start(8);
        try (KvWorld other = new KvWorld("other", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 2, 32, 512, 0);
                KvWorld fixed = new KvWorld("other", "ns-other", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 2, 32, 512, 0)) {
            engine.registerInstance(other.spec);
            assertThatThrownBy(() -> engine.registerWorker("other", other.workers.get(0)))
                    .isInstanceOf(TopologyMismatchException.class)
                    .hasMessageContaining("namespace 'ns' is shared by incompatible KV layouts");
            assertThat(engine.isSealed("other")).isFalse();
            engine.unregisterInstance("other");
            fixed.register(engine);
            assertThat(engine.isSealed("other")).isTrue();
        }
    }

    @Test
    void partiallySavedBlocksAreDroppedAfterTheInflightTtl() {
        requireTheConfiguredClock();
        start(8, 2, null);
        byte[] h = KvWorld.randomHash(rnd);
        world.fillPattern(0, h);
        engine.save("inst", 0, new long[] {0}, BlockHashes.of(new byte[][] {h})).join();
        assertThat(engine.stats().get(Gauge.POOL_USED_BYTES)).isPositive();
        clock.advance(Duration.ofMinutes(4));
        sweep();
        assertThat(engine.stats().get(Gauge.INFLIGHT_BLOCKS)).isEqualTo(1);
        clock.advance(Duration.ofMinutes(2));
        sweep();
        assertThat(engine.stats().get(Gauge.INFLIGHT_BLOCKS)).isZero();
        assertThat(engine.stats().get(Gauge.POOL_USED_BYTES)).isZero();
        assertThat(engine.stats().get(Counter.INFLIGHT_GC)).isEqualTo(1);
        verifyInvariants();
    }

    @Test
    void aFailedCopyRollsBackTheSaveAndNamesTheBlockIds() {
        AtomicBoolean fail = new AtomicBoolean(true);
        start(8, 1, pool -> new FailingTransfer(new HostTransferEngine(pool, 1), fail));
        byte[][] h = KvWorld.randomHashes(rnd, 2);
        world.fillPattern(3, h[0]);
        world.fillPattern(4, h[1]);
        CompletableFuture<CopyResult> f = engine.save("inst", 0, new long[] {3, 4}, BlockHashes.of(h));
        assertThatThrownBy(f::join).isInstanceOf(CompletionException.class).cause()
                .isInstanceOf(TransferFailedException.class).hasMessageContaining("[3, 4]");
        assertThat(engine.stats().get(Gauge.POOL_USED_BYTES)).isZero();
        assertThat(engine.stats().get(Gauge.INFLIGHT_BLOCKS)).isZero();
        assertThat(hits(h)).isZero();
        verifyInvariants();

        fail.set(false);
        engine.save("inst", 0, new long[] {3, 4}, BlockHashes.of(h)).join();
        QueryResult q = engine.query("inst", BlockHashes.of(h));
        fail.set(true);
        CompletableFuture<CopyResult> load = engine.load("inst", 0, q.lease(), new long[] {7, 9});
        assertThatThrownBy(load::join).cause().isInstanceOf(TransferFailedException.class).hasMessageContaining("[7, 9]");
        assertThat(((TransferFailedException) load.handle((r, e) -> e).join()).blockIds()).containsExactly(7, 9);
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).as("failed load released its pins").isZero();
        assertThat(engine.stats().get(Counter.LOAD_FAILURES)).isEqualTo(1);
        verifyInvariants();
    }

    /**
     * Closing an engine with a lease outstanding: embedded, the store checks on close that
     * every pool byte came back (and throws if not); attached, the server keeps the cache and
     * ends the client's session. Either way later calls fail with a typed error.
     */
    @Test
    void closeReturnsEveryByteAndLaterCallsFailClearly() {
        engine = engine(config(64 << 10).build());
        world = new KvWorld("inst", "ns", KvWorld.Kind.MLA, 1, 1, 2, 32, 256, 0);
        world.register(engine);
        byte[][] h = KvWorld.randomHashes(rnd, 3);
        saveAll(h, 0);
        engine.query("inst", BlockHashes.of(h)); // a lease left outstanding
        assertThat(engine.stats().get(Gauge.RESIDENT_BLOCKS)).isEqualTo(3);
        assertThat(engine.stats().get(Counter.SAVE_BLOCKS)).isEqualTo(3);
        engine.close();
        assertThatThrownBy(() -> engine.query("inst", BlockHashes.of(h))).isInstanceOf(EngineClosedException.class);
        engine = null;
    }

    /** A hash repeated in one save is planned once; the repeats count as skipped and nothing is claimed twice. */
    @Test
    void aHashRepeatedInOneSaveIsPlannedOnce() {
        try (BlockStore store = store(config(1 << 20).build());
                KvWorld w = new KvWorld("dup", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 2, 32, 256, 0)) {
            store.registerInstance(w.spec);
            store.registerWorker("dup", w.workers.get(0));
            byte[][] h = KvWorld.randomHashes(rnd, 2);
            CopyPlan p = store.reserveSave("dup", 0, null, new long[] {0, 1, 2}, BlockHashes.of(new byte[][] {h[0], h[1], h[0]}));
            assertThat(p.blocks()).isEqualTo(2);
            assertThat(p.skippedBlocks()).isEqualTo(1);
            assertThat(p.runBlock()).containsExactly(0, 1); // one run per block: both layers back to back
            store.endCopy("dup", p.id(), true, 0, 0);
            assertThat(store.query("dup", BlockHashes.of(h)).hitBlocks()).isEqualTo(2);
            assertThat(store.stats().get(Gauge.RESIDENT_BLOCKS)).isEqualTo(2);
            verifyInvariants();
        }
    }

    /**
     * A load planned in parts: the first call consumes the share and pins every leased block
     * but plans only the head; the rest comes from planRest, for the issuing instance and
     * worker only and within the lease; the load ends once and unpins everything.
     */
    @Test
    void aLoadPlannedInPartsGivesEachRangeOnceAndEndsOnce() {
        try (BlockStore store = store(config(1 << 20).build());
                KvWorld w = new KvWorld("parts", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 2, 32, 256, 0)) {
            store.registerInstance(w.spec);
            store.registerWorker("parts", w.workers.get(0));
            store.registerInstance(new InstanceSpec("other", "ns", 1, 1));
            byte[][] h = KvWorld.randomHashes(rnd, 6);
            CopyPlan save = store.reserveSave("parts", 0, null, new long[] {0, 1, 2, 3, 4, 5}, BlockHashes.of(h));
            store.endCopy("parts", save.id(), true, 0, 0);
            QueryResult q = store.query("parts", BlockHashes.of(h));
            CopyPlan head = store.beginLoad("parts", 0, q.lease(), new long[] {10, 11, 12, 13, 14, 15}, 2);
            assertThat(head.blocks()).isEqualTo(6);
            assertThat(head.runBlock()).containsExactly(0, 1);
            CopyPlan whole = store.planRest("parts", 0, head.id(), 0, 6); // any range, as often as asked
            assertThat(whole.runBlock()).containsExactly(0, 1, 2, 3, 4, 5);
            CopyPlan rest = store.planRest("parts", 0, head.id(), 2, 6);
            assertThat(rest.id()).isEqualTo(head.id());
            assertThat(rest.runBlock()).containsExactly(2, 3, 4, 5);
            assertThat(rest.runOffset()).containsExactly(Arrays.copyOfRange(whole.runOffset(), 2, 6));
            assertThatThrownBy(() -> store.planRest("other", 0, head.id(), 2, 6)).isInstanceOf(PermissionDeniedException.class);
            assertThatThrownBy(() -> store.planRest("parts", 1, head.id(), 2, 6)).isInstanceOf(PermissionDeniedException.class);
            assertThatThrownBy(() -> store.planRest("parts", 0, head.id(), 2, 7)).isInstanceOf(InvalidArgumentException.class)
                    .hasMessageContaining("expected 0 <= from <= to <= 6");
            assertThatThrownBy(() -> store.planRest("parts", 0, head.id(), 3, 2)).isInstanceOf(InvalidArgumentException.class);
            assertThatThrownBy(() -> store.planRest("parts", 0, save.id(), 0, 1)).isInstanceOf(InvalidArgumentException.class)
                    .hasMessageContaining("not an open load");
            assertThatThrownBy(() -> store.beginLoad("parts", 0, q.lease(), new long[6], 0))
                    .isInstanceOf(InvalidArgumentException.class);
            assertThat(openOperations()).isEqualTo(1);
            store.endCopy("parts", head.id(), true, 0, 0);
            assertThat(openOperations()).isZero();
            assertThatThrownBy(() -> store.planRest("parts", 0, head.id(), 2, 6)).isInstanceOf(InvalidArgumentException.class);
            verifyInvariants();
        }
    }

    /**
     * Loads of 64 blocks or more are planned in two parts: the head's batch (16 of 100 blocks)
     * is submitted, and the rest planned and submitted while the head still copies; the bytes
     * land in every destination block and the load ends once, after both.
     */
    /** Host copies that record every batch submitted and split layer-wise loads as {@code split} says. */
    private static TransferEngine recording(io.pegaflow.engine.pool.HostPool pool, List<CopyBatch> batches, LayerSplit split) {
        return new TransferEngine() {
            private final HostTransferEngine delegate = new HostTransferEngine(pool, 1);

            @Override
            public TransferFuture submit(CopyBatch batch) {
                batches.add(batch);
                return delegate.submit(batch);
            }

            @Override
            public LayerSplit layerSplit() {
                return split;
            }

            @Override
            public String name() {
                return "recorded";
            }

            @Override
            public void close() {
                delegate.close();
            }
        };
    }

    /**
     * A layered load (vLLM's in-step load) of a cross-layer world, in one part (a plain load of
     * 100 blocks has a head; a layer waits for every part's group, so a head would delay it): the
     * batch has one group per layer in layer order, every piece of group g is layer g's, waiting
     * for each layer returns, and the bytes land as a plain load's do.
     */
    @Test
    void aLayeredLoadCopiesLayerByLayerInOnePart() {
        List<CopyBatch> batches = new java.util.concurrent.CopyOnWriteArrayList<>();
        engine = engine(config(512 * 1024L).transfer(pool -> recording(pool, batches, LayerSplit.PER_LAYER)).build());
        world = new KvWorld("inst", "ns", KvWorld.Kind.CROSS_LAYER, 1, 1, 3, 256, 256, 0);
        world.register(engine);
        byte[][] h = KvWorld.randomHashes(rnd, 100);
        saveAll(h, 0);
        QueryResult q = engine.query("inst", BlockHashes.of(h));
        long[] dst = new long[100];
        Arrays.setAll(dst, i -> 120 + i);
        batches.clear();
        LayeredLoad load = engine.loadLayered("inst", 0, q.lease(), dst);
        for (int layer = 0; layer < 3; layer++) {
            load.awaitLayer(layer, 0);
        }
        assertThat(load.result().join().blocks()).isEqualTo(100);
        List<LayerRegion> layers = world.workers.get(0).layers();
        assertThat(PegaEngine.headBlocks(100)).as("a plain load of as many would have a head").isPositive();
        assertThat(batches).as("one part, no head").hasSize(1);
        for (CopyBatch batch : batches) {
            assertThat(batch.groupCount()).isEqualTo(3);
            for (int g = 0; g < 3; g++) {
                LayerRegion r = layers.get(g);
                for (int i = batch.groupStart(g); i < batch.groupEnd(g); i++) {
                    long a = batch.deviceAddress(i);
                    long offset = a - r.baseAddress();
                    assertThat(offset % r.blockStride()).as("group %d piece %d is layer %d's", g, i, g)
                            .isIn(0L, r.segmentOffset());
                }
            }
        }
        for (int i = 0; i < 100; i++) {
            assertThat(world.holdsPattern(dst[i], h[i])).as("block %d", i).isTrue();
        }
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).isZero();
        verifyInvariants();
    }

    /**
     * A load whose batch is large enough for the kept piece arrays ({@link
     * io.pegaflow.engine.transfer.PieceArrays}: 512 blocks of 3 layers, 3,072 pieces) hands the
     * array back before its caller hears the copy ended, so the next load of that size takes it
     * instead of allocating one (a 16K-token load's array would otherwise fill a small young
     * generation within a request or two); the reused array's old pieces never reach
     * the copy: every block lands with its own bytes, layered and plain loads alike.
     */
    @Test
    void aLargeLoadsPieceArrayGoesBackForTheNextLoad() {
        engine = engine(config(2L << 20).build());
        world = new KvWorld("inst", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 3, 1536, 256, 0);
        world.register(engine);
        byte[][] h = KvWorld.randomHashes(rnd, 512);
        saveAll(h, 0);
        for (int round = 0; round < 4; round++) {
            long reused = io.pegaflow.engine.transfer.PieceArrays.reused();
            long[] dst = new long[512];
            int first = 512 + (round % 2) * 512; // the destinations move between rounds
            Arrays.setAll(dst, i -> first + 511 - i);
            QueryResult q = engine.query("inst", BlockHashes.of(h));
            assertThat(q.hitBlocks()).isEqualTo(512);
            CopyResult r = round < 2 ? engine.loadLayered("inst", 0, q.lease(), dst).result().join()
                    : engine.load("inst", 0, q.lease(), dst).join();
            assertThat(r.blocks()).isEqualTo(512);
            if (round > 0) {
                assertThat(io.pegaflow.engine.transfer.PieceArrays.reused() - reused)
                        .as("round %d took the array the load before it gave back", round).isPositive();
            }
            for (int i = 0; i < 512; i++) {
                assertThat(world.holdsPattern(dst[i], h[i])).as("round %d block %d", round, i).isTrue();
            }
        }
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).isZero();
        verifyInvariants();
    }

    /**
     * A layered load through an engine that asks for layer groups of two layers' slots dealt
     * over two lanes ({@link TransferEngine#layerSplit}): five per-layer regions make groups
     * {0,1}, {2,3}, {4}, the first and last in one batch and the middle one in the other
     * (one part); within a group the pieces go block by block, each block's slots of the group
     * one stretch of the pool; waiting for any layer returns and every byte lands.
     */
    @Test
    void aLayeredLoadGroupsLayersAndDealsThemOverLanesAsTheCopyEngineAsks() {
        List<CopyBatch> batches = new java.util.concurrent.CopyOnWriteArrayList<>();
        // two layers' K and V of 256 bytes each per group, dealt over two lanes
        engine = engine(config(512 * 1024L).transfer(pool -> recording(pool, batches, new LayerSplit(2 * 2 * 256, 2, 0, false)))
                .build());
        world = new KvWorld("inst", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 5, 256, 256, 0);
        world.register(engine);
        byte[][] h = KvWorld.randomHashes(rnd, 100);
        saveAll(h, 0);
        QueryResult q = engine.query("inst", BlockHashes.of(h));
        long[] dst = new long[100];
        Arrays.setAll(dst, i -> 255 - i);
        batches.clear();
        LayeredLoad load = engine.loadLayered("inst", 0, q.lease(), dst);
        for (int layer = 4; layer >= 0; layer--) {
            load.awaitLayer(layer, 0);
        }
        assertThat(load.result().join().blocks()).isEqualTo(100);
        List<LayerRegion> layers = world.workers.get(0).layers();
        assertThat(batches).as("two lanes, one part").hasSize(2);
        int[][][] byLane = {{{0, 1}, {4}}, {{2, 3}}};
        for (int b = 0; b < batches.size(); b++) {
            CopyBatch batch = batches.get(b);
            int[][] expected = byLane[b % 2];
            assertThat(batch.groupCount()).as("batch %d", b).isEqualTo(expected.length);
            for (int g = 0; g < expected.length; g++) {
                int[] members = expected[g];
                int perBlock = 2 * members.length;
                assertThat((batch.groupEnd(g) - batch.groupStart(g)) % perBlock).isZero();
                for (int i = batch.groupStart(g); i < batch.groupEnd(g); i++) {
                    int k = (i - batch.groupStart(g)) % perBlock; // the piece's place within its block
                    LayerRegion r = layers.get(members[k / 2]);
                    long a = batch.deviceAddress(i);
                    assertThat(a).as("batch %d group %d piece %d", b, g, i)
                            .isBetween(r.baseAddress(), r.baseAddress() + r.regionBytes() - 1);
                    if (k > 0) {
                        assertThat(batch.hostOffset(i)).as("batch %d group %d piece %d follows its block's previous piece", b, g, i)
                                .isEqualTo(batch.hostOffset(i - 1) + batch.length(i - 1));
                    }
                }
            }
        }
        for (int i = 0; i < 100; i++) {
            assertThat(world.holdsPattern(dst[i], h[i])).as("block %d", i).isTrue();
        }
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).isZero();
        verifyInvariants();
    }

    @Test
    void aLoadInTwoPartsMovesEveryBlockAndEndsOnce() {
        List<Long> batches = new java.util.concurrent.CopyOnWriteArrayList<>();
        java.util.concurrent.atomic.AtomicReference<CompletableFuture<Void>> gate =
                new java.util.concurrent.atomic.AtomicReference<>(CompletableFuture.completedFuture(null));
        engine = engine(config(256 * 1024L).transfer(pool -> new TransferEngine() {
            private final HostTransferEngine delegate = new HostTransferEngine(pool, 1);

            @Override
            public TransferFuture submit(CopyBatch batch) {
                batches.add(batch.totalBytes());
                return TransferFuture.following(CompletableFuture.allOf(delegate.submit(batch), gate.get()), () -> { });
            }

            @Override
            public String name() {
                return "recorded";
            }

            @Override
            public void close() {
                delegate.close();
            }
        }).build());
        world = new KvWorld("inst", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 2, 256, 256, 0); // 1 KiB blocks
        world.register(engine);
        byte[][] h = KvWorld.randomHashes(rnd, 100);
        saveAll(h, 0);
        QueryResult q = engine.query("inst", BlockHashes.of(h));
        assertThat(q.hitBlocks()).isEqualTo(100);
        long[] dst = new long[100];
        Arrays.setAll(dst, i -> 120 + i);
        batches.clear();
        gate.set(new CompletableFuture<>()); // the copies do not complete until the gate opens
        CompletableFuture<CopyResult> f = engine.load("inst", 0, q.lease(), dst);
        try {
            assertThat(batches).as("head, then the rest submitted while the head still copies")
                    .containsExactly(16 * 1024L, 84 * 1024L);
            assertThat(f).isNotDone();
            assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).as("every leased block pinned until the load ends").isEqualTo(100);
        } finally {
            gate.get().complete(null); // a failed assertion must not leave the copies (and the engine's close) waiting
        }
        CopyResult r = f.join();
        assertThat(r.blocks()).isEqualTo(100);
        assertThat(r.bytes()).isEqualTo(100 * 1024L);
        for (int i = 0; i < 100; i++) {
            assertThat(world.holdsPattern(dst[i], h[i])).as("block %d", i).isTrue();
        }
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).as("ended once: nothing left pinned").isZero();
        assertThat(engine.stats().get(Counter.LOAD_BLOCKS)).isEqualTo(100);
        verifyInvariants();
    }

    /**
     * What the server does when a client's session is lost: unregistering an instance makes
     * the saves it reserved and the loads it began unendable, holds their slots until the
     * plan's hold ends (the copier may still be moving bytes; a plan promises its slots that
     * long), then rolls them back, so nothing stays pinned or allocated.
     */
    @Test
    void unregisterHoldsOpenCopiesUntilTheirHoldThenRollsThemBack() {
        try (BlockStore store = store(config(1 << 20).build());
                KvWorld w = new KvWorld("dead", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 2, 32, 256, 0)) {
            store.registerInstance(w.spec);
            store.registerWorker("dead", w.workers.get(0));
            byte[][] h = KvWorld.randomHashes(rnd, 3);
            CopyPlan done = store.reserveSave("dead", 0, null, new long[] {0, 1}, BlockHashes.of(new byte[][] {h[0], h[1]}));
            store.endCopy("dead", done.id(), true, 0, 0);
            CopyPlan open = store.beginLoad("dead", 0, store.query("dead", BlockHashes.of(new byte[][] {h[0], h[1]})).lease(), new long[] {5, 6});
            CopyPlan reserved = store.reserveSave("dead", 0, null, new long[] {2}, BlockHashes.of(new byte[][] {h[2]}));
            assertThat(reserved.slots()).isEqualTo(2);
            assertThat(openOperations()).isEqualTo(2);
            assertThat(store.stats().get(Gauge.PINNED_BLOCKS)).isEqualTo(2);
            assertThat(open.holdNanos()).as("the plan promises its pins for a while").isPositive();
            store.unregisterInstance("dead");
            assertThat(openOperations()).as("no longer endable").isZero();
            assertThatThrownBy(() -> store.endCopy("dead", open.id(), true, 0, 0)).isInstanceOf(InvalidArgumentException.class)
                    .hasMessageContaining("copy " + open.id() + " is unknown");
            assertThatThrownBy(() -> store.endCopy("dead", reserved.id(), true, 0, 0))
                    .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("copy " + reserved.id() + " is unknown");
            // a copier whose session was lost may still be moving bytes: its slots stay as they are
            assertThat(store.stats().get(Gauge.PINNED_BLOCKS)).as("the load's pins are held").isEqualTo(2);
            assertThat(store.stats().get(Gauge.INFLIGHT_BLOCKS)).as("the save's slot is still claimed").isEqualTo(1);
            assertThat(store.stats().get(Gauge.RESIDENT_BLOCKS)).as("saved blocks stay").isEqualTo(2);
            verifyInvariants();
            if (followsTheConfiguredClock()) {
                assertThat(open.holdNanos()).as("10 s: shorter than the copy TTL").isEqualTo(Duration.ofSeconds(10).toNanos());
                clock.advance(Duration.ofSeconds(9));
                sweep();
                assertThat(store.stats().get(Gauge.PINNED_BLOCKS)).as("still held").isEqualTo(2);
                clock.advance(Duration.ofSeconds(1).plusNanos(1));
                sweep();
                assertThat(store.stats().get(Gauge.PINNED_BLOCKS)).as("released when the hold ends").isZero();
                assertThat(store.stats().get(Gauge.INFLIGHT_BLOCKS)).isZero();
                assertThat(store.stats().get(Gauge.RESIDENT_BLOCKS)).isEqualTo(2);
                verifyInvariants();
            }
        }
    }

    /**
     * Ids are bound to the instance they were issued to: another instance (a tenant that
     * learned or guessed an id) cannot release a lease, load it, or end a save or load, and
     * nothing changes when it tries; the owner then proceeds as if nothing happened.
     */
    @Test
    void anIdIssuedToOneInstanceIsRefusedToAnother() {
        try (BlockStore store = store(config(1 << 20).build());
                KvWorld a = new KvWorld("a", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 2, 32, 256, 0);
                KvWorld b = new KvWorld("b", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 2, 32, 256, 0)) {
            for (KvWorld w : List.of(a, b)) {
                store.registerInstance(w.spec);
                store.registerWorker(w.spec.instanceId(), w.workers.get(0));
            }
            BlockHashes h = BlockHashes.of(KvWorld.randomHashes(rnd, 2));
            CopyPlan save = store.reserveSave("a", 0, null, new long[] {0, 1}, h);
            assertThat(save.id()).isNotEqualTo(Token.NONE);
            EngineStats before = store.stats();
            assertThatThrownBy(() -> store.endCopy("b", save.id(), true, 0, 0)).isInstanceOf(PermissionDeniedException.class)
                    .hasMessageContaining("not issued to instance 'b'");
            assertThat(store.stats().get(Gauge.INFLIGHT_BLOCKS)).isEqualTo(before.get(Gauge.INFLIGHT_BLOCKS));
            assertThat(openOperations()).as("still a's to end").isEqualTo(1);
            store.endCopy("a", save.id(), true, 0, 0);

            Token lease = store.query("a", h).lease();
            assertThatThrownBy(() -> store.release("b", lease)).isInstanceOf(PermissionDeniedException.class);
            assertThatThrownBy(() -> store.beginLoad("b", 0, lease, new long[] {5, 6}))
                    .isInstanceOf(PermissionDeniedException.class);
            assertThat(store.stats().get(Gauge.ACTIVE_LEASES)).as("a's lease is untouched").isEqualTo(1);
            CopyPlan load = store.beginLoad("a", 0, lease, new long[] {5, 6});
            assertThatThrownBy(() -> store.endCopy("b", load.id(), true, 0, 0)).isInstanceOf(PermissionDeniedException.class);
            store.endCopy("a", load.id(), true, 0, 0);
            assertThat(openOperations()).isZero();
            verifyInvariants();
        }
    }

    /** A copier that dies without a session (no unregister) does not leak: its open copies roll back after the copy TTL. */
    @Test
    void savesAndLoadsNeverEndedAreRolledBackAfterTheCopyTtl() {
        requireTheConfiguredClock();
        try (BlockStore store = store(config(1 << 20).copyTtl(Duration.ofSeconds(60)).build());
                KvWorld w = new KvWorld("dead", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 2, 32, 256, 0)) {
            store.registerInstance(w.spec);
            store.registerWorker("dead", w.workers.get(0));
            BlockHashes h = BlockHashes.of(KvWorld.randomHashes(rnd, 3));
            store.endCopy("dead", store.reserveSave("dead", 0, null, new long[] {0, 1}, h.slice(0, 2)).id(), true, 0, 0);
            long resident = store.stats().get(Gauge.POOL_USED_BYTES);
            CopyPlan load = store.beginLoad("dead", 0, store.query("dead", h.slice(0, 2)).lease(), new long[] {5, 6});
            CopyPlan save = store.reserveSave("dead", 0, null, new long[] {2}, h.slice(2, 3));
            clock.advance(Duration.ofSeconds(59));
            sweep();
            assertThat(openOperations()).as("not yet").isEqualTo(2);
            clock.advance(Duration.ofSeconds(2));
            sweep();
            assertThat(openOperations()).isZero();
            assertThat(store.stats().get(Counter.COPIES_EXPIRED)).isEqualTo(2);
            assertThat(store.stats().get(Gauge.PINNED_BLOCKS)).isZero();
            assertThat(store.stats().get(Gauge.POOL_USED_BYTES)).as("back to the resident bytes").isEqualTo(resident);
            assertThatThrownBy(() -> store.endCopy("dead", save.id(), true, 0, 0)).isInstanceOf(InvalidArgumentException.class)
                    .hasMessageContaining("expired");
            assertThatThrownBy(() -> store.endCopy("dead", load.id(), true, 0, 0)).isInstanceOf(InvalidArgumentException.class);
            verifyInvariants();
        }
    }

    /**
     * MLA under TP: every rank holds the same latent, so the connector registers each rank as
     * a replica of tp rank 0. One copy is stored (the second rank's save is a no-op) and
     * every replica loads it.
     */
    @Test
    void mlaReplicasStoreOneCopyAndAllLoadIt() {
        engine = engine(config(64 << 10).build());
        world = new KvWorld("mla", "ns", KvWorld.Kind.MLA, 2, 1, 2, 32, 256, 0);
        List<WorkerSpec> replicas = world.workers.stream()
                .map(w -> new WorkerSpec(w.workerRank(), 0, w.deviceId(), w.layers())).toList();
        engine.registerInstance(new InstanceSpec("mla", "ns", 1, 2));
        replicas.forEach(w -> engine.registerWorker("mla", w));
        byte[][] h = KvWorld.randomHashes(rnd, 2);
        long[] src = {0, 1};
        for (WorkerSpec w : replicas) {
            for (int i = 0; i < h.length; i++) {
                world.fillPattern(w, src[i], h[i]);
            }
            engine.save("mla", w.workerRank(), src, BlockHashes.of(h)).join();
        }
        assertThat(engine.stats().get(Counter.SAVE_BLOCKS)).as("one stored copy").isEqualTo(2);
        assertThat(engine.stats().get(Gauge.POOL_USED_BYTES)).isEqualTo(2 * 2 * 256);
        QueryResult q = engine.query("mla", BlockHashes.of(h));
        assertThat(q.hitBlocks()).isEqualTo(2);
        for (WorkerSpec w : replicas) {
            engine.load("mla", w.workerRank(), q.lease(), new long[] {10, 11}).join();
            assertThat(world.holdsPattern(w, 10, h[0]) && world.holdsPattern(w, 11, h[1])).isTrue();
        }
        // each worker's load consumed its share of the lease
        assertThatThrownBy(() -> engine.release("mla", q.lease())).isInstanceOf(UnknownLeaseException.class);
        verifyInvariants();
    }

    /**
     * A save of 64 blocks or more goes in two parts; when the rest cannot be planned (pool
     * exhausted), the save's future still waits for the head's copy, which reads blocks vLLM
     * reuses once the save is reported, and then fails; the head's blocks are saved.
     */
    @Test
    void aSaveInTwoPartsCompletesOnlyAfterBothEvenWhenTheRestIsRefused() {
        CompletableFuture<Void> gate = new CompletableFuture<>();
        engine = engine(config(40 * 1024L).transfer(pool -> new GatedTransfer(new HostTransferEngine(pool, 1), () -> gate)).build());
        world = new KvWorld("inst", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 2, 128, 256, 0); // 1 KiB blocks, 40 fit
        world.register(engine);
        byte[][] h = KvWorld.randomHashes(rnd, 64);
        long[] ids = new long[64];
        for (int i = 0; i < 64; i++) {
            ids[i] = i;
            world.fillPattern(i, h[i]);
        }
        CompletableFuture<CopyResult> f = engine.save("inst", 0, ids, BlockHashes.of(h));
        assertThat(PegaEngine.saveParts(ids.length)).containsExactly(0, 32, 64);
        assertThat(f).as("the head (32 blocks) is still copying").isNotDone();
        gate.complete(null);
        assertThatThrownBy(f::join).isInstanceOf(CompletionException.class).cause()
                .isInstanceOf(PoolExhaustedException.class);
        assertThat(hits(java.util.Arrays.copyOf(h, 32))).isEqualTo(32);
        verifyInvariants();
    }

    /**
     * 256 blocks go in three parts (32, 96, 128); a pool of 130 blocks holds the first two:
     * the third is refused, the future fails only after the first two have copied, and their
     * 128 blocks are saved.
     */
    @Test
    void aSaveInThreePartsKeepsThePartsBeforeARefusedOne() {
        assertThat(PegaEngine.saveParts(2048)).containsExactly(0, 256, 1024, 2048);
        assertThat(PegaEngine.saveParts(63)).containsExactly(0, 63);
        assertThat(PegaEngine.saveParts(256)).containsExactly(0, 32, 128, 256);
        CompletableFuture<Void> gate = new CompletableFuture<>();
        engine = engine(config(130 * 1024L).transfer(pool -> new GatedTransfer(new HostTransferEngine(pool, 1), () -> gate)).build());
        world = new KvWorld("inst", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 2, 256, 256, 0); // 1 KiB blocks, 130 fit
        world.register(engine);
        byte[][] h = KvWorld.randomHashes(rnd, 256);
        long[] ids = new long[256];
        for (int i = 0; i < 256; i++) {
            ids[i] = i;
            world.fillPattern(i, h[i]);
        }
        CompletableFuture<CopyResult> f = engine.save("inst", 0, ids, BlockHashes.of(h));
        assertThat(f).as("the first two parts are still copying").isNotDone();
        gate.complete(null);
        assertThatThrownBy(f::join).isInstanceOf(CompletionException.class).cause()
                .isInstanceOf(PoolExhaustedException.class);
        assertThat(hits(java.util.Arrays.copyOf(h, 128))).isEqualTo(128);
        assertThat(hits(java.util.Arrays.copyOfRange(h, 128, 256))).isZero();
        verifyInvariants();
    }

    /** A copy engine that fails every batch while {@code fail} is set. */
    private record FailingTransfer(HostTransferEngine delegate, AtomicBoolean fail) implements TransferEngine {
        @Override
        public TransferFuture submit(CopyBatch batch) {
            if (fail.get()) {
                TransferFuture failed = new TransferFuture();
                failed.completeExceptionally(new IllegalStateException("injected copy failure"));
                return failed;
            }
            return delegate.submit(batch);
        }

        @Override
        public String name() {
            return "failing";
        }

        @Override
        public void close() {
            delegate.close();
        }
    }
}
