package io.pegaflow.connector;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.CopyPlan;
import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.EngineSource;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.ScratchServers;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.store.LocalStore;
import io.pegaflow.engine.transfer.HostTransferEngine;
import io.pegaflow.engine.transfer.Stager;
import io.pegaflow.engine.transfer.TransferEngine;
import java.lang.foreign.Arena;
import java.time.Duration;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.Function;

/**
 * Runs a request's path through the connector's brain (the scheduler side's lookup of a stored
 * prefix and of a miss, the allocation hook, the step's plan with its loads and saves, the
 * request's end; the worker side's in-step load of the plan, layer by layer, and its end; and
 * under them the store's query, lease, load plan and release, the plan mostly begun by the
 * lookup as by default, now and then asked for by the load) on a scratch engine of its own,
 * so the JIT has compiled it before vLLM's first requests: in a fresh process those run
 * interpreted or lightly compiled code, on vLLM's scheduling and forward threads, where their
 * time is time to first token
 * ({@code python -m pegaflow.bench.lookupwarm} runs fresh processes with and without it;
 * docs/benchmarks/README.md, "Lookup warm-up"). The server warms its own side at start
 * ({@code io.pegaflow.server.Warmup}); this is the connector's side, and in embedded mode the store's.
 * The scratch engine copies between host memory: the CUDA copy engine warms its own part at
 * creation; the planning above it is shared. The few methods that call into the copy engine
 * see the host engine's classes here, so a GPU's first real load may have the JIT recompile
 * those (not yet measured on a GPU: docs/benchmarks/README.md, "Lookup warm-up").
 *
 * <p>The scratch engine is private: its own small pool (the prefix is sealed by its plan alone,
 * no byte saved; loads copy the pool's untouched pages into scratch memory), its own instance,
 * worker and counters. The real store, its metrics and vLLM's blocks are untouched; the scratch
 * engine is closed at the end. Where the process stages loads at their lookup
 * ({@code PEGAFLOW_PRESTAGE_MIB}), the scratch engine stages its loads too, in a buffer of
 * their size ({@link #scratchStageBytes}). A failure only logs: it is an optimisation.
 *
 * <p>In server mode the process's store calls are a client's (the local socket's frames, the
 * answers parsed, their plans staged), code the embedded scratch engine never runs, and a fresh
 * client's first spaced calls ran several times slower than warm ones (docs/benchmarks/README.md,
 * "A fresh client's first queries"). There the scratch engine is a client of a private
 * pegaflow-server started in this process ({@link ScratchServers}, found through {@link
 * java.util.ServiceLoader}: the server module provides it), on loopback with its own pool file and token
 * in a private directory, stopped at the end; the real server, its metrics and its pool are
 * untouched. Without a provider, or where that server cannot start, the embedded scratch engine
 * runs instead.
 */
public final class LookupWarmUp {
    /** Blocks of the longest chain (a 32K-token prompt of 16-token blocks). */
    static final int BLOCKS = 2048;
    static final int ROUNDS = 400;
    static final long BUDGET_NANOS = 3_000_000_000L;
    private static final String INSTANCE = "pegaflow-lookup-warm-up";
    /** Layers of the scratch worker, each split in K and V as vLLM's per-layer tensors are. */
    private static final int LAYERS = 4;
    private static final long SEGMENT_BYTES = 64;
    private static final long SLOT_BYTES = LAYERS * 2 * SEGMENT_BYTES;
    /** The scratch engine's staging buffer where this process stages loads at their lookup: its largest load's bytes. */
    static final long SCRATCH_STAGE_BYTES = BLOCKS * SLOT_BYTES;
    private static final System.Logger LOG = System.getLogger(LookupWarmUp.class.getName());
    private static final AtomicBoolean STARTED = new AtomicBoolean();
    /** How the process's warm-up ended: its {@link Result}, or what stopped it (null while it runs). */
    static volatile Object outcome;

    private LookupWarmUp() {}

    /**
     * Starts the warm-up on a daemon thread, once per process whatever the number of scheduler
     * sides and workers (the JIT's work is the process's). Returns the thread, or null when it
     * had started. The scheduler side asks for it ({@code sched_create}'s mode bit 16), and so
     * does a worker ({@code warm_up}) for vLLM's workers in processes of their own (several
     * GPUs), whose in-step loads the scheduler's process never warms.
     */
    public static Thread startOnce(int blockSize) {
        return startOnce(blockSize, false);
    }

