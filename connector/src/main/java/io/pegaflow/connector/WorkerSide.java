package io.pegaflow.connector;

import io.pegaflow.engine.CopyResult;
import io.pegaflow.engine.EngineSource;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.LayeredLoad;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.PegaflowException;
import io.pegaflow.engine.ServerUnavailableException;
import io.pegaflow.engine.TransferFailedException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicLongArray;

/**
 * The worker-side connector's brain (one per vLLM worker, i.e. per TP rank): starts the
 * step's loads before the forward pass, submits its saves after it (saves go out per step
 * from scheduler metadata, not from per-layer hooks, so FULL CUDA graphs lose nothing), and
 * tells vLLM which requests finished loading and which finished requests' saves are done.
 * Failed loads are reported block by block so vLLM recomputes them; failed saves only lose
 * cache. The engine comes from an {@link EngineSource} at each operation (none: loads fail,
 * saves are skipped). Calls come from the worker's one thread, copies complete on the
 * engine's. vLLM hands the same step plan to three hooks; it is decoded once.
 */
public final class WorkerSide {
    private final EngineSource source;
    private byte[] lastPlanBytes;
    private StepPlan lastPlan;
    private final List<CacheGroup> groups;
    private final int workerRank;
    /** A request's loads in flight, one per KV-cache group, with their destination blocks. */
    private final Map<String, List<PendingLoad>> loads = new HashMap<>();
    private final Map<String, List<CompletableFuture<CopyResult>>> saves = new HashMap<>();
    private final Set<String> finishedByVllm = new LinkedHashSet<>();
    private final Set<Long> loadErrors = new LinkedHashSet<>();
    private long saveFailures;
    /** Since the last {@link #drainStats}, indexed by the {@code STAT_*} constants (copy threads add). */
    private final AtomicLongArray stats = new AtomicLongArray(STAT_COUNT);
    /**
     * Starts loads off vLLM's thread, in plan order: starting one asks the store for a copy
     * plan, which in server mode is a round trip to pegaflow-server, and vLLM's {@code
     * start_load_kv} runs on its critical path (docs/connector.md, "Modes, failures, restarts",
     * says what it cost).
     */
    private final ExecutorService starter = daemon("pegaflow-copy-start");
    /**
     * Starts saves off vLLM's thread, in plan order, on a thread of their own so a large save's
     * plan never delays the next step's in-step load. {@code wait_for_save} runs before the
     * step's tokens are returned: planning a save there (a round trip in server mode, then every
     * piece's descriptor) delayed each cold request's first token and every decode step that
     * saved. A CUDA save started here is ordered after what the caller's stream holds when it is
     * submitted, which includes everything queued before {@code wait_for_save} returned (the
     * forward that wrote the blocks) and perhaps later work: waiting for more is safe, the saved
     * blocks do not change until vLLM frees them, which it does only once the save is reported
     * (or, for a preempted request, once {@link #awaitPreempted} waited for it; saves that must
     * end within their step are joined in {@link #submitSaves} while vLLM's thread waits). A
     * shared stream means the same on any thread of the process; the calling thread's own
     * per-thread stream ({@link #CU_STREAM_PER_THREAD}) does not, so such a save starts on the
     * caller's thread.
     */
    private final ExecutorService saver = daemon("pegaflow-save-start");
    /** The CUDA driver's handle of the calling thread's own default stream (cuda.h). */
    static final long CU_STREAM_PER_THREAD = 2;

    private static ExecutorService daemon(String name) {
        return Executors.newSingleThreadExecutor(r -> {
            Thread t = new Thread(r, name);
            t.setDaemon(true);
            return t;
        });
    }

