package io.pegaflow.engine;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.metrics.Gauge;
import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.store.LocalStore;
import io.pegaflow.engine.transfer.CopyBatch;
import io.pegaflow.engine.transfer.HostTransferEngine;
import io.pegaflow.engine.transfer.TransferEngine;
import io.pegaflow.engine.transfer.TransferFuture;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Proxy;
import java.time.Duration;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * A save's future completes when its bytes have landed and its seal goes to the control
 * plane beside it (PegaEngine's javadoc): the caller never waits for that round trip, this
 * engine's own reads still see every save whose future completed, and a failed seal loses
 * no bytes and no accounting. A load whose plan holds its pins long enough ends the same way;
 * one without a hold, or slower than half of it, ends before it is done (a refused end fails
 * it). A failed copy is rolled back before its caller hears of it.
 * The control plane here is a real {@link LocalStore} whose {@code endCopy} the test holds.
 */
class CopyEndTest {
    private static final int BLOCK = 2 * 2 * 256; // 2 layers, K and V of 256 bytes

    private final Random rnd = new Random(7);
    /** The control plane's clock: it moves only when the test says (the copy TTL below). */
    private final java.util.concurrent.atomic.AtomicLong now = new java.util.concurrent.atomic.AtomicLong();
    private LocalStore local = store(Duration.ofSeconds(60));
    /** Copies complete once this has (and the copy has); the tests hold it to keep a copy running. */
    private volatile CompletableFuture<Void> copyGate = CompletableFuture.completedFuture(null);
    /** Each endCopy's outcome argument, in call order. */
    private final List<Boolean> ends = new CopyOnWriteArrayList<>();
    private volatile CountDownLatch endGate = new CountDownLatch(0);
    private volatile boolean failEnds;
    /** Plans of loads come without a hold, as an older server's do. */
    private volatile boolean dropHolds;
    private PegaEngine engine;
    private KvWorld world;

    @AfterEach
    void close() {
        endGate.countDown();
        copyGate.complete(null); // a test that failed mid-copy leaves none running for close() to wait on
        if (world != null) {
            world.close();
        }
        if (engine != null) {
            engine.close();
        }
    }

    /** A control plane on the test's clock with copy TTL {@code ttl} (its plans' hold: 10 s, or the TTL if shorter). */
    private LocalStore store(Duration ttl) {
        return new LocalStore(EngineConfig.builder().poolSize("64kb").sweepInterval(Duration.ZERO).copyTtl(ttl)
                .nanoClock(now::get).build(), 64 * 1024);
    }

    /** Host copies that complete once {@link #copyGate} (as it is at submit) has. */
    private TransferEngine gated(HostPool pool) {
        return new GatedTransfer(new HostTransferEngine(pool, 1), () -> copyGate);
    }

    /** The engine over the local store, each endCopy waiting for {@link #endGate} first. */
    private PegaEngine engine(Function<HostPool, TransferEngine> transfer) {
        BlockStore gated = (BlockStore) Proxy.newProxyInstance(BlockStore.class.getClassLoader(),
                new Class<?>[] {BlockStore.class}, (proxy, method, args) -> {
                    if (method.getName().equals("endCopy")) {
                        assertThat(endGate.await(10, TimeUnit.SECONDS)).as("the test opened the end gate").isTrue();
                        ends.add((Boolean) args[2]);
                        if (failEnds) {
                            throw new PegaflowException(ErrorCode.UNAVAILABLE, "the server went away");
                        }
                    }
                    Object out;
                    try {
                        out = method.invoke(local, args);
                    } catch (InvocationTargetException e) {
                        throw e.getCause();
                    }
                    if (dropHolds && out instanceof CopyPlan p && p.direction() == CopyPlan.Direction.LOAD) {
                        return new CopyPlan(p.id(), p.direction(), p.blocks(), p.skippedBlocks(), p.runBlock(), p.runRegion(),
                                p.runCount(), p.runOffset(), 0);
                    }
                    return out;
                });
        engine = PegaEngine.attach(gated, HostPool.anonymous(64 * 1024), transfer);
        world = new KvWorld("i", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 2, 64, 256, 0);
        world.register(engine);
        return engine;
    }

    /** Saves blocks 0 and 1 under {@code h}, waits for the seals, and queries them: the lease to load with. */
    private QueryResult saveAndQuery(byte[][] h) throws Exception {
        engine.save("i", 0, new long[] {0, 1}, BlockHashes.of(h)).get(10, TimeUnit.SECONDS);
        engine.flush(10_000);
        return engine.query("i", BlockHashes.of(h));
    }

    private byte[][] fill(int n) {
        byte[][] h = KvWorld.randomHashes(rnd, n);
        for (int k = 0; k < n; k++) {
            world.fillPattern(k, h[k]);
        }
        return h;
    }

    @Test
    void aSaveCompletesBeforeItsSealAndThisEnginesQueryWaitsForIt() throws Exception {
        engine(pool -> new HostTransferEngine(pool, 1));
        byte[][] h = fill(3);
        endGate = new CountDownLatch(1);
        CopyResult saved = engine.save("i", 0, new long[] {0, 1, 2}, BlockHashes.of(h)).get(10, TimeUnit.SECONDS);
        assertThat(saved.blocks()).as("completed with its end still held").isEqualTo(3);
        assertThat(saved.bytes()).isEqualTo(3L * BLOCK);
        assertThat(ends).isEmpty();
        assertThat(local.openOperations()).as("the plan is still open in the control plane").isEqualTo(1);
        assertThat(local.query("i", BlockHashes.of(h)).hitBlocks()).as("another client: not visible yet").isZero();

        CompletableFuture<QueryResult> own = CompletableFuture.supplyAsync(() -> engine.query("i", BlockHashes.of(h)));
        assertThatThrownBy(() -> own.get(200, TimeUnit.MILLISECONDS)).as("this engine's query waits for the end")
                .isInstanceOf(java.util.concurrent.TimeoutException.class);
        endGate.countDown();
        QueryResult q = own.get(10, TimeUnit.SECONDS);
        assertThat(q.hitBlocks()).as("sees its own save").isEqualTo(3);
        assertThat(ends).containsExactly(true);

        // a load whose plan holds its pins (10 s) is done when its bytes are; it ends beside
        endGate = new CountDownLatch(1);
        CopyResult loaded = engine.load("i", 0, q.lease(), new long[] {10, 11, 12}).get(10, TimeUnit.SECONDS);
        assertThat(loaded.blocks()).as("completed with its end still held").isEqualTo(3);
        for (int k = 0; k < 3; k++) {
            assertThat(world.holdsPattern(10 + k, h[k])).as("block %d loaded back", k).isTrue();
        }
        assertThat(local.stats().get(Gauge.PINNED_BLOCKS)).as("still pinned: its end is held").isEqualTo(3);
        CompletableFuture<Void> flushed = CompletableFuture.runAsync(() -> engine.flush(10_000));
        assertThatThrownBy(() -> flushed.get(200, TimeUnit.MILLISECONDS)).as("flush waits for the load's end")
                .isInstanceOf(java.util.concurrent.TimeoutException.class);
        endGate.countDown();
        flushed.get(10, TimeUnit.SECONDS);
        assertThat(ends).containsExactly(true, true);
        assertThat(local.stats().get(Gauge.PINNED_BLOCKS)).as("unpinned by its end").isZero();
        assertThat(local.openOperations()).isZero();
        local.verifyInvariants();
    }

    /**
     * A plan with no hold (an older server's) proves its pins only by its end: such a load is
     * done only once its end succeeded, and one whose end is refused (its instance
     * unregistered by the server, or its copy TTL passed: its slots may have been reused)
     * fails, so vLLM recomputes instead of using the bytes.
     */
    @Test
    void aLoadWithoutAHoldEndsFirstAndFailsWhenItsEndIsRefused() throws Exception {
        engine(pool -> new HostTransferEngine(pool, 1));
        byte[][] h = fill(2);
        dropHolds = true; // load plans only: the save and the query are as before
        QueryResult q = saveAndQuery(h);
        endGate = new CountDownLatch(1);
        // (on its own thread: a host copy may land before load() returns, then it ends right there)
        CompletableFuture<CopyResult> load = CompletableFuture.supplyAsync(
                () -> engine.load("i", 0, q.lease(), new long[] {10, 11}).join());
        assertThatThrownBy(() -> load.get(200, TimeUnit.MILLISECONDS)).as("a load without a hold waits for its end")
                .isInstanceOf(java.util.concurrent.TimeoutException.class);
        endGate.countDown();
        assertThat(load.get(10, TimeUnit.SECONDS).blocks()).isEqualTo(2);
        assertThat(local.stats().get(Gauge.PINNED_BLOCKS)).as("unpinned before the load reported done").isZero();

        QueryResult again = engine.query("i", BlockHashes.of(h));
        failEnds = true;
        assertThatThrownBy(() -> engine.load("i", 0, again.lease(), new long[] {20, 21}).get(10, TimeUnit.SECONDS))
                .isInstanceOf(ExecutionException.class).hasMessageContaining("the server went away");
    }

    /**
     * A held load whose end is refused (the store lost it, say) still completes: it finished
     * well within the hold, so its bytes are the pool's. Its pins are released by the copy
     * TTL, and nothing is lost or double-counted.
     */
    @Test
    void aHeldLoadWhoseEndIsRefusedCompletesAndItsPinsExpire() throws Exception {
        engine(pool -> new HostTransferEngine(pool, 1));
        byte[][] h = fill(2);
        QueryResult q = saveAndQuery(h);
        failEnds = true;
        assertThat(engine.load("i", 0, q.lease(), new long[] {20, 21}).get(10, TimeUnit.SECONDS).blocks()).isEqualTo(2);
        assertThat(world.holdsPattern(20, h[0])).isTrue();
        engine.flush(10_000);
        assertThat(local.stats().get(Gauge.PINNED_BLOCKS)).as("the refused end left them pinned").isEqualTo(2);
        now.addAndGet(Duration.ofSeconds(61).toNanos());
        local.sweep();
        assertThat(local.stats().get(Gauge.PINNED_BLOCKS)).isZero();
        assertThat(local.openOperations()).isZero();
        local.verifyInvariants();
    }

    @Test
    void flushWaitsForEndsAndAFailedEndLosesNothing() throws Exception {
        engine(pool -> new HostTransferEngine(pool, 1));
        byte[][] h = fill(2);
        failEnds = true;
        endGate = new CountDownLatch(1);
        CopyResult saved = engine.save("i", 0, new long[] {0, 1}, BlockHashes.of(h)).get(10, TimeUnit.SECONDS);
        assertThat(saved.blocks()).isEqualTo(2);
        CompletableFuture<Void> flush = CompletableFuture.runAsync(() -> engine.flush(10_000));
        assertThatThrownBy(() -> flush.get(200, TimeUnit.MILLISECONDS)).as("the barrier waits for the end")
                .isInstanceOf(java.util.concurrent.TimeoutException.class);
        endGate.countDown();
        flush.get(10, TimeUnit.SECONDS);
        assertThat(ends).containsExactly(true);
        // The end never reached the store: the save is not visible, its reservation open
        // until the copy TTL rolls it back; nothing is lost or double-counted.
        assertThat(engine.query("i", BlockHashes.of(h)).hitBlocks()).isZero();
        now.addAndGet(Duration.ofSeconds(61).toNanos());
        local.sweep();
        assertThat(local.openOperations()).isZero();
        assertThat(local.stats().get(Gauge.POOL_USED_BYTES)).isZero();
        local.verifyInvariants();

        failEnds = false;
        assertThat(engine.save("i", 0, new long[] {0, 1}, BlockHashes.of(h)).get(10, TimeUnit.SECONDS).blocks())
                .as("saved again once the store answers").isEqualTo(2);
        assertThat(engine.query("i", BlockHashes.of(h)).hitBlocks()).isEqualTo(2);
    }

    /**
     * The pool (64 blocks) is full with a save's 40 blocks still being sealed (not evictable
     * yet): the next save of 40 waits for those seals and then evicts, instead of failing.
     */
    @Test
    void aSaveRefusedForSpaceWhileSealsAreInFlightWaitsForThemAndRetries() throws Exception {
        engine(pool -> new HostTransferEngine(pool, 1));
        long[] ids = java.util.stream.LongStream.range(0, 40).toArray();
        byte[][] first = fill(40);
        endGate = new CountDownLatch(1);
        assertThat(engine.save("i", 0, ids, BlockHashes.of(first)).get(10, TimeUnit.SECONDS).blocks()).isEqualTo(40);
        byte[][] second = fill(40); // the first copy landed: vLLM may reuse its device blocks
        CompletableFuture<CopyResult> next = CompletableFuture.supplyAsync(
                () -> engine.save("i", 0, ids, BlockHashes.of(second)).join());
        assertThatThrownBy(() -> next.get(200, TimeUnit.MILLISECONDS)).as("waits for the seals, is not refused")
                .isInstanceOf(java.util.concurrent.TimeoutException.class);
        endGate.countDown();
        assertThat(next.get(10, TimeUnit.SECONDS).blocks()).isEqualTo(40);
        assertThat(engine.query("i", BlockHashes.of(second)).hitBlocks()).isEqualTo(40);
        local.verifyInvariants();
    }

    /**
     * A load whose copy took longer than half its plan's hold (100 ms here: the copy TTL) no
     * longer knows its pins held by the clock alone: it waits for its end, as a load without a
     * hold does.
     */
    @Test
    void aLoadSlowerThanHalfItsHoldWaitsForItsEnd() throws Exception {
        local = store(Duration.ofMillis(100));
        engine(this::gated);
        byte[][] h = fill(2);
        QueryResult q = saveAndQuery(h);
        copyGate = new CompletableFuture<>();
        endGate = new CountDownLatch(1);
        CompletableFuture<CopyResult> load = CompletableFuture.supplyAsync(
                () -> engine.load("i", 0, q.lease(), new long[] {10, 11}).join());
        Thread.sleep(150); // the copy outlasts half the hold
        CompletableFuture<Void> gate = copyGate;
        CompletableFuture.runAsync(() -> gate.complete(null)); // its end runs on the completing thread
        assertThatThrownBy(() -> load.get(200, TimeUnit.MILLISECONDS)).as("it waits for its end")
                .isInstanceOf(java.util.concurrent.TimeoutException.class);
        endGate.countDown();
        assertThat(load.get(10, TimeUnit.SECONDS).blocks()).isEqualTo(2);
        assertThat(world.holdsPattern(10, h[0])).isTrue();
        assertThat(local.stats().get(Gauge.PINNED_BLOCKS)).as("unpinned before it was reported done").isZero();
    }

    /**
     * The server unregisters the instance (its session lost) while a held load is copying:
     * the load's pins stay for its hold, so the copy read what it was promised and the load
     * succeeds; its end is refused (the plan can no longer be ended) and the pins go when the
     * hold ends.
     */
    @Test
    void aHeldLoadSucceedsWhenItsInstanceIsUnregisteredMidCopy() throws Exception {
        engine(this::gated);
        byte[][] h = fill(2);
        QueryResult q = saveAndQuery(h);
        copyGate = new CompletableFuture<>();
        CompletableFuture<CopyResult> load = engine.load("i", 0, q.lease(), new long[] {10, 11});
        local.unregisterInstance("i"); // what the server does after a lost session's grace
        assertThat(local.stats().get(Gauge.PINNED_BLOCKS)).as("held for the copy in flight").isEqualTo(2);
        copyGate.complete(null);
        assertThat(load.get(10, TimeUnit.SECONDS).blocks()).isEqualTo(2);
        assertThat(world.holdsPattern(10, h[0]) && world.holdsPattern(11, h[1])).isTrue();
        engine.flush(10_000); // its end, refused, was logged
        assertThat(local.stats().get(Gauge.PINNED_BLOCKS)).as("until the hold ends").isEqualTo(2);
        now.addAndGet(Duration.ofSeconds(10).toNanos() + 1);
        local.sweep();
        assertThat(local.stats().get(Gauge.PINNED_BLOCKS)).isZero();
        local.verifyInvariants();
    }

    @Test
    void aFailedCopyIsRolledBackBeforeItsCallerHears() throws Exception {
        CompletableFuture<Void> dma = new CompletableFuture<>(); // fails once the test's observer is attached
        engine(pool -> new TransferEngine() {
            @Override
            public TransferFuture submit(CopyBatch batch) {
                return TransferFuture.following(dma, () -> { });
            }

            @Override
            public String name() {
                return "failing";
            }

            @Override
            public void close() {
            }
        });
        byte[][] h = fill(2);
        CompletableFuture<CopyResult> f = engine.save("i", 0, new long[] {0, 1}, BlockHashes.of(h));
        CompletableFuture<Integer> openWhenHeard = f.handle((r, e) -> local.openOperations());
        dma.completeExceptionally(new IllegalStateException("DMA fault"));
        assertThatThrownBy(() -> f.get(10, TimeUnit.SECONDS)).isInstanceOf(ExecutionException.class)
                .hasCauseInstanceOf(TransferFailedException.class).hasMessageContaining("DMA fault");
        assertThat(openWhenHeard.get(10, TimeUnit.SECONDS)).as("rolled back before the caller heard").isZero();
        assertThat(ends).containsExactly(false);
        assertThat(local.stats().get(Gauge.POOL_USED_BYTES)).isZero();
        local.verifyInvariants();
    }
}