    /**
     * {@link #startOnce(int)}, for a process whose store link is a server's client when {@code
     * serverMode}: the scratch engine is then a client of a private server ({@link ScratchServers})
     * where this jar provides one.
     */
    public static Thread startOnce(int blockSize, boolean serverMode) {
        if (!STARTED.compareAndSet(false, true)) {
            return null;
        }
        Thread t = new Thread(() -> {
            try {
                Result r = run(blockSize, ROUNDS, BUDGET_NANOS, scratchStageBytes(System.getenv(Stager.ENV)),
                        serverMode ? ScratchServers.provided() : null);
                outcome = r;
                // one line a process: where its warm-up ran says what its first requests' calls had compiled
                LOG.log(System.Logger.Level.INFO, () -> "lookup warm-up: " + r.rounds() + " rounds in "
                        + r.nanos() / 1_000_000 + " ms" + (r.throughServer() ? " as a client of a scratch server"
                                : serverMode ? " on an embedded scratch engine (no scratch server started)"
                                        : " on an embedded scratch engine"));
            } catch (RuntimeException | Error e) {
                outcome = e;
                LOG.log(System.Logger.Level.DEBUG, "lookup warm-up stopped", e);
            }
        }, "pegaflow-lookup-warm-up");
        t.setDaemon(true);
        t.start();
        return t;
    }

    /**
     * Whether this process's warm-up was asked for ({@link #startOnce}); true also where its
     * thread could not be started (it is not tried again: an optimisation only).
     */
    public static boolean started() {
        return STARTED.get();
    }

    /**
     * What a run did: {@code rounds} rounds, {@code loads} in-step loads run by the worker side
     * ({@code atAllocLoads} of them started where their blocks were allocated; {@code
     * loadFailures} failed: 0), {@code loadedBlocks} blocks they copied against {@code
     * expectedLoadedBlocks}, every loaded hit's; {@code hitTokens} what its hit lookups answered
     * against {@code expectedHitTokens}, each round's stored prefix past its computed head (the
     * hit path ran, not only misses); {@code missTokens} what its miss lookups answered (0);
     * the scheduler side's {@code lookupFailures} and {@code contractViolations} (0), and the
     * requests it still {@code tracked} at the end (0: every request's end was taken); {@code
     * stagedLoads} of the loads staged at their lookup (none without a staging buffer); in
     * {@code nanos}.
     */
    public record Result(int rounds, int loads, long atAllocLoads, int loadFailures, long loadedBlocks,
            long expectedLoadedBlocks, long hitTokens, long expectedHitTokens, long missTokens, long lookupFailures,
            long contractViolations, int tracked, long stagedLoads, long nanos, boolean throughServer) {}

    /**
     * The scratch engine's staging buffer for a process whose {@link Stager#ENV} is {@code value}:
     * none where this process does not stage (unset, 0, or a value its own engine refuses, naming
     * it), else {@link #SCRATCH_STAGE_BYTES}, enough for the warm-up's largest load, so the staged
     * path is compiled where it will run without a second buffer of the process's size (host
     * memory the size of a GPU's staging, zeroed on the warm-up's thread, for loads of 1 MiB).
     */
    static long scratchStageBytes(String value) {
        try {
            return Stager.bytesFromEnvironment(value) > 0 ? SCRATCH_STAGE_BYTES : 0;
        } catch (RuntimeException refused) {
            return 0;
        }
    }

    /**
     * Runs up to {@code rounds} rounds within {@code budgetNanos}, here. Each round: a stored
     * prefix of all, 1/2 or 1/4 of {@link #BLOCKS} blocks looked up by a new request (now and
     * then past a computed head, as after vLLM's own prefix hit), allocated, planned as an
     * in-step load (every other one started at allocation, as with {@code load_at_alloc}),
     * loaded by the worker side into other blocks layer by layer, ended; or, every
     * third round, dropped before allocation (the probe's lease released); then a miss looked up,
     * its saves planned (it is new: its whole block table; no worker saves them, so it stays a
     * miss) and ended as a finished save.
     */
    static Result run(int blockSize, int rounds, long budgetNanos, long stageBytes) {
        return run(blockSize, rounds, budgetNanos, stageBytes, null);
    }

    /**
     * {@link #run(int, int, long, long)} on a client of {@code server}'s private server (null:
     * the embedded scratch engine; also where that server cannot start, logged).
     */
    public static Result run(int blockSize, int rounds, long budgetNanos, long stageBytes, ScratchServers server) {
        long start = System.nanoTime();
        Function<HostPool, TransferEngine> transfer = pool -> new HostTransferEngine(pool, 1, stageBytes);
        try (Arena arena = Arena.ofConfined();
                ScratchServers.Client remote = open(server, transfer); // closed after the sides below
                PegaEngine own = remote != null ? null : PegaEngine.create(EngineConfig.builder()
                        .poolBytes(2 * BLOCKS * SLOT_BYTES).sweepInterval(Duration.ZERO).transfer(transfer).build())) {
            PegaEngine engine = remote != null ? remote.engine() : own;
            EngineSource.Binding binding = new EngineSource.Binding(engine, 1);
            SchedulerSide side = new SchedulerSide(() -> binding, INSTANCE, blockSize, true); // checks the block size
            side.inStepLoads(true);
            engine.registerInstance(new InstanceSpec(INSTANCE, INSTANCE, 1, 1));
            // loads write the blocks after the prefix's
            engine.registerWorker(INSTANCE, WorkerSpec.scratch(arena, LAYERS, 2 * BLOCKS, SEGMENT_BYTES));
            WorkerSide worker = new WorkerSide(() -> binding, INSTANCE, 0);
            try {
                return rounds(engine, side, worker, blockSize, rounds, budgetNanos, start);
            } finally {
                try {
                    worker.shutdown(); // leaves this process's registry of co-located workers as it was
                } finally {
                    side.shutdown();
                }
            }
        }
    }