    /**
     * {@link #drainStats} order: blocks and bytes loaded, saved; blocks whose load failed; saves
     * failed; then the phases of in-step loads: how many, nanoseconds from their start until their
     * copies were submitted (the plan: a round trip in server mode, and the batches' enqueue),
     * until every byte landed and the load ended (seen by the copy's completion), that vLLM's
     * thread spent waiting for the submission in {@code wait_for_layer_load} (the GPU-side waits
     * cost it nothing), and until the step's {@code get_finished} (the step's forward as this
     * worker sees it); then two parts of the plan: from the start until the plan's thread took
     * the load up (a thread hop), and from there until the store's plan returned (the rest of
     * the plan phase is the batches' enqueue); then how many in-step loads started when the
     * scheduler allocated their blocks ({@link #startAtAlloc}), their phases timed from there;
     * then two more parts of the plan: listing the copy batches' pieces, and handing them to the
     * copy engine ({@link LayeredLoad#buildNanos}, {@link LayeredLoad#submitNanos}); then, counted
     * when the load landed, from its start until the copy engine queued its first copy ({@link
     * LayeredLoad#firstCopyNanos}: what passes before PCIe moves a byte of it).
     */
    public static final int STAT_LOADED_BLOCKS = 0, STAT_LOADED_BYTES = 1, STAT_SAVED_BLOCKS = 2, STAT_SAVED_BYTES = 3,
            STAT_LOAD_FAILED_BLOCKS = 4, STAT_SAVE_FAILURES = 5, STAT_IN_STEP_LOADS = 6, STAT_IN_STEP_PLAN_NANOS = 7,
            STAT_IN_STEP_LOAD_NANOS = 8, STAT_IN_STEP_WAIT_NANOS = 9, STAT_IN_STEP_STEP_NANOS = 10,
            STAT_IN_STEP_HOP_NANOS = 11, STAT_IN_STEP_STORE_NANOS = 12, STAT_IN_STEP_AT_ALLOC = 13,
            STAT_IN_STEP_BUILD_NANOS = 14, STAT_IN_STEP_SUBMIT_NANOS = 15, STAT_IN_STEP_FIRST_COPY_NANOS = 16,
            STAT_LOADS_STAGED = 17, STAT_COUNT = 18;

    private record PendingLoad(CompletableFuture<CopyResult> future, long[] targets) {}

    /** A load inside this step: its submission (a store round trip in server mode, off vLLM's thread) and targets. */
    private record StepLoad(String requestId, CompletableFuture<LayeredLoad> started,
            CompletableFuture<CopyResult> landed, long[] targets, long startNanos) {}

    /** This step's in-step loads; ended (their failures recorded) by {@link #getFinished}. */
    private final List<StepLoad> stepLoads = new ArrayList<>();
    /**
     * In-step loads of earlier steps whose step went on without waiting for their last bytes
     * ({@link #endStepLoads}): ended by a later {@link #getFinished} once landed.
     */
    private final List<StepLoad> landing = new ArrayList<>();

    /**
     * The worker of each store instance in this process (the newest created here): where a
     * scheduler side in the same process (vLLM's engine core with the worker in-process) starts
     * in-step loads when it allocates their blocks ({@link #startAtAlloc}).
     */
    private static final Map<String, WorkerSide> COLOCATED = new java.util.concurrent.ConcurrentHashMap<>();
    /** A load started at allocation; its copies wait for {@code go}, which the step (or the end) completes. */
    private record Early(StepPlan.Load load, CompletableFuture<LayeredLoad> started, long startNanos,
            CompletableFuture<Void> go) {
        /** Lets the copies go (again: no effect); the load as started. */
        CompletableFuture<LayeredLoad> open() {
            go.complete(null);
            return started;
        }
    }
    /** In-step loads started at allocation, by request and group, until the step's plan claims them. */
    private final Map<String, Early> early = new java.util.concurrent.ConcurrentHashMap<>();
    /** Set by {@link #shutdown}: no load starts at allocation any more. */
    private volatile boolean closed;
    /** Loads started at allocation waiting for their step at most (more are started with their step). */
    static final int MAX_EARLY = 1024;

    public WorkerSide(EngineSource source, String instanceId, int workerRank) {
        this(source, List.of(CacheGroup.full(instanceId)), workerRank);
    }

    /** A worker of a model with {@code groups} (vLLM's KV-cache groups, in vLLM's order; the scheduler side's). */
    public WorkerSide(EngineSource source, List<CacheGroup> groups, int workerRank) {
        if (source == null) {
            throw new InvalidArgumentException("engine source is null; expected the store link");
        }
        if (groups == null || groups.isEmpty() || groups.size() > SchedulerSide.MAX_GROUPS) {
            throw new InvalidArgumentException((groups == null ? 0 : groups.size()) + " KV-cache groups; expected 1 to "
                    + SchedulerSide.MAX_GROUPS);
        }
        this.source = source;
        this.groups = List.copyOf(groups);
        this.workerRank = workerRank;
        COLOCATED.put(this.groups.get(0).instanceId(), this); // the newest (a restarted connector's)
    }

