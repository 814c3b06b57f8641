package io.pegaflow.connector;

import static io.pegaflow.connector.TestBlocks.ids;
import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.EngineSource;
import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.metrics.Gauge;
import io.pegaflow.engine.ssd.SsdConfig;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicReference;
import java.util.Random;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The connector's brain driven in vLLM's call order (scheduler hooks, then the worker's),
 * with an embedded engine and one worker: cold saves, warm loads into other blocks,
 * side-effect-free lookups, the last prompt token left to compute, blocks held until saves
 * finish, aborts while loading, failed loads reported per block, misses on store failure.
 */
class ConnectorBrainTest {
    private static final int BLOCK = 16;
    private static final int BLOCKS = 64;
    private static final int SEG = 1024;

    private final Arena arena = Arena.ofShared();
    private final Random rnd = new Random(21);
    private PegaEngine engine;
    /** What the store link would hand out: tests switch it to simulate a server going away. */
    private final AtomicReference<EngineSource.Binding> bound = new AtomicReference<>();
    private SchedulerSide sched;
    private WorkerSide worker;
    private List<LayerRegion> layers;

    @BeforeEach
    void start() {
        layers = List.of(region("layers.0"), region("layers.1"));
        bind(EngineConfig.builder().poolSize("8mb").sweepInterval(Duration.ZERO).leaseTtl(Duration.ofSeconds(30)), 1);
        sched = new SchedulerSide(bound::get, "vllm", BLOCK, true);
        worker = new WorkerSide(bound::get, "vllm", 0);
    }

    /**
     * Waits up to 10 s for the engine's stagings started and first groups seen landed to reach
     * these counts ({@link PegaEngine#stagingCounts}: entries 5 and 9, after the loads staged and refused
     * and before their nanoseconds).
     */
    private void awaitStagingCounts(long started, long landed) throws InterruptedException {
        long end = System.nanoTime() + 10_000_000_000L;
        long[] c = engine.stagingCounts();
        while ((c[5] < started || c[9] < landed) && System.nanoTime() < end) {
            Thread.sleep(1);
            c = engine.stagingCounts();
        }
        assertThat(c[5]).as("stagings started").isEqualTo(started);
        assertThat(c[9]).as("first groups seen landed").isEqualTo(landed);
    }

    /** This test's engine replaced by one whose copy engine stages loads at their lookup (a 1 MiB host buffer). */
    private void bindStaging() {
        engine.close();
        bind(EngineConfig.builder().poolSize("8mb").sweepInterval(Duration.ZERO).leaseTtl(Duration.ofSeconds(30))
                .transfer(pool -> new io.pegaflow.engine.transfer.HostTransferEngine(pool, 1, 1 << 20)), 2);
    }

    /** A fresh engine of {@code config} with this test's instance and worker, handed out as link generation {@code generation}. */
    private void bind(EngineConfig.Builder config, long generation) {
        engine = PegaEngine.create(config.build());
        engine.registerInstance(new InstanceSpec("vllm", "ns", 1, 1));
        engine.registerWorker("vllm", new WorkerSpec(0, 0, 0, layers));
        bound.set(new EngineSource.Binding(engine, generation));
    }

    @AfterEach
    void stop() {
        engine.close();
        arena.close();
    }

    private LayerRegion region(String name) {
        MemorySegment m = arena.allocate(2L * BLOCKS * SEG, 64);
        return new LayerRegion(name, KvLayout.SPLIT_KV, m.address(), m.byteSize(), BLOCKS, SEG, SEG, (long) BLOCKS * SEG);
    }

    private byte[] block(long id) {
        byte[] out = new byte[layers.size() * 2 * SEG];
        int at = 0;
        for (LayerRegion r : layers) {
            for (int s = 0; s < 2; s++) {
                MemorySegment.copy(MemorySegment.ofAddress(r.pieceAddress(id, s)).reinterpret(SEG), ValueLayout.JAVA_BYTE, 0, out, at, SEG);
                at += SEG;
            }
        }
        return out;
    }

    private void fill(long id) {
        for (LayerRegion r : layers) {
            for (int s = 0; s < 2; s++) {
                byte[] b = new byte[SEG];
                rnd.nextBytes(b);
                MemorySegment.copy(b, 0, MemorySegment.ofAddress(r.pieceAddress(id, s)).reinterpret(SEG), ValueLayout.JAVA_BYTE, 0, SEG);
            }
        }
    }

    private BlockHashes hashes(int n) {
        return TestBlocks.hashes(rnd, n);
    }

    /** A cold request of {@code tokens} tokens computed in one step in blocks [from, ...): its full blocks get saved. */
    private void runCold(String id, BlockHashes hashes, int tokens, int from) {
        assertThat(sched.lookup(id, hashes, tokens, 0)).isZero();
        int need = (tokens + BLOCK - 1) / BLOCK;
        sched.afterAlloc(id, ids(from, need), 0);
        for (int i = 0; i < need; i++) {
            fill(from + i);
        }
        sched.schedule(id, hashes, 0, new long[0], false, 0, tokens);
        byte[] plan = sched.buildPlan();
        assertThat(StepPlan.decode(plan).saves()).hasSize(1);
        worker.startLoads(plan);
        worker.submitSaves(plan, 0);
    }

    /** Host copies that note, for every batch, the thread that submitted it and the stream it waits for. */
    private record RecordingTransfer(io.pegaflow.engine.transfer.HostTransferEngine host, List<String> threads,
            List<Long> streams) implements io.pegaflow.engine.transfer.TransferEngine {
        @Override
        public io.pegaflow.engine.transfer.TransferFuture submit(io.pegaflow.engine.transfer.CopyBatch batch) {
            threads.add(Thread.currentThread().getName());
            streams.add(batch.waitStream());
            return host.submit(batch);
        }

        @Override
        public String name() {
            return "recorded-host";
        }

        @Override
        public void close() {
            host.close();
        }
    }

    /** The threads that submitted a request's save batches, and the streams the batches wait for. */
    private record SaveSubmits(List<String> threads, List<Long> streams) {}

    /**
     * Binds a fresh engine whose copies are recorded, saves two blocks through a cold request
     * "a" whose plan {@link WorkerSide#submitSaves} gets with {@code stream}, waits until the
     * saves are reported, then loads them into other blocks and checks the bytes.
     */
    private SaveSubmits saveOnStreamThenLoad(long stream) throws InterruptedException {
        engine.close();
        List<RecordingTransfer> made = new ArrayList<>();
        bind(EngineConfig.builder().poolSize("8mb").sweepInterval(Duration.ZERO)
                .transfer(pool -> {
                    RecordingTransfer t = new RecordingTransfer(new io.pegaflow.engine.transfer.HostTransferEngine(pool, 1),
                            new java.util.concurrent.CopyOnWriteArrayList<>(), new java.util.concurrent.CopyOnWriteArrayList<>());
                    made.add(t);
                    return t;
                }), 2);
        BlockHashes h = hashes(2);
        assertThat(sched.lookup("a", h, 2 * BLOCK + 1, 0)).isZero();
        sched.afterAlloc("a", ids(0, 3), 0);
        fill(0);
        fill(1);
        byte[][] want = {block(0), block(1)};
        sched.schedule("a", h, 0, new long[0], false, 0, 2 * BLOCK + 1);
        byte[] plan = sched.buildPlan();
        worker.startLoads(plan);
        worker.submitSaves(plan, stream);
        sched.requestFinished("a");
        assertThat(finishedSendingAfter(List.of("a"))).containsExactly("a");
        SaveSubmits saves = new SaveSubmits(List.copyOf(made.get(0).threads()), List.copyOf(made.get(0).streams()));
        // the stored bytes are the blocks' bytes: loaded into other blocks, they match
        assertThat(sched.lookup("b", h, 2 * BLOCK + 1, 0)).isEqualTo(2 * BLOCK);
        sched.afterAlloc("b", ids(10, 3), 2 * BLOCK);
        worker.startLoads(sched.buildPlan());
        assertThat(recvingAfter(List.of(), new ArrayList<>())).containsExactly("b");
        assertThat(block(10)).isEqualTo(want[0]);
        assertThat(block(11)).isEqualTo(want[1]);
        return saves;
    }

    /**
     * A save on a shared CUDA stream (handle 1, the legacy default stream) is planned and
     * submitted on the worker's save thread, not on vLLM's (wait_for_save precedes the step's
     * tokens), and still asks its copy to wait for that stream.
     */
    @Test
    void aStreamOrderedSaveIsPlannedOffTheCallersThreadAndStillWaitsForTheStream() throws Exception {
        SaveSubmits saves = saveOnStreamThenLoad(1);
        assertThat(saves.threads()).isNotEmpty().allMatch("pegaflow-save-start"::equals);
        assertThat(saves.streams()).isNotEmpty().allMatch(s -> s == 1L);
    }

    /**
     * The caller's per-thread default stream (handle 2) is the save thread's own stream there,
     * not the caller's: such a save is submitted on the caller's thread, waiting for that stream.
     */
    @Test
    void aSaveOnTheCallersPerThreadStreamIsSubmittedOnTheCallersThread() throws Exception {
        String caller = Thread.currentThread().getName();
        SaveSubmits saves = saveOnStreamThenLoad(WorkerSide.CU_STREAM_PER_THREAD);
        assertThat(saves.threads()).isNotEmpty().allMatch(caller::equals);
        assertThat(saves.streams()).isNotEmpty().allMatch(s -> s == WorkerSide.CU_STREAM_PER_THREAD);
    }

    /** Stores two blocks through a cold request "a" whose saves finish; returns their hashes. */
    private BlockHashes storedTwoBlocks() throws InterruptedException {
        BlockHashes h = hashes(2);
        runCold("a", h, 2 * BLOCK + 1, 0);
        sched.requestFinished("a");
        finishedSendingAfter(List.of("a"));
        return h;
    }

    /** Polls get_finished (first with {@code finished}) until a load is reported; sends go to {@code sent}. */
    private List<String> recvingAfter(List<String> finished, List<String> sent) throws InterruptedException {
        for (int i = 0; i < 200; i++) {
            WorkerSide.Finished f = worker.getFinished(i == 0 ? finished : List.of());
            sent.addAll(f.sending());
            if (!f.recving().isEmpty()) {
                return f.recving();
            }
            Thread.sleep(5);
        }
        return List.of();
    }

    private List<String> finishedSendingAfter(List<String> finished) throws InterruptedException {
        for (int i = 0; i < 200; i++) {
            WorkerSide.Finished f = worker.getFinished(i == 0 ? finished : List.of());
            if (!f.sending().isEmpty()) {
                return f.sending();
            }
            Thread.sleep(5);
        }
        return List.of();
    }

    @Test
    void coldThenWarmLoadsTheSavedBytesIntoOtherBlocks() throws Exception {
        BlockHashes h = hashes(4);
        assertThat(worker.idle()).as("a new worker has nothing to report").isTrue();
        runCold("cold", h, 4 * BLOCK + 3, 0);
        byte[][] saved = {block(0), block(1), block(2), block(3)};
        assertThat(worker.idle()).as("a running request's saves are reported once vLLM finished it").isTrue();
        assertThat(sched.requestFinished("cold")).as("blocks held until the save is done").isTrue();
        worker.noteFinished(List.of("cold"));
        assertThat(worker.idle()).as("finished, its saves to be reported: not idle").isFalse();
        assertThat(finishedSendingAfter(List.of())).containsExactly("cold");
        assertThat(worker.idle()).as("reported: idle again").isTrue();
        sched.finished(List.of("cold"), List.of());
        assertThat(sched.trackedRequests()).isZero();

        // Warm: the same 4 full blocks plus a partial one; a lookup repeated three times
        // returns the same answer and pins one lease.
        long tokens = 4 * BLOCK + 5;
        long leases = engine.stats().get(Counter.LEASES_CREATED);
        for (int i = 0; i < 3; i++) {
            assertThat(sched.lookup("warm", h, tokens, 0)).isEqualTo(4 * BLOCK);
        }
        assertThat(engine.stats().get(Counter.LEASES_CREATED) - leases).as("one lookup asked the store").isEqualTo(1);
        // the worker is in this process: the lookup also began its load (the lease's only share)
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).isZero();
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).isEqualTo(4);
        long loadsAsked = engine.stats().get(Counter.LOAD_REQUESTS);
        sched.afterAlloc("warm", ids(20, 5), 4 * BLOCK);
        byte[] plan = sched.buildPlan();
        assertThat(StepPlan.decode(plan).loads()).hasSize(1);
        worker.startLoads(plan);
        assertThat(worker.idle()).as("a load in flight: a later get_finished reports it").isFalse();
        List<String> recving = recvingAfter(List.of(), new ArrayList<>());
        assertThat(recving).containsExactly("warm");
        assertThat(worker.idle()).isTrue();
        assertThat(worker.drainLoadErrors()).isEmpty();
        for (int i = 0; i < 4; i++) {
            assertThat(block(20 + i)).as("block %d", i).isEqualTo(saved[i]);
        }
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).isZero();
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).isZero();
        assertThat(engine.stats().get(Counter.LOAD_REQUESTS)).as("the load took the begun plan, counted at its end")
                .isEqualTo(loadsAsked + 1);
        long[] stats = worker.drainStats();
        assertThat(stats[WorkerSide.STAT_SAVED_BLOCKS]).as("vLLM's connector stats: the cold save").isEqualTo(4);
        assertThat(stats[WorkerSide.STAT_LOADED_BLOCKS]).isEqualTo(4);
        assertThat(stats[WorkerSide.STAT_LOADED_BYTES]).isEqualTo(stats[WorkerSide.STAT_SAVED_BYTES]).isPositive();
        assertThat(stats[WorkerSide.STAT_LOAD_FAILED_BLOCKS] + stats[WorkerSide.STAT_SAVE_FAILURES]).isZero();
        assertThat(worker.drainStats()).as("drained").containsOnly(0L);
        sched.finished(List.of(), recving);
        // Next step: the loaded prefix is not saved again, only what this step completes.
        sched.schedule("warm", h, 0, new long[0], false, 4 * BLOCK, 5);
        byte[] nothing = sched.buildPlan();
        assertThat(nothing).as("a step that plans nothing: no bytes, so workers make no call for it").isEmpty();
        assertThat(StepPlan.decode(nothing).isEmpty()).isTrue();
        assertThat(worker.startLoads(nothing)).isZero();
        worker.submitSaves(nothing, 0);
        worker.awaitPreempted(nothing);
    }

    @Test
    void theLastPromptTokenIsAlwaysLeftToCompute() throws Exception {
        BlockHashes h = hashes(3);
        runCold("a", h, 3 * BLOCK, 0);
        sched.requestFinished("a");
        finishedSendingAfter(List.of("a"));
        assertThat(sched.lookup("b", h, 3 * BLOCK, 0)).as("3 full blocks, prompt of exactly 48 tokens").isEqualTo(2 * BLOCK);
        assertThat(sched.lookup("c", h, 3 * BLOCK + 1, 0)).isEqualTo(3 * BLOCK);
        assertThat(sched.lookup("d", h, 3 * BLOCK + 1, BLOCK)).as("beyond vLLM's local hit").isEqualTo(2 * BLOCK);
        sched.shutdown();
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).isZero();
    }

    @Test
    void aChangedRequestReleasesItsOldProbe() throws Exception {
        BlockHashes h = hashes(4);
        runCold("a", h, 4 * BLOCK + 1, 0);
        sched.requestFinished("a");
        finishedSendingAfter(List.of("a"));
        assertThat(sched.lookup("b", h, 4 * BLOCK + 1, 0)).isEqualTo(4 * BLOCK);
        assertThat(sched.lookup("b", h, 4 * BLOCK + 1, 2 * BLOCK)).isEqualTo(2 * BLOCK);
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).as("the first probe's lease was released").isEqualTo(2);
        sched.afterAlloc("b", ids(30, 5), 0);
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).as("allocation without a load releases it").isZero();
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).isZero();
    }

    @Test
    void anAbortWhileLoadingFreesNothingEarlyAndLeavesNoState() throws Exception {
        BlockHashes h = storedTwoBlocks();
        sched.finished(List.of("a"), List.of());
        sched.lookup("b", h, 2 * BLOCK + 1, 0);
        sched.afterAlloc("b", ids(40, 3), 2 * BLOCK);
        byte[] plan = sched.buildPlan();
        assertThat(sched.requestFinished("b")).as("no saves: vLLM itself waits for finished_recving").isFalse();
        worker.startLoads(plan);
        List<String> recving = recvingAfter(List.of("b"), new ArrayList<>());
        assertThat(recving).containsExactly("b");
        sched.finished(List.of(), recving);
        assertThat(sched.trackedRequests()).isZero();
    }

    @Test
    void aFailedLoadIsReportedBlockByBlockAndStillFinishes() throws Exception {
        BlockHashes h = storedTwoBlocks();
        sched.lookup("b", h, 2 * BLOCK + 1, 0);
        sched.afterAlloc("b", ids(50, 3), 2 * BLOCK);
        byte[] plan = sched.buildPlan();
        engine.release("vllm", StepPlan.decode(plan).loads().get(0).lease()); // the lease is gone before the worker loads
        worker.startLoads(plan);
        assertThat(recvingAfter(List.of(), new ArrayList<>())).containsExactly("b");
        assertThat(worker.drainLoadErrors()).containsExactly(50, 51);
        assertThat(worker.drainLoadErrors()).as("drained").isEmpty();
        assertThat(worker.drainStats()[WorkerSide.STAT_LOAD_FAILED_BLOCKS]).as("vLLM's connector stats").isEqualTo(2);
    }

    /** A cold request stores {@code h}'s four blocks (their bytes returned) and ends; later hits load in the step. */
    private byte[][] storedFourBlocksThenInStep(BlockHashes h) throws Exception {
        runCold("cold", h, 4 * BLOCK + 3, 0);
        byte[][] saved = {block(0), block(1), block(2), block(3)};
        sched.requestFinished("cold");
        finishedSendingAfter(List.of("cold"));
        sched.finished(List.of("cold"), List.of());
        sched.inStepLoads(true);
        return saved;
    }

    @Test
    void anInStepLoadIsWaitedForLayerByLayerAndNeverReportedAsRecving() throws Exception {
        BlockHashes h = hashes(4);
        byte[][] saved = storedFourBlocksThenInStep(h);
        assertThat(sched.lookup("warm", h, 4 * BLOCK + 5, 0)).isEqualTo(4 * BLOCK);
        sched.afterAlloc("warm", ids(20, 5), 4 * BLOCK);
        sched.schedule("warm", h, 0, new long[0], false, 4 * BLOCK, 5); // the tail, in the same step
        byte[] plan = sched.buildPlan();
        assertThat(StepPlan.decode(plan).loads()).singleElement().satisfies(l -> assertThat(l.inStep()).isTrue());
        assertThat(worker.startLoads(plan)).as("loads inside this step").isEqualTo(1);
        // what an attention layer does before it reads its KV (stream 0: host copies block here)
        for (int layer = 0; layer < layers.size(); layer++) {
            worker.waitLayer(layer, 0);
        }
        for (int i = 0; i < 4; i++) {
            assertThat(block(20 + i)).as("block %d landed before the step's end", i).isEqualTo(saved[i]);
        }
        WorkerSide.Finished f = worker.getFinished(List.of());
        assertThat(f.recving()).as("vLLM never waited for it: no finished_recving").isEmpty();
        assertThat(worker.drainLoadErrors()).isEmpty();
        long[] stats = worker.drainStats();
        assertThat(stats[WorkerSide.STAT_LOADED_BLOCKS]).isEqualTo(4);
        assertThat(stats[WorkerSide.STAT_IN_STEP_LOADS]).as("its phases, for the TTFT benchmark").isEqualTo(1);
        assertThat(stats[WorkerSide.STAT_IN_STEP_PLAN_NANOS]).isPositive();
        assertThat(stats[WorkerSide.STAT_IN_STEP_STORE_NANOS]).as("the store's plan, a part of the plan phase").isPositive()
                .isLessThanOrEqualTo(stats[WorkerSide.STAT_IN_STEP_PLAN_NANOS] - stats[WorkerSide.STAT_IN_STEP_HOP_NANOS]);
        assertThat(stats[WorkerSide.STAT_IN_STEP_HOP_NANOS]).as("the hop to the plan's thread").isNotNegative();
        assertThat(stats[WorkerSide.STAT_IN_STEP_BUILD_NANOS]).as("the pieces listed after the store's plan").isPositive();
        assertThat(stats[WorkerSide.STAT_IN_STEP_SUBMIT_NANOS]).as("the batch handed to the copy engine").isPositive();
        assertThat(stats[WorkerSide.STAT_IN_STEP_HOP_NANOS] + stats[WorkerSide.STAT_IN_STEP_STORE_NANOS]
                + stats[WorkerSide.STAT_IN_STEP_BUILD_NANOS] + stats[WorkerSide.STAT_IN_STEP_SUBMIT_NANOS])
                .as("the plan phase's parts fit in it").isLessThanOrEqualTo(stats[WorkerSide.STAT_IN_STEP_PLAN_NANOS]);
        assertThat(stats[WorkerSide.STAT_IN_STEP_LOAD_NANOS]).isGreaterThanOrEqualTo(stats[WorkerSide.STAT_IN_STEP_PLAN_NANOS]);
        assertThat(stats[WorkerSide.STAT_IN_STEP_FIRST_COPY_NANOS]).as("until the engine began its first copy").isPositive()
                .isGreaterThanOrEqualTo(stats[WorkerSide.STAT_IN_STEP_STORE_NANOS])
                .isLessThanOrEqualTo(stats[WorkerSide.STAT_IN_STEP_LOAD_NANOS]);
        assertThat(stats[WorkerSide.STAT_LOADS_STAGED]).as("no staging buffer: read from the pool").isZero();
        assertThat(stats[WorkerSide.STAT_IN_STEP_WAIT_NANOS]).isPositive();
        assertThat(stats[WorkerSide.STAT_IN_STEP_STEP_NANOS]).as("the step ended after the bytes landed")
                .isGreaterThanOrEqualTo(stats[WorkerSide.STAT_IN_STEP_LOAD_NANOS]);
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).isZero();
        assertThat(sched.requestFinished("warm")).as("nothing saved: no hold, and no wait for a load").isFalse();
        assertThat(sched.trackedRequests()).isZero();
    }

    /**
     * Host copies that order a layer-wise load as a GPU copy engine does: the batch is marked
     * queued on the device once submitted, a wait on a stream (not 0) returns at once as a
     * stream's wait on the group's event does, and the batch completes only once its host copy
     * ended and {@code landed} completed (failing with it), as a GPU batch completes when its done
     * event is seen.
     */
    private record DeviceOrdered(io.pegaflow.engine.transfer.HostTransferEngine host,
            java.util.concurrent.CompletableFuture<Void> landed) implements io.pegaflow.engine.transfer.TransferEngine {
        @Override
        public io.pegaflow.engine.transfer.TransferFuture submit(io.pegaflow.engine.transfer.CopyBatch batch) {
            io.pegaflow.engine.transfer.TransferFuture copy = host.submit(batch);
            if (batch.groupCount() <= 1 || batch.direction() != io.pegaflow.engine.transfer.CopyBatch.Direction.TO_DEVICE) {
                return copy;
            }
            io.pegaflow.engine.transfer.TransferFuture out = new io.pegaflow.engine.transfer.TransferFuture() {
                @Override
                public void awaitGroup(int group, long stream) {
                    if (stream == 0) {
                        join();
                    }
                }
            };
            java.util.concurrent.CompletableFuture.allOf(copy, landed).whenComplete((v, e) -> {
                if (e == null) {
                    out.complete(null);
                } else {
                    out.completeExceptionally(e);
                }
            });
            out.markQueuedOnDevice();
            return out;
        }

        @Override
        public String name() {
            return "device-ordered-host";
        }

        @Override
        public void close() {
            host.close();
        }
    }

    /** This test's engine replaced by one whose layer-wise loads complete once {@code landed} does ({@link DeviceOrdered}). */
    private void bindDeviceOrdered(java.util.concurrent.CompletableFuture<Void> landed) {
        engine.close();
        bind(EngineConfig.builder().poolSize("8mb").sweepInterval(Duration.ZERO).leaseTtl(Duration.ofSeconds(30))
                .transfer(pool -> new DeviceOrdered(new io.pegaflow.engine.transfer.HostTransferEngine(pool, 1), landed)), 2);
    }

    /** A warm request's hit of {@code h}'s four stored blocks loaded in its step into blocks 20-23, each layer waited for on stream 7. */
    private void warmInStepOnAStream(BlockHashes h) {
        assertThat(sched.lookup("warm", h, 4 * BLOCK + 5, 0)).isEqualTo(4 * BLOCK);
        sched.afterAlloc("warm", ids(20, 5), 4 * BLOCK);
        sched.schedule("warm", h, 0, new long[0], false, 4 * BLOCK, 5);
        assertThat(worker.startLoads(sched.buildPlan())).isEqualTo(1);
        for (int layer = 0; layer < layers.size(); layer++) {
            worker.waitLayer(layer, 7); // the forward's stream waits; this thread goes on
        }
    }

    /**
     * The step's get_finished, on another thread, while {@code landed} is open: what it returned
     * within 10 s; if it did not return (it waits for the bytes), {@code landed} is completed so
     * nothing stays blocked, and the test fails.
     */
    private WorkerSide.Finished getFinishedWhileLanding(java.util.concurrent.CompletableFuture<Void> landed) throws Exception {
        var call = java.util.concurrent.CompletableFuture.supplyAsync(() -> worker.getFinished(List.of()));
        try {
            return call.get(10, java.util.concurrent.TimeUnit.SECONDS);
        } catch (java.util.concurrent.TimeoutException waited) {
            landed.complete(null);
            call.join();
            throw new AssertionError("get_finished waited for an in-step load's bytes still landing");
        }
    }

    /**
     * An in-step load whose every copy is queued on the device, each layer behind an event the
     * forward's stream waits on: the step's get_finished returns before the last byte landed
     * (vLLM's thread goes on to queue the logits and sampling behind the forward), the worker
     * stays busy until a later call sees it landed, and that call counts it; nothing is reported
     * as failed.
     */
    @Test
    void anInStepLoadQueuedOnTheDeviceEndsItsStepBeforeItsLastByteLands() throws Exception {
        java.util.concurrent.CompletableFuture<Void> landed = new java.util.concurrent.CompletableFuture<>();
        bindDeviceOrdered(landed);
        BlockHashes h = hashes(4);
        byte[][] saved = storedFourBlocksThenInStep(h);
        warmInStepOnAStream(h);
        WorkerSide.Finished f = getFinishedWhileLanding(landed);
        assertThat(f.recving()).isEmpty();
        assertThat(f.failed()).isEmpty();
        assertThat(worker.idle()).as("the load is still landing").isFalse();
        assertThat(worker.drainLoadErrors()).isEmpty();
        long[] stats = worker.drainStats();
        assertThat(stats[WorkerSide.STAT_IN_STEP_LOADS]).isEqualTo(1);
        assertThat(stats[WorkerSide.STAT_LOADED_BLOCKS]).as("counted once landed, not before").isZero();
        assertThat(stats[WorkerSide.STAT_IN_STEP_STEP_NANOS]).as("the step ended").isPositive();
        landed.complete(null);
        for (int i = 0; i < 400 && !worker.idle(); i++) {
            assertThat(worker.getFinished(List.of()).failed()).isEmpty();
            Thread.sleep(5);
        }
        assertThat(worker.idle()).as("a later get_finished ended it").isTrue();
        assertThat(worker.drainLoadErrors()).isEmpty();
        stats = worker.drainStats();
        assertThat(stats[WorkerSide.STAT_LOADED_BLOCKS]).isEqualTo(4);
        assertThat(stats[WorkerSide.STAT_LOAD_FAILED_BLOCKS]).isZero();
        for (int i = 0; i < 4; i++) {
            assertThat(block(20 + i)).as("block %d", i).isEqualTo(saved[i]);
        }
    }

    /**
     * Such a load that fails after its step went on (the device failing, never expected) is
     * reported by the next get_finished that sees it: its request among the failed loads, so the
     * worker asks for load errors, and its blocks as load errors (vLLM recomputes them).
     */
    @Test
    void anInStepLoadThatFailsAfterItsStepWentOnIsReportedByALaterCall() throws Exception {
        java.util.concurrent.CompletableFuture<Void> landed = new java.util.concurrent.CompletableFuture<>();
        bindDeviceOrdered(landed);
        BlockHashes h = hashes(4);
        storedFourBlocksThenInStep(h);
        warmInStepOnAStream(h);
        assertThat(getFinishedWhileLanding(landed).failed()).isEmpty();
        assertThat(worker.drainLoadErrors()).isEmpty();
        landed.completeExceptionally(new IllegalStateException("CUDA_ERROR_ILLEGAL_ADDRESS (a test's)"));
        List<String> failed = new ArrayList<>();
        for (int i = 0; i < 400 && failed.isEmpty(); i++) {
            failed.addAll(worker.getFinished(List.of()).failed());
            Thread.sleep(5);
        }
        assertThat(failed).containsExactly("warm");
        assertThat(worker.drainLoadErrors()).containsExactlyInAnyOrder(20, 21, 22, 23);
        assertThat(worker.drainStats()[WorkerSide.STAT_LOAD_FAILED_BLOCKS]).isEqualTo(4);
        assertThat(worker.idle()).isTrue();
    }

    /**
     * A copy engine that stages loads at their lookup (PEGAFLOW_PRESTAGE_MIB; here the host
     * engine with a buffer): the lookup begins the load and stages its pool side, the step's
     * in-step load reads the staging, lands the saved bytes layer by layer, and is counted as
     * staged for the TTFT benchmark.
     */
    @Test
    void anInStepLoadStagedAtItsLookupLandsAndIsCounted() throws Exception {
        bindStaging();
        BlockHashes h = hashes(4);
        byte[][] saved = storedFourBlocksThenInStep(h);
        assertThat(sched.lookup("warm", h, 4 * BLOCK + 5, 0)).isEqualTo(4 * BLOCK);
        sched.afterAlloc("warm", ids(20, 5), 4 * BLOCK);
        sched.schedule("warm", h, 0, new long[0], false, 4 * BLOCK, 5);
        assertThat(worker.startLoads(sched.buildPlan())).isEqualTo(1);
        for (int layer = 0; layer < layers.size(); layer++) {
            worker.waitLayer(layer, 0);
        }
        for (int i = 0; i < 4; i++) {
            assertThat(block(20 + i)).as("block %d from the staging", i).isEqualTo(saved[i]);
        }
        worker.getFinished(List.of());
        assertThat(worker.drainLoadErrors()).isEmpty();
        long[] stats = worker.drainStats();
        assertThat(stats[WorkerSide.STAT_IN_STEP_LOADS]).isEqualTo(1);
        assertThat(stats[WorkerSide.STAT_LOADS_STAGED]).as("read from the staging its lookup began").isEqualTo(1);
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).isZero();
    }

    /**
     * An asynchronous load (vLLM's default on GPUs) of a lease whose lookup staged its pool side
     * also reads the staging: it lands the saved bytes, is reported as received, and counts.
     */
    @Test
    void anAsynchronousLoadStagedAtItsLookupLandsAndIsCounted() throws Exception {
        bindStaging();
        BlockHashes h = hashes(4);
        runCold("cold", h, 4 * BLOCK + 3, 0);
        byte[][] saved = {block(0), block(1), block(2), block(3)};
        sched.requestFinished("cold");
        finishedSendingAfter(List.of("cold"));
        sched.finished(List.of("cold"), List.of());
        assertThat(sched.lookup("warm", h, 4 * BLOCK + 5, 0)).isEqualTo(4 * BLOCK);
        sched.afterAlloc("warm", ids(20, 5), 4 * BLOCK);
        byte[] plan = sched.buildPlan();
        assertThat(StepPlan.decode(plan).loads()).singleElement().satisfies(l -> assertThat(l.inStep()).isFalse());
        assertThat(worker.startLoads(plan)).as("asynchronous").isZero();
        assertThat(recvingAfter(List.of(), new ArrayList<>())).containsExactly("warm");
        for (int i = 0; i < 4; i++) {
            assertThat(block(20 + i)).as("block %d from the staging", i).isEqualTo(saved[i]);
        }
        assertThat(worker.drainLoadErrors()).isEmpty();
        long[] stats = worker.drainStats();
        assertThat(stats[WorkerSide.STAT_LOADED_BLOCKS]).isEqualTo(4);
        assertThat(stats[WorkerSide.STAT_LOADS_STAGED]).as("read from the staging its lookup began").isEqualTo(1);
        long[] lookups = sched.drainStats();
        assertThat(lookups[SchedulerSide.STAT_BEGUN_AT_LOOKUP]).as("the warm lookup began its load").isEqualTo(1);
        assertThat(lookups[SchedulerSide.STAT_STAGINGS]).as("and staged it").isEqualTo(1);
        assertThat(lookups[SchedulerSide.STAT_STAGING_STARTS]).as("its first group queued before its load read it").isEqualTo(1);
        assertThat(lookups[SchedulerSide.STAT_STAGING_TO_FIRST_NANOS]).as("how soon, from the lookup")
                .isPositive().isGreaterThanOrEqualTo(lookups[SchedulerSide.STAT_STAGING_TO_THREAD_NANOS]
                        + lookups[SchedulerSide.STAT_STAGING_LAYOUT_NANOS]);
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).isZero();
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).isZero();
    }

    /**
     * The scheduler side's counters say what each lookup began and staged, or why it staged
     * nothing: a second warm lookup while the first's staging holds the buffer is refused as busy
     * (its load reads the pool); the counters are drained once.
     */
    @Test
    void theLookupsCountWhatTheyBeganAndStagedOrWhyNot() throws Exception {
        bindStaging();
        BlockHashes h = hashes(4);
        runCold("cold", h, 4 * BLOCK + 3, 0);
        sched.requestFinished("cold");
        finishedSendingAfter(List.of("cold"));
        sched.finished(List.of("cold"), List.of());
        long[] cold = sched.drainStats();
        assertThat(cold[SchedulerSide.STAT_BEGUN_AT_LOOKUP]).as("a miss begins nothing").isZero();
        assertThat(cold[SchedulerSide.STAT_STAGINGS]).isZero();
        assertThat(sched.lookup("a", h, 4 * BLOCK + 5, 0)).isEqualTo(4 * BLOCK);
        assertThat(sched.lookup("b", h, 4 * BLOCK + 5, 0)).isEqualTo(4 * BLOCK);
        // the staging thread counts a's start, then its first layer seen landed (a is never
        // claimed: it stays paced), after the lookup returned: both in before the drain, or a
        // late one would show in the drain meant to be empty
        awaitStagingCounts(1, 1);
        long[] stats = sched.drainStats();
        assertThat(stats[SchedulerSide.STAT_BEGUN_AT_LOOKUP]).isEqualTo(2);
        assertThat(stats[SchedulerSide.STAT_STAGINGS]).as("the first").isEqualTo(1);
        assertThat(stats[SchedulerSide.STAT_STAGING_BUSY]).as("the second: the buffer was the first's").isEqualTo(1);
        assertThat(stats[SchedulerSide.STAT_STAGING_TOO_LARGE]).isZero();
        assertThat(stats[SchedulerSide.STAT_STAGING_FAILED]).isZero();
        assertThat(stats[SchedulerSide.STAT_STAGING_UNAVAILABLE]).isZero();
        assertThat(sched.drainStats()).as("drained").containsOnly(0L);
        sched.requestFinished("a");
        sched.requestFinished("b");
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).as("both leases released").isZero();
        worker.shutdown(); // no worker of the instance in this process from here on
        assertThat(sched.lookup("c", h, 4 * BLOCK + 5, 0)).isEqualTo(4 * BLOCK);
        long[] elsewhere = sched.drainStats();
        assertThat(elsewhere[SchedulerSide.STAT_BEGUN_AT_LOOKUP]).as("its load asks for its plan at the load").isZero();
        assertThat(elsewhere[SchedulerSide.STAT_BEGIN_NO_WORKER]).isEqualTo(1);
        assertThat(elsewhere[SchedulerSide.STAT_BEGIN_DECLINED]).isZero();
        assertThat(elsewhere[SchedulerSide.STAT_STAGINGS]).isZero();
        sched.requestFinished("c");
    }

    /**
     * With loads at allocation (the worker in the scheduler's process), the in-step load starts in
     * update_state_after_alloc: its bytes land before the step's plan is even built, the step takes
     * the same load up (no second copy, no second use of the lease), waits for it layer by layer
     * and counts it.
     */
    @Test
    void anInStepLoadStartedAtAllocationIsTakenUpByItsStep() throws Exception {
        BlockHashes h = hashes(4);
        byte[][] saved = storedFourBlocksThenInStep(h);
        sched.loadsAtAlloc(true);
        assertThat(WorkerSide.colocated("vllm")).as("this process's worker of the instance").isSameAs(worker);
        assertThat(sched.lookup("warm", h, 4 * BLOCK + 5, 0)).isEqualTo(4 * BLOCK);
        sched.afterAlloc("warm", ids(20, 5), 4 * BLOCK);
        // planned now, copied once the step starts: queued at allocation, a load held the step's
        // own input copies behind it on a GPU's copy engine
        Thread.sleep(200);
        for (int i = 0; i < 4; i++) {
            assertThat(block(20 + i)).as("block %d held until its step", i).isNotEqualTo(saved[i]);
        }
        sched.schedule("warm", h, 0, new long[0], false, 4 * BLOCK, 5);
        byte[] plan = sched.buildPlan();
        assertThat(worker.startLoads(plan)).as("the allocation's load, inside this step").isEqualTo(1);
        for (int layer = 0; layer < layers.size(); layer++) {
            worker.waitLayer(layer, 0);
        }
        WorkerSide.Finished f = worker.getFinished(List.of());
        assertThat(f.recving()).isEmpty();
        for (int i = 0; i < 4; i++) {
            assertThat(block(20 + i)).as("block %d landed in its step", i).isEqualTo(saved[i]);
        }
        assertThat(worker.drainLoadErrors()).as("one load: the lease was used once").isEmpty();
        long[] stats = worker.drainStats();
        assertThat(stats[WorkerSide.STAT_IN_STEP_AT_ALLOC]).isEqualTo(1);
        assertThat(stats[WorkerSide.STAT_IN_STEP_LOADS]).isEqualTo(1);
        assertThat(stats[WorkerSide.STAT_LOADED_BLOCKS]).isEqualTo(4);
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).isZero();
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).isZero();
        assertThat(sched.requestFinished("warm")).isFalse();
        assertThat(sched.trackedRequests()).isZero();
    }

    @Test
    void aFailedInStepLoadIsReportedByItsBlocksInItsStepAndTheRequestGetsNoMoreHits() throws Exception {
        BlockHashes h = storedTwoBlocks();
        sched.finished(List.of("a"), List.of());
        sched.inStepLoads(true);
        sched.lookup("b", h, 2 * BLOCK + 1, 0);
        sched.afterAlloc("b", ids(50, 3), 2 * BLOCK);
        byte[] plan = sched.buildPlan();
        engine.release("vllm", StepPlan.decode(plan).loads().get(0).lease()); // gone before the worker loads
        assertThat(worker.startLoads(plan)).isEqualTo(1);
        worker.waitLayer(0, 0); // returns: the failure is the step's end to report
        worker.waitLayer(1, 0);
        WorkerSide.Finished f = worker.getFinished(List.of());
        assertThat(f.recving()).isEmpty();
        long[] errors = worker.drainLoadErrors();
        assertThat(errors).containsExactly(50, 51);
        sched.failedBlocks(errors); // the step's output: vLLM discards it and recomputes
        sched.finished(List.of(), List.of());
        assertThat(sched.loadFailures()).isEqualTo(1);
        assertThat(sched.lookup("b", h, 2 * BLOCK + 1, 0)).as("recomputed, not offered again").isZero();
    }

    /** An engine on {@code dir}'s SSD tier, bound for the brain, holding nothing in DRAM yet. */
    private PegaEngine ssdEngine(Path dir) {
        PegaEngine e = PegaEngine.create(EngineConfig.builder().poolSize("8mb").sweepInterval(Duration.ZERO)
                .ssd(SsdConfig.of(List.of(dir), 64L << 20)).build());
        e.registerInstance(new InstanceSpec("vllm", "ns", 1, 1));
        e.registerWorker("vllm", new WorkerSpec(0, 0, 0, layers));
        bound.set(new EngineSource.Binding(e, 2));
        return e;
    }

    @Test
    void aDecodeInstanceWaitsForTheWholePrefixThenTakesItOrAfterItsLimitWhatIsThere() throws Exception {
        SchedulerSide decode = new SchedulerSide(bound::get, "vllm", BLOCK, true, true);
        BlockHashes h = hashes(4);
        for (int i = 0; i < 4; i++) {
            fill(i);
        }
        engine.save("vllm", 0, ids(0, 2), h.slice(0, 2)).join(); // the prefill's first half arrived
        assertThat(decode.lookup("pd", h, 4 * BLOCK + 1, 0)).as("half the prefix: not yet").isEqualTo(SchedulerSide.NOT_YET);
        assertThat(engine.stats().get(io.pegaflow.engine.metrics.Gauge.ACTIVE_LEASES)).as("the partial hit's lease was released").isZero();
        engine.save("vllm", 0, ids(2, 2), h.slice(2, 4)).join(); // the rest
        assertThat(decode.lookup("pd", h, 4 * BLOCK + 1, 0)).isEqualTo(4 * BLOCK);
        assertThat(decode.prefixWaits()).isEqualTo(1);
        decode.requestFinished("pd");
        // a prefix whose rest never comes: after the wait limit, what is there
        BlockHashes other = hashes(4);
        engine.save("vllm", 0, ids(0, 1), other.slice(0, 1)).join();
        decode.maxWait(Duration.ZERO);
        assertThat(decode.lookup("late", other, 4 * BLOCK + 1, 0)).isEqualTo(BLOCK);
        assertThat(decode.waitTimeouts()).isEqualTo(1);
        decode.requestFinished("late");
        // a kv_both instance never waits
        assertThat(sched.lookup("both", other, 4 * BLOCK + 1, 0)).isEqualTo(BLOCK);
        sched.requestFinished("both");
        long[] stats = decode.drainStats();
        assertThat(stats[SchedulerSide.STAT_LOOKUPS]).as("answers but 'not yet'").isEqualTo(2);
        assertThat(stats[SchedulerSide.STAT_NOT_YET]).isEqualTo(1);
        assertThat(stats[SchedulerSide.STAT_HIT_REQUESTS]).isEqualTo(2);
        assertThat(stats[SchedulerSide.STAT_HIT_TOKENS]).isEqualTo(5 * BLOCK);
        assertThat(stats[SchedulerSide.STAT_PREFIX_WAITS]).isEqualTo(1);
        assertThat(stats[SchedulerSide.STAT_WAIT_TIMEOUTS]).isEqualTo(1);
        assertThat(stats[SchedulerSide.STAT_LOOKUP_NANOS]).isPositive();
        assertThat(decode.drainStats()).as("drained: counted once").containsOnly(0L);
        assertThat(decode.notYetAnswers()).as("the totals stay").isEqualTo(1);
    }

    /**
     * P/D's tail flow in the brain: the partial last block's key is derived here from the last
     * full block's; a hit that reaches it answers every prompt token but the last, and the
     * allocation after it loads the tail block whole (no contract violation).
     */
    @Test
    void aTailLookupDerivesTheTailKeyAndAnswersEveryPromptTokenButTheLast() {
        SchedulerSide decode = new SchedulerSide(bound::get, "vllm", BLOCK, true, true);
        BlockHashes full = hashes(2);
        int[] tail = {5, 6, 7};
        byte[] tailKey = io.pegaflow.engine.hash.VllmBlockHasher.tailKey(full.slice(1, 2).packed(), tail);
        for (int i = 0; i < 3; i++) {
            fill(i);
        }
        engine.save("vllm", 0, ids(0, 2), full).join();
        long promptTokens = 2L * BLOCK + tail.length;
        assertThat(decode.lookup("t0", full, tail, promptTokens, 0)).as("the tail is not stored yet: not yet")
                .isEqualTo(SchedulerSide.NOT_YET);
        engine.save("vllm", 0, ids(2, 1), BlockHashes.of(tailKey)).join();
        assertThat(decode.lookup("t0", full, tail, promptTokens, 0)).isEqualTo(promptTokens - 1);
        decode.afterAlloc("t0", new long[] {10, 11, 12}, promptTokens - 1);
        assertThat(decode.contractViolations()).isZero();
        assertThat(decode.drainStats()[SchedulerSide.STAT_HIT_TOKENS]).isEqualTo(promptTokens - 1);
        decode.requestFinished("t0");
    }

    @Test
    void aPrefixOnSsdIsNotYetUntilReadBackThenAHit(@TempDir Path dir) throws Exception {
        BlockHashes h = hashes(3);
        try (PegaEngine first = ssdEngine(dir)) {
            for (int i = 0; i < 3; i++) {
                fill(i);
            }
            first.save("vllm", 0, ids(0, 3), h).join();
            assertThat(first.ssd().awaitWritten(10_000)).isTrue();
        }
        try (PegaEngine restarted = ssdEngine(dir)) { // DRAM empty, the prefix on SSD
            long answer = sched.lookup("r", h, 3 * BLOCK + 1, 0);
            assertThat(answer).as("vLLM is told 'not yet' (None)").isEqualTo(SchedulerSide.NOT_YET);
            long deadline = System.nanoTime() + 10_000_000_000L;
            while ((answer = sched.lookup("r", h, 3 * BLOCK + 1, 0)) == SchedulerSide.NOT_YET) {
                assertThat(System.nanoTime()).isLessThan(deadline);
                Thread.sleep(1);
            }
            assertThat(answer).isEqualTo(3 * BLOCK);
            assertThat(sched.notYetAnswers()).isGreaterThanOrEqualTo(1);
            sched.requestFinished("r");
        }
    }

    @Test
    void aReadBackThatTakesTooLongIsRecomputed(@TempDir Path dir) throws Exception {
        BlockHashes h = hashes(2);
        try (PegaEngine first = ssdEngine(dir)) {
            fill(0);
            fill(1);
            first.save("vllm", 0, ids(0, 2), h).join();
            assertThat(first.ssd().awaitWritten(10_000)).isTrue();
        }
        try (PegaEngine restarted = ssdEngine(dir)) {
            sched.maxWait(Duration.ZERO);
            assertThat(sched.lookup("slow", h, 2 * BLOCK + 1, 0)).as("no waiting allowed: recompute").isZero();
            assertThat(sched.waitTimeouts()).isEqualTo(1);
            assertThat(sched.lookup("slow", h, 2 * BLOCK + 1, 0)).as("and no more hits for it").isZero();
        }
    }

    @Test
    void aStoreFailureIsAMissNeverAnException() {
        engine.close();
        assertThat(sched.lookup("x", hashes(3), 3 * BLOCK + 1, 0)).isZero();
        assertThat(sched.lookupFailures()).isEqualTo(1);
    }

    @Test
    void preemptedRequestsWaitForTheirSavesAndAMismatchedCommitIsRefused() throws Exception {
        BlockHashes h = hashes(2);
        runCold("a", h, 2 * BLOCK + 1, 0);
        sched.preempted("a");
        byte[] plan = sched.buildPlan();
        assertThat(StepPlan.decode(plan).preempted()).containsExactly("a");
        worker.awaitPreempted(plan);
        assertThat(engine.stats().get(Gauge.RESIDENT_BLOCKS)).as("the save finished before the blocks were reused").isEqualTo(2);
        // vLLM commits to 16 external tokens after the lookup offered 32: never thrown into
        // vLLM; the request gets a load that fails on its target block, so vLLM recomputes it.
        assertThat(sched.lookup("b", h, 2 * BLOCK + 1, 0)).isEqualTo(2 * BLOCK);
        long[] table = ids(0, 3);
        sched.afterAlloc("b", table, BLOCK);
        assertThat(sched.contractViolations()).isEqualTo(1);
        byte[] bad = sched.buildPlan();
        assertThat(StepPlan.decode(bad).loads()).singleElement().satisfies(l -> assertThat(l.blockIds()).containsExactly(table[0]));
        worker.startLoads(bad);
        assertThat(recvingAfter(List.of(), new ArrayList<>())).containsExactly("b");
        assertThat(worker.drainLoadErrors()).containsExactly(table[0]);
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).as("the offered lease was released").isZero();
    }

    @Test
    void withoutAnEngineLookupsMissAndPlannedLoadsFailUntilItIsBack() throws Exception {
        BlockHashes h = storedTwoBlocks();
        assertThat(sched.lookup("b", h, 2 * BLOCK + 1, 0)).isEqualTo(2 * BLOCK);
        sched.afterAlloc("b", ids(40, 3), 2 * BLOCK);
        byte[] plan = sched.buildPlan();
        // the server went away between the plan and the load (the link detached: same generation)
        bound.set(new EngineSource.Binding(null, 1));
        assertThat(sched.lookup("c", h, 2 * BLOCK + 1, 0)).as("no store: a miss").isZero();
        worker.startLoads(plan);
        assertThat(worker.getFinished(List.of()).recving()).containsExactly("b");
        assertThat(worker.drainLoadErrors()).containsExactly(40, 41);
        // it came back
        bound.set(new EngineSource.Binding(engine, 1));
        assertThat(sched.lookup("c", h, 2 * BLOCK + 1, 0)).isEqualTo(2 * BLOCK);
    }

    @Test
    void aPreemptedRequestAbortedWhileReloadingIsNotHeldForOldSaves() throws Exception {
        BlockHashes h = hashes(2);
        runCold("a", h, 2 * BLOCK + 1, 0); // saves 2 blocks
        sched.preempted("a");
        byte[] plan = sched.buildPlan();
        worker.awaitPreempted(plan); // its saves finished and are forgotten
        // resumed with a store hit, then aborted while the load runs
        assertThat(sched.lookup("a", h, 2 * BLOCK + 1, 0)).isEqualTo(2 * BLOCK);
        sched.afterAlloc("a", ids(30, 3), 2 * BLOCK);
        assertThat(sched.requestFinished("a")).as("vLLM waits for finished_recving itself").isFalse();
        byte[] load = sched.buildPlan();
        assertThat(StepPlan.decode(load).loads()).as("the committed load still goes out").hasSize(1);
        worker.startLoads(load);
        List<String> sent = new ArrayList<>();
        List<String> recving = recvingAfter(List.of("a"), sent);
        assertThat(sent).as("no finished_sending for a request vLLM does not hold").isEmpty();
        assertThat(recving).containsExactly("a");
        sched.finished(List.of(), recving);
        assertThat(sched.trackedRequests()).isZero();
    }

    @Test
    void aRequestWhoseLoadFailedIsNotOfferedHitsAgain() throws Exception {
        BlockHashes h = storedTwoBlocks();
        assertThat(sched.lookup("b", h, 2 * BLOCK + 1, 0)).isEqualTo(2 * BLOCK);
        sched.afterAlloc("b", ids(40, 3), 2 * BLOCK);
        sched.buildPlan();
        sched.failedBlocks(new long[] {40});
        sched.finished(List.of(), List.of("b"));
        assertThat(sched.loadFailures()).isEqualTo(1);
        assertThat(sched.lookup("b", h, 2 * BLOCK + 1, 0)).as("recompute, no retry loop").isZero();
        assertThat(sched.lookup("c", h, 2 * BLOCK + 1, 0)).as("other requests still hit").isEqualTo(2 * BLOCK);
    }

    @Test
    void aRepeatedLookupIsAnsweredFromItsProbeOnlyForExactlyTheSameHashes() throws Exception {
        BlockHashes h = storedTwoBlocks();
        assertThat(sched.lookup("b", h, 2 * BLOCK + 1, 0)).isEqualTo(2 * BLOCK);
        // Same first and last byte of every hash, one byte in the middle differs: another
        // prefix (the old memo key, built from those two bytes, collided here).
        byte[] other = h.packed().clone();
        other[16] ^= 0x5a;
        other[32 + 16] ^= 0x5a;
        long queries = engine.stats().get(Counter.QUERY_REQUESTS);
        assertThat(sched.lookup("b", new BlockHashes(other, 32), 2 * BLOCK + 1, 0)).as("not stored: a miss").isZero();
        assertThat(engine.stats().get(Counter.QUERY_REQUESTS)).as("asked the store again").isEqualTo(queries + 1);
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).as("the first probe's lease was released").isZero();
        assertThat(sched.lookup("b", h, 2 * BLOCK + 1, 0)).isEqualTo(2 * BLOCK);
        assertThat(sched.lookup("b", h, 2 * BLOCK + 1, 0)).isEqualTo(2 * BLOCK);
        assertThat(engine.stats().get(Counter.QUERY_REQUESTS)).as("the same hashes: answered from the probe")
                .isEqualTo(queries + 2);
    }

    @Test
    void aProbeWhoseBegunLoadAgedPastHalfItsHoldIsLookedUpAgain() throws Exception {
        engine.close();
        // the plan's hold is the copy TTL when shorter than 10 s: 400 ms, so a probe is fresh for 200
        bind(EngineConfig.builder().poolSize("8mb").sweepInterval(Duration.ZERO).leaseTtl(Duration.ofSeconds(30))
                .copyTtl(Duration.ofMillis(400)), 2);
        BlockHashes h = storedTwoBlocks();
        assertThat(sched.lookup("b", h, 2 * BLOCK + 1, 0)).isEqualTo(2 * BLOCK);
        long queries = engine.stats().get(Counter.QUERY_REQUESTS);
        assertThat(sched.lookup("b", h, 2 * BLOCK + 1, 0)).isEqualTo(2 * BLOCK);
        assertThat(engine.stats().get(Counter.QUERY_REQUESTS)).as("fresh: answered from the probe").isEqualTo(queries);
        Thread.sleep(250);
        assertThat(sched.lookup("b", h, 2 * BLOCK + 1, 0)).isEqualTo(2 * BLOCK);
        assertThat(engine.stats().get(Counter.QUERY_REQUESTS)).as("past half the hold: looked up again").isEqualTo(queries + 1);
        sched.afterAlloc("b", ids(20, 3), 2 * BLOCK);
        worker.startLoads(sched.buildPlan());
        assertThat(recvingAfter(List.of(), new ArrayList<>())).containsExactly("b");
        assertThat(worker.drainLoadErrors()).as("the new lookup's load, within its hold").isEmpty();
        engine.flush(10_000);
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).as("the old begun load was rolled back").isZero();
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).isZero();
    }

    @Test
    void aProbeFromAnEarlierGenerationIsNotReused() throws Exception {
        BlockHashes h = storedTwoBlocks();
        assertThat(sched.lookup("b", h, 2 * BLOCK + 1, 0)).isEqualTo(2 * BLOCK);
        long queries = engine.stats().get(Counter.QUERY_REQUESTS);
        bound.set(new EngineSource.Binding(engine, 2)); // the link replaced its engine
        assertThat(sched.lookup("b", h, 2 * BLOCK + 1, 0)).isEqualTo(2 * BLOCK);
        assertThat(engine.stats().get(Counter.QUERY_REQUESTS)).as("looked up again").isEqualTo(queries + 1);
        sched.afterAlloc("b", ids(30, 3), 0); // releases the new probe
        assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).as("the old probe was released where it was issued")
                .isZero();
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).isZero();
    }
}
