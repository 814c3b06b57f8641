package io.pegaflow.connector;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.CopyPlan;
import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.EngineSource;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.store.LocalStore;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.time.Duration;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * Runs the scheduler side's per-request path (lookup of a stored prefix and of a miss, the
 * allocation hook, the step's plan with its loads and saves, the request's end, and under them
 * the store's query, lease and release) on a scratch engine of its own, so the JIT has compiled
 * it before vLLM's first requests: in a fresh process those run interpreted or lightly compiled
 * code, on vLLM's scheduling thread, where their time is time to first token
 * ({@code python -m pegaflow.bench.lookupwarm} runs fresh processes with and without it;
 * docs/benchmarks/README.md, "Lookup warm-up"). The server warms its own side at start
 * ({@code io.pegaflow.server.Warmup}); this is the connector's side, and in embedded mode the store's.
 *
 * <p>The scratch engine is private: its own small pool (never written: saves are sealed by
 * their plans alone, no byte is copied), its own instance, its own counters. The real store,
 * its metrics and vLLM's blocks are untouched; the scratch engine is closed at the end. A
 * failure only logs: it is an optimisation.
 */
public final class LookupWarmUp {
    /** Blocks of the longest chain (a 32K-token prompt of 16-token blocks). */
    static final int BLOCKS = 2048;
    static final int ROUNDS = 400;
    static final long BUDGET_NANOS = 3_000_000_000L;
    private static final String INSTANCE = "pegaflow-lookup-warm-up";
    private static final long SLOT_BYTES = 512;
    private static final System.Logger LOG = System.getLogger(LookupWarmUp.class.getName());
    private static final AtomicBoolean STARTED = new AtomicBoolean();
    /** How the process's warm-up ended: its {@link Result}, or what stopped it (null while it runs). */
    static volatile Object outcome;

    private LookupWarmUp() {}

    /**
     * Starts the warm-up on a daemon thread, once per process whatever the number of scheduler
     * sides (the JIT's work is the process's). Returns the thread, or null when it had started.
     */
    public static Thread startOnce(int blockSize) {
        if (!STARTED.compareAndSet(false, true)) {
            return null;
        }
        Thread t = new Thread(() -> {
            try {
                Result r = run(blockSize, ROUNDS, BUDGET_NANOS);
                outcome = r;
                LOG.log(System.Logger.Level.DEBUG, () -> "lookup warm-up: " + r.rounds() + " rounds in "
                        + r.nanos() / 1_000_000 + " ms");
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
     * What a run did: {@code rounds} rounds; {@code hitTokens} what its hit lookups answered
     * against {@code expectedHitTokens}, each round's stored prefix past its computed head (the
     * hit path ran, not only misses); {@code missTokens} what its miss lookups answered (0);
     * the scheduler side's {@code lookupFailures} and {@code contractViolations} (0), and the
     * requests it still {@code tracked} at the end (0: every request's end was taken); in
     * {@code nanos}.
     */
    record Result(int rounds, long hitTokens, long expectedHitTokens, long missTokens, long lookupFailures,
            long contractViolations, int tracked, long nanos) {}

    /**
     * Runs up to {@code rounds} rounds within {@code budgetNanos}, here. Each round: a stored
     * prefix of all, 1/2 or 1/4 of {@link #BLOCKS} blocks looked up by a new request (now and
     * then past a computed head, as after vLLM's own prefix hit), allocated and planned as an
     * in-step load whose lease is then released (no worker consumes it here), ended; or, every
     * third round, dropped before allocation (the probe's lease released); then a miss looked up,
     * its saves planned (it is new: its whole block table) and ended as a finished save.
     */
    static Result run(int blockSize, int rounds, long budgetNanos) {
        long start = System.nanoTime();
        try (Arena arena = Arena.ofConfined();
                PegaEngine engine = PegaEngine.create(EngineConfig.builder().poolBytes(2 * BLOCKS * SLOT_BYTES)
                        .sweepInterval(Duration.ZERO).copyThreads(1).build())) {
            EngineSource.Binding binding = new EngineSource.Binding(engine, 1);
            SchedulerSide side = new SchedulerSide(() -> binding, INSTANCE, blockSize, true); // checks the block size
            side.inStepLoads(true);
            MemorySegment kv = arena.allocate(BLOCKS * SLOT_BYTES, 64); // registered, never copied from or to
            engine.registerInstance(new InstanceSpec(INSTANCE, INSTANCE, 1, 1));
            engine.registerWorker(INSTANCE, new WorkerSpec(0, 0, 0, List.of(new LayerRegion("model.layers.0.self_attn.attn",
                    KvLayout.MLA, kv.address(), kv.byteSize(), BLOCKS, SLOT_BYTES, SLOT_BYTES, 0))));
            Random rnd = new Random(1);
            byte[] stored = new byte[BLOCKS * 32];
            byte[] absent = new byte[BLOCKS * 32];
            rnd.nextBytes(stored);
            rnd.nextBytes(absent);
            long[] ids = new long[BLOCKS];
            Arrays.setAll(ids, i -> i);
            LocalStore store = engine.localStore();
            CopyPlan saved = store.reserveSave(INSTANCE, 0, null, ids, new BlockHashes(stored, 32));
            store.endCopy(INSTANCE, saved.id(), true, 0, 0); // sealed by its plan: nothing is read
            // all, 1/2 and 1/4 of the chain, made once: the rounds allocate only what the path does
            BlockHashes[] prefixes = new BlockHashes[3];
            BlockHashes[] misses = new BlockHashes[3];
            long[][] tables = new long[3][];
            for (int k = 0; k < 3; k++) {
                int n = BLOCKS >> k;
                prefixes[k] = new BlockHashes(Arrays.copyOf(stored, n * 32), 32);
                misses[k] = new BlockHashes(Arrays.copyOf(absent, n * 32), 32); // never saved: a save is only planned
                tables[k] = Arrays.copyOf(ids, n);
            }
            long hitTokens = 0;
            long expected = 0;
            long missTokens = 0;
            int round = 0;
            for (; round < rounds && System.nanoTime() - start < budgetNanos; round++) {
                int k = round % 3;
                int n = BLOCKS >> k;
                long computed = round % 5 == 4 ? (long) (n / 4) * blockSize : 0;
                String hit = "h" + round;
                long tokens = side.lookup(hit, prefixes[k], (long) n * blockSize + 1, computed);
                hitTokens += tokens;
                expected += (long) n * blockSize - computed;
                if (k == 2) {
                    side.requestFinished(hit); // dropped before allocation: the probe's lease released
                } else {
                    side.afterAlloc(hit, tables[k], tokens);
                    for (StepPlan.Load l : StepPlan.decode(side.buildPlan()).loads()) {
                        engine.release(INSTANCE, l.lease()); // what a worker's load would have consumed
                    }
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
            int tracked = side.trackedRequests();
            side.shutdown();
            return new Result(round, hitTokens, expected, missTokens, side.lookupFailures(), side.contractViolations(),
                    tracked, System.nanoTime() - start);
        }
    }
}