    /** This worker's rank in its instance. */
    int workerRank() {
        return workerRank;
    }

    /** The worker of store instance {@code instanceId} in this process, or null. */
    static WorkerSide colocated(String instanceId) {
        return COLOCATED.get(instanceId);
    }

    /**
     * Starts in-step loads where the scheduler allocated their blocks, before the step that
     * uses them: the store plans each and the engine lists its copies while vLLM schedules and
     * prepares the step's inputs, and the copies are queued on the GPU once the step starts
     * ({@link #startLoads}, after vLLM's thread saw the compute stream's earlier work done). Queued
     * at once, a load held the step's input copies behind it on the copy engine, and with them
     * the forward (docs/gpu.md, "Loads started at allocation"). The blocks are the request's own
     * from allocation on: no forward reads them before this load's layers land, which the step's {@code
     * wait_for_layer_load} waits for as for a load started in the step. The step's {@link
     * #startLoads} claims each by request and group; a load started here with other blocks than
     * the plan's (never expected) is waited for and the plan's blocks are reported as failed (its
     * lease share is used; vLLM recomputes them).
     *
     * <p>Assumes what vLLM's synchronous scheduling gives: a block it allocates has no forward
     * or copy of the previous steps still reading or writing it (a finished or preempted
     * request's blocks are freed only once its saves were reported). The Python connector turns
     * this off under asynchronous scheduling, where the previous step's forward may still run.
     */
    void startAtAlloc(List<StepPlan.Load> loads) {
        for (StepPlan.Load l : loads) {
            if (!l.inStep() || early.size() >= MAX_EARLY || closed) {
                continue;
            }
            String key = l.requestId() + "\u0000" + l.group();
            if (!early.containsKey(key)) { // vLLM allocates on its scheduler thread, before the step's plan
                long t0 = System.nanoTime();
                CompletableFuture<Void> go = new CompletableFuture<>();
                Early e = new Early(l, startInStep(l, t0, go), t0, go);
                early.put(key, e);
                if (closed) {
                    e.open(); // shutdown ran meanwhile and opened the others: this one must not hold its lane
                }
            }
        }
    }

    /** Loads started at allocation whose step never came (the request was aborted) and that landed long ago. */
    private void dropStaleEarly() {
        long now = System.nanoTime();
        early.values().removeIf(e -> now - e.startNanos() > 60_000_000_000L && e.started().thenCompose(LayeredLoad::result).isDone());
    }

    /** The store instance of the plan's group {@code group}. */
    private String instance(int group, String requestId) {
        if (group < 0 || group >= groups.size()) {
            throw new InvalidArgumentException("step plan entry of request " + requestId + " for KV-cache group " + group
                    + "; this worker has groups 0 to " + (groups.size() - 1));
        }
        return groups.get(group).instanceId();
    }

    private PegaEngine current(String what) {
        PegaEngine e = source.binding().engine();
        if (e == null) {
            throw new ServerUnavailableException(what + ": not connected to a store", null);
        }
        return e;
    }

    /** The step's plan, decoded once for the hooks that pass the same bytes. */
    private StepPlan plan(byte[] bytes) {
        if (lastPlan == null || !java.util.Arrays.equals(bytes, lastPlanBytes)) {
            lastPlan = StepPlan.decode(bytes);
            lastPlanBytes = bytes;
        }
        return lastPlan;
    }