    /** A client of {@code server}'s new private server, or null (none asked for, or it could not start: logged). */
    private static ScratchServers.Client open(ScratchServers server, Function<HostPool, TransferEngine> transfer) {
        if (server == null) {
            return null;
        }
        try {
            return server.open(2 * BLOCKS * SLOT_BYTES, transfer);
        } catch (java.io.IOException | RuntimeException e) {
            LOG.log(System.Logger.Level.DEBUG, "lookup warm-up: no scratch server, warming embedded", e);
            return null;
        }
    }

    private static Result rounds(PegaEngine engine, SchedulerSide side, WorkerSide worker, int blockSize, int rounds,
            long budgetNanos, long start) {
        Random rnd = new Random(1);
        byte[] stored = new byte[BLOCKS * 32];
        byte[] absent = new byte[BLOCKS * 32];
        rnd.nextBytes(stored);
        rnd.nextBytes(absent);
        long[] ids = new long[BLOCKS];
        Arrays.setAll(ids, i -> i);
        LocalStore store = engine.localStore();
        if (store != null) {
            CopyPlan saved = store.reserveSave(INSTANCE, 0, null, ids, new BlockHashes(stored, 32));
            store.endCopy(INSTANCE, saved.id(), true, 0, 0); // sealed by its plan: nothing is read
        } else {
            engine.save(INSTANCE, 0, ids, new BlockHashes(stored, 32)).join(); // a server's client: saved as a worker saves
        }
        // all, 1/2 and 1/4 of the chain, made once: the rounds allocate only what the path does
        BlockHashes[] prefixes = new BlockHashes[3];
        BlockHashes[] misses = new BlockHashes[3];
        long[][] tables = new long[3][];
        long[][] targets = new long[3][];
        for (int k = 0; k < 3; k++) {
            int n = BLOCKS >> k;
            prefixes[k] = new BlockHashes(Arrays.copyOf(stored, n * 32), 32);
            misses[k] = new BlockHashes(Arrays.copyOf(absent, n * 32), 32); // never saved: a save is only planned
            tables[k] = Arrays.copyOf(ids, n);
            targets[k] = new long[n];
            Arrays.setAll(targets[k], i -> BLOCKS + i); // not the prefix's own blocks
        }
        int loads = 0;
        long atAlloc = 0;
        int loadFailures = 0;
        long loaded = 0;
        long expectedLoaded = 0;
        long hitTokens = 0;
        long expected = 0;
        long missTokens = 0;
        int round = 0;
        for (; round < rounds && System.nanoTime() - start < budgetNanos; round++) {
            int k = round % 3;
            int n = BLOCKS >> k;
            long computed = round % 5 == 4 ? (long) (n / 4) * blockSize : 0;
            String hit = "h" + round;
            // mostly a lookup that begins its load (the default), now and then a load that asks for its plan
            side.beginAtLookup(round % 7 != 6);
            long tokens = side.lookup(hit, prefixes[k], (long) n * blockSize + 1, computed);
            hitTokens += tokens;
            expected += (long) n * blockSize - computed;
            if (k == 2) {
                side.requestFinished(hit); // dropped before allocation: the probe's lease released
            } else {
                side.loadsAtAlloc(round % 2 == 1); // the load starts in afterAlloc, held until the step
                side.afterAlloc(hit, targets[k], tokens);
                byte[] plan = side.buildPlan();
                loads += worker.startLoads(plan); // the step's in-step loads, as start_load_kv
                for (int l = 0; l < LAYERS; l++) {
                    worker.waitLayer(l, 0); // as wait_for_layer_load: host copies, this thread waits
                }
                worker.getFinished(List.of()); // ends the step's in-step loads
                loadFailures += worker.drainLoadErrors().length;
                long[] stats = worker.drainStats();
                loaded += stats[WorkerSide.STAT_LOADED_BLOCKS];
                atAlloc += stats[WorkerSide.STAT_IN_STEP_AT_ALLOC];
                expectedLoaded += tokens / blockSize;
                side.finished(List.of(), List.of());
                side.requestFinished(hit);
            }
            String cold = "m" + round;
            missTokens += side.lookup(cold, misses[k], (long) n * blockSize + 1, 0);
            side.afterAlloc(cold, tables[k], 0);
            side.schedule(cold, misses[k], 0, tables[k], true, 0, (long) n * blockSize);
            side.buildPlan();
            if (side.requestFinished(cold)) {
                side.finished(List.of(cold), List.of());
            }
        }
        return new Result(round, loads, atAlloc, loadFailures, loaded, expectedLoaded, hitTokens, expected, missTokens,
                side.lookupFailures(), side.contractViolations(), side.trackedRequests(), engine.stagingCounts()[0],
                System.nanoTime() - start, store == null);
    }
}