    /**
     * {@code start_load_kv}: starts every load of the plan and returns how many run inside this
     * step (their layers are waited for by {@link #waitLayer}, their end by the step's {@link
     * #getFinished}); the others are asynchronous and reported by {@link #getFinished}.
     */
    public int startLoads(byte[] plan) {
        endStepLoads(); // a step whose get_finished was not called (vLLM always calls it)
        // the step has begun (its inputs are on the GPU): every load started at allocation may
        // go, before any wait below, since a held load keeps a copy lane another may need
        early.values().forEach(Early::open);
        for (StepPlan.Load l : plan(plan).loads()) {
            if (l.inStep()) {
                long t0 = System.nanoTime();
                Early e = early.remove(l.requestId() + "\u0000" + l.group());
                CompletableFuture<LayeredLoad> started;
                if (e != null && java.util.Arrays.equals(e.load().blockIds(), l.blockIds())) {
                    started = e.started();
                    t0 = e.startNanos();
                    stats.incrementAndGet(STAT_IN_STEP_AT_ALLOC);
                } else {
                    if (e != null) {
                        // not the plan's blocks (never expected): it used this worker's share of the
                        // lease, so the plan's blocks cannot load now; let it land (it writes into its
                        // blocks), then report the plan's as failed (vLLM recomputes them)
                        e.started().thenCompose(LayeredLoad::result).handle((r, x) -> null).join();
                        started = CompletableFuture.failedFuture(new InvalidArgumentException("in-step load of request "
                                + l.requestId() + " was started at allocation into other blocks than its step's plan"));
                    } else {
                        started = startInStep(l, t0, null);
                    }
                }
                long from = t0;
                // timed where the bytes land (the copy's completion), not where the step ends
                CompletableFuture<CopyResult> landed = started.thenCompose(h -> h.result().thenApply(r -> {
                    count(STAT_LOADED_BLOCKS, STAT_LOADED_BYTES, r); // here, not in a later step: the engine may go idle
                    stats.addAndGet(STAT_IN_STEP_LOAD_NANOS, System.nanoTime() - from);
                    long first = h.firstCopyNanos();
                    if (first != 0) {
                        stats.addAndGet(STAT_IN_STEP_FIRST_COPY_NANOS, Math.max(0, first - from));
                    }
                    return r;
                }));
                stepLoads.add(new StepLoad(l.requestId(), started, landed, l.blockIds(), from));
                stats.incrementAndGet(STAT_IN_STEP_LOADS);
                continue;
            }
            CompletableFuture<CopyResult> f = startLoad(l);
            int targets = l.blockIds().length;
            f.whenComplete((r, e) -> {
                if (e == null) {
                    count(STAT_LOADED_BLOCKS, STAT_LOADED_BYTES, r);
                } else {
                    Throwable cause = e instanceof CompletionException ce && ce.getCause() != null ? ce.getCause() : e;
                    stats.addAndGet(STAT_LOAD_FAILED_BLOCKS,
                            cause instanceof TransferFailedException tf ? tf.blockIds().length : targets);
                }
            });
            loads.computeIfAbsent(l.requestId(), k -> new ArrayList<>()).add(new PendingLoad(f, l.blockIds()));
        }
        if (!early.isEmpty()) {
            dropStaleEarly(); // started at allocation, never claimed (never expected: vLLM runs the step it allocated for)
        }
        return stepLoads.size();
    }

    /**
     * {@code wait_for_layer_load}: orders CUDA stream {@code stream} (0: blocks this thread;
     * the legacy default stream is {@code CU_STREAM_LEGACY}, 1)
     * after registered region {@code layer}'s bytes of every in-step load of the step. Blocks
     * only until each load's copies of the layer were queued; a load that could not start is skipped here and
     * reported by {@link #getFinished} (vLLM then discards the step's output for its request).
     */
    public void waitLayer(int layer, long stream) {
        for (StepLoad s : stepLoads) {
            long t0 = System.nanoTime();
            try {
                s.started().join().awaitLayer(layer, stream); // blocks until the layer's copies are queued
            } catch (CompletionException | java.util.concurrent.CancellationException failed) {
                continue;
            } finally {
                stats.addAndGet(STAT_IN_STEP_WAIT_NANOS, System.nanoTime() - t0);
            }
        }
    }

    /** {@code go}: the copies wait for it (a load started at allocation); null: they go at once. */
    private CompletableFuture<LayeredLoad> startInStep(StepPlan.Load l, long t0, CompletableFuture<Void> go) {
        try {
            PegaEngine e = current("load of request " + l.requestId());
            String instanceId = instance(l.group(), l.requestId());
            return CompletableFuture.supplyAsync(() -> {
                long began = System.nanoTime();
                try {
                    LayeredLoad h = e.loadLayered(instanceId, workerRank, l.lease(), l.blockIds(), go);
                    stats.addAndGet(STAT_IN_STEP_HOP_NANOS, began - t0);
                    stats.addAndGet(STAT_IN_STEP_STORE_NANOS, Math.max(0, h.plannedNanos() - began));
                    stats.addAndGet(STAT_IN_STEP_BUILD_NANOS, h.buildNanos());
                    stats.addAndGet(STAT_IN_STEP_SUBMIT_NANOS, h.submitNanos());
                    if (h.fromStage()) {
                        stats.incrementAndGet(STAT_LOADS_STAGED);
                    }
                    stats.addAndGet(STAT_IN_STEP_PLAN_NANOS, System.nanoTime() - t0); // before anyone waiting sees it
                    return h;
                } catch (RuntimeException refused) {
                    releaseRefused(e, instanceId, l.lease());
                    throw refused;
                }
            }, starter);
        } catch (PegaflowException e) {
            return CompletableFuture.failedFuture(e);
        }
    }

    /**
     * A load the store refused before it took this worker's share of the lease: the lease is
     * dropped at once (else its blocks stay pinned until its TTL); the request recomputes anyway.
     */
    private static void releaseRefused(PegaEngine e, String instanceId, io.pegaflow.engine.Token lease) {
        if (lease == null || lease == SchedulerSide.NO_LEASE) {
            return;
        }
        try {
            e.release(instanceId, lease);
        } catch (RuntimeException ignored) {
            // already consumed, expired or the server is gone: nothing stays pinned by it
        }
    }

    /**
     * The step's forward is queued (its layers wait for their bytes): each in-step load's result,
     * a failure as load errors of this step. A load whose every copy is queued on the GPU, each
     * layer behind an event the forward's stream waits on ({@link LayeredLoad#queuedOnDevice}),
     * is not waited for: vLLM's thread goes on to queue the step's logits and sampling behind the
     * forward (and, under vLLM's asynchronous scheduling, to schedule the next step) instead of
     * standing still until the last byte landed; a later call ends it ({@link #endLanded}). What could still fail there is
     * the device itself (a sticky CUDA error), which fails the step's own output copy too, so no
     * token computed from bytes that did not land leaves the step. Any other load is waited for,
     * so its failure is this step's.
     */
    private void endStepLoads() {
        for (StepLoad s : stepLoads) {
            if (!s.landed().isDone() && s.started().isDone() && !s.started().isCompletedExceptionally()
                    && s.started().join().queuedOnDevice()) {
                stats.addAndGet(STAT_IN_STEP_STEP_NANOS, System.nanoTime() - s.startNanos());
                landing.add(s);
                continue;
            }
            if (end(s)) { // waits for the bytes
                stats.addAndGet(STAT_IN_STEP_STEP_NANOS, System.nanoTime() - s.startNanos());
            }
        }
        stepLoads.clear();
    }

    /**
     * Ends the loads of earlier steps that {@link #endStepLoads} left landing and that have
     * landed since; a failure there (never expected: the device failed after every copy was
     * queued) is reported as load errors now, its request in {@code failedRequests}, and logged.
     */
    private void endLanded(List<String> failedRequests) {
        for (var it = landing.iterator(); it.hasNext(); ) {
            StepLoad s = it.next();
            if (!s.landed().isDone()) {
                continue;
            }
            it.remove();
            if (!end(s)) {
                failedRequests.add(s.requestId());
                System.getLogger(WorkerSide.class.getName()).log(System.Logger.Level.WARNING, "in-step load of request "
                        + s.requestId() + " failed after its step's forward was queued behind it; its blocks are "
                        + "reported as load errors now: " + s.landed().handle((r, e) -> e).join());
            }
        }
    }

    /**
     * Waits for an in-step load to land and records its failure as load errors (its bytes were
     * counted as they landed); whether it succeeded.
     */
    private boolean end(StepLoad s) {
        try {
            s.landed().join();
            return true;
        } catch (CompletionException | java.util.concurrent.CancellationException failed) {
            Throwable cause = failed.getCause();
            long[] ids = cause instanceof TransferFailedException tf ? tf.blockIds() : s.targets();
            stats.addAndGet(STAT_LOAD_FAILED_BLOCKS, ids.length);
            for (long id : ids) {
                loadErrors.add(id);
            }
            return false;
        }
    }

    /**
     * {@code wait_for_save}: submit the plan's saves, ordered after the work already queued on
     * CUDA stream {@code stream} (0: none, or host copies). Returns at once, unless the plan
     * saves blocks of sliding-window or recurrent groups: vLLM frees those before the request
     * ends (outside the window, or an older state) and may reuse them in the next step, so
     * their copies finish first.
     */
    public void submitSaves(byte[] plan, long stream) {
        List<CompletableFuture<CopyResult>> withinStep = new ArrayList<>();
        for (StepPlan.Save s : plan(plan).saves()) {
            CompletableFuture<CopyResult> f = startSave(s, stream);
            if (s.group() >= 0 && s.group() < groups.size() && groups.get(s.group()).savesWithinStep()) {
                withinStep.add(f);
            }
            f.whenComplete((r, e) -> {
                if (e == null) {
                    count(STAT_SAVED_BLOCKS, STAT_SAVED_BYTES, r);
                } else {
                    stats.incrementAndGet(STAT_SAVE_FAILURES);
                }
            });
            saves.computeIfAbsent(s.requestId(), k -> new ArrayList<>()).add(f);
        }
        for (CompletableFuture<CopyResult> f : withinStep) {
            f.handle((r, e) -> null).join(); // a failure only loses cache (counted above)
        }
    }

    /** The engine is read on the caller's thread (the one bound for this step); the store call runs on {@link #starter}. */
    private CompletableFuture<CopyResult> startLoad(StepPlan.Load l) {
        try {
            PegaEngine e = current("load of request " + l.requestId());
            String instanceId = instance(l.group(), l.requestId());
            return CompletableFuture.supplyAsync(() -> {
                        try {
                            if (e.staged(l.lease())) {
                                // layer by layer: a load whose lookup staged its pool side reads the staging so
                                LayeredLoad h = e.loadLayered(instanceId, workerRank, l.lease(), l.blockIds());
                                if (h.fromStage()) {
                                    stats.incrementAndGet(STAT_LOADS_STAGED);
                                }
                                return h.result();
                            }
                            return e.load(instanceId, workerRank, l.lease(), l.blockIds());
                        } catch (RuntimeException refused) {
                            releaseRefused(e, instanceId, l.lease());
                            throw refused;
                        }
                    }, starter)
                    .thenCompose(x -> x)
                    .exceptionallyCompose(t -> {
                        Throwable cause = t instanceof CompletionException && t.getCause() != null ? t.getCause() : t;
                        return CompletableFuture.failedFuture(cause instanceof TransferFailedException ? cause
                                : new TransferFailedException("load of request " + l.requestId() + " could not start: "
                                        + cause.getMessage(), l.blockIds(), cause));
                    });
        } catch (PegaflowException e) {
            return CompletableFuture.failedFuture(new TransferFailedException("load of request " + l.requestId()
                    + " could not start: " + e.getMessage(), l.blockIds(), e));
        }
    }

    private CompletableFuture<CopyResult> startSave(StepPlan.Save s, long stream) {
        try {
            PegaEngine e = current("save of request " + s.requestId());
            String instanceId = instance(s.group(), s.requestId());
            if (stream == CU_STREAM_PER_THREAD) {
                // the caller's own per-thread stream means nothing on the save thread: ordered here
                return e.save(instanceId, workerRank, null, s.blockIds(), s.hashes(), stream);
            }
            return CompletableFuture.supplyAsync(() -> e.save(instanceId, workerRank, null, s.blockIds(), s.hashes(), stream),
                    saver).thenCompose(x -> x);
        } catch (PegaflowException e) {
            return CompletableFuture.failedFuture(e);
        }
    }

    /**
     * {@code handle_preemptions}: waits until the saves of the plan's preempted requests no
     * longer read their GPU blocks, which vLLM is about to reuse.
     */
    public void awaitPreempted(byte[] plan) {
        for (String id : plan(plan).preempted()) {
            // done with them: the scheduler holds blocks only for saves after a resume
            for (CompletableFuture<CopyResult> f : saves.getOrDefault(id, List.of())) {
                f.handle((r, e) -> null).join();
                if (f.isCompletedExceptionally()) {
                    saveFailures++;
                }
            }
            saves.remove(id);
        }
    }

    /** Result of {@link #getFinished}: {@code failed} are requests of {@code recving} whose load failed in some group. */
    public record Finished(List<String> sending, List<String> recving, List<String> failed) {}

    /**
     * {@code get_finished}: loads that completed (successfully or not: failures are in
     * {@link #drainLoadErrors}) and requests vLLM finished whose saves are all done.
     */
    public Finished getFinished(List<String> finishedRequestIds) {
        List<String> failedLoads = new ArrayList<>();
        endLanded(failedLoads);
        endStepLoads();
        noteFinished(finishedRequestIds);
        List<String> recving = new ArrayList<>();
        for (var it = loads.entrySet().iterator(); it.hasNext(); ) {
            var e = it.next();
            if (e.getValue().stream().allMatch(p -> p.future().isDone())) { // every group's load
                it.remove();
                for (PendingLoad p : e.getValue()) {
                    try {
                        p.future().join();
                    } catch (CompletionException | java.util.concurrent.CancellationException failed) {
                        Throwable cause = failed.getCause();
                        long[] ids = cause instanceof TransferFailedException tf ? tf.blockIds() : p.targets();
                        for (long id : ids) {
                            loadErrors.add(id);
                        }
                        if (failedLoads.isEmpty() || !failedLoads.getLast().equals(e.getKey())) {
                            failedLoads.add(e.getKey());
                        }
                    }
                }
                recving.add(e.getKey());
            }
        }
        List<String> sending = new ArrayList<>();
        for (var it = finishedByVllm.iterator(); it.hasNext(); ) {
            String id = it.next();
            List<CompletableFuture<CopyResult>> pending = saves.get(id);
            if (pending == null) {
                it.remove(); // no saves: the scheduler did not hold its blocks
                continue;
            }
            if (pending.stream().allMatch(CompletableFuture::isDone)) {
                for (CompletableFuture<CopyResult> f : pending) {
                    if (f.isCompletedExceptionally()) {
                        saveFailures++;
                    }
                }
                saves.remove(id);
                it.remove();
                sending.add(id);
            }
        }
        return new Finished(sending, recving, failedLoads);
    }

    /**
     * Whether a later {@link #getFinished} without new finished requests can report nothing: no
     * in-step load of a step or still landing, no load in flight, no request vLLM finished whose saves are still
     * to be reported. The Python worker then skips that call on the steps after, until it starts
     * loads or vLLM finishes a request (a call into the JVM inside vLLM's step costs far more than
     * outside one: docs/benchmarks/README.md, "Calls into the JVM per step").
     */
    public boolean idle() {
        return stepLoads.isEmpty() && landing.isEmpty() && loads.isEmpty() && finishedByVllm.isEmpty();
    }

    /** Records requests vLLM finished, whose saves {@link #getFinished} reports once done. */
    public void noteFinished(List<String> finishedRequestIds) {
        finishedByVllm.addAll(finishedRequestIds);
    }

    /** {@code get_block_ids_with_load_errors}: block ids whose load failed since the last call. */
    public long[] drainLoadErrors() {
        long[] out = loadErrors.stream().mapToLong(Long::longValue).toArray();
        loadErrors.clear();
        return out;
    }

    private void count(int blocksIndex, int bytesIndex, CopyResult r) {
        if (r != null) {
            stats.addAndGet(blocksIndex, r.blocks());
            stats.addAndGet(bytesIndex, r.bytes());
        }
    }

    /**
     * Counters since the last call, in {@code STAT_*} order (vLLM's connector stats: the
     * worker reports them each step and vLLM sums them over workers and intervals).
     */
    public long[] drainStats() {
        long[] out = new long[STAT_COUNT];
        for (int i = 0; i < STAT_COUNT; i++) {
            out[i] = stats.getAndSet(i, 0);
        }
        return out;
    }

    public long saveFailures() {
        return saveFailures;
    }

    /** Waits for every load and save in flight (connector shutdown). */
    public void shutdown() {
        closed = true;
        COLOCATED.remove(groups.get(0).instanceId(), this);
        endStepLoads();
        early.values().forEach(Early::open); // all first: a held load keeps a copy lane another may need
        for (Early e : early.values()) {
            e.started().thenCompose(LayeredLoad::result).handle((r, x) -> null).join();
        }
        early.clear();
        Set<CompletableFuture<?>> all = new HashSet<>();
        loads.values().forEach(l -> l.forEach(p -> all.add(p.future())));
        saves.values().forEach(all::addAll);
        for (CompletableFuture<?> f : all) {
            f.handle((r, e) -> null).join();
        }
        starter.shutdown();
        saver.shutdown();
    }
}
