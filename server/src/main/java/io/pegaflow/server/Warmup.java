package io.pegaflow.server;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.transfer.HostTransferEngine;
import java.io.IOException;
import java.lang.foreign.Arena;
import java.util.Arrays;
import java.util.Random;

/**
 * Runs the server's per-operation paths before the server serves, so the JIT has compiled them
 * as they will run when the first worker's operation arrives: without it the first few
 * operations of a fresh server ran at a fraction of steady speed on the H200 (docs/gpu.md, "Cold
 * paths"). The rounds are a worker's: a client of a scratch pegaflow-server started in this JVM
 * ({@link ScratchServer}: loopback, its own pool file and token in a private directory, stopped
 * at the end) registers over gRPC and saves, looks up (the lookup that begins the load and the
 * plain one), loads in one or two parts, and releases over the local socket, for {@link #ROUNDS}
 * rounds or {@link #BUDGET_NANOS}, whichever ends first. The scratch server is a whole server
 * (its store's metrics, its call metrics, tenants, the token): the compiled code then has seen
 * the types and branches the real server's calls take. Raw frames on a bare scratch store, as
 * before, left code the first real calls sent back to the interpreter (branches those rounds
 * never took), and a fresh server's spaced Query well short of its warm speed
 * (docs/benchmarks/README.md, "The server's own warm-up, as a worker's calls"). The real store,
 * its metrics and its pool are untouched.
 */
final class Warmup {
    private static final int LAYERS = 32;
    private static final int BLOCKS = 2048;
    private static final long SEGMENT_BYTES = 64;
    private static final long SLOT_BYTES = LAYERS * 2 * SEGMENT_BYTES;
    private static final int ROUNDS = 5000;
    /** Stored prefixes' blocks; the rounds look up mostly the 8K and 16K-token ones of 16-token blocks. */
    private static final int[] SIZES = {16, 256, 512, 1024, BLOCKS};
    private static final int[] PICKS = {2, 3, 2, 3, 1, 2, 3, 0, 2, 3, 2, 4};
    private static final long BUDGET_NANOS = 4_000_000_000L;
    private static final String INSTANCE = "warm-up";

    private Warmup() {}

    /** What a warm-up did: its rounds, and the Query and EndCopy calls its scratch server answered (its call metrics). */
    record Result(int rounds, long nanos, long queries, long endCopies) {}

    private static BlockHashes hashes(Random rnd, int blocks) {
        byte[] packed = new byte[blocks * 32];
        rnd.nextBytes(packed);
        return new BlockHashes(packed, 32);
    }

    /** Ends a lookup's lease: its load copied ({@code load}), or released unused. */
    private static void endLookup(PegaEngine engine, QueryResult q, long[] targets, boolean load) {
        if (q.lease() == null) {
            return;
        }
        if (load) {
            engine.load(INSTANCE, 0, q.lease(), Arrays.copyOf(targets, q.hitBlocks())).join();
        } else {
            engine.release(INSTANCE, q.lease());
        }
    }

    static Result run() {
        return run(ROUNDS, BUDGET_NANOS);
    }

    static Result run(int rounds, long budgetNanos) {
        long start = System.nanoTime();
        try (Arena arena = Arena.ofConfined();
                ScratchServer.Opened scratch = ScratchServer.start(4 * BLOCKS * SLOT_BYTES, p -> new HostTransferEngine(p, 1))) {
            PegaEngine engine = scratch.engine();
            engine.registerInstance(new InstanceSpec(INSTANCE, INSTANCE, 1, 1));
            // loads write the blocks after the saved ones
            engine.registerWorker(INSTANCE, WorkerSpec.scratch(arena, LAYERS, 2 * BLOCKS, SEGMENT_BYTES));
            long[] ids = new long[BLOCKS];
            long[] targets = new long[BLOCKS];
            Arrays.setAll(ids, i -> i);
            Arrays.setAll(targets, i -> BLOCKS + i);
            Random rnd = new Random(1);
            // prefixes stored once, as a warm request finds its own: the rounds are mostly lookups
            BlockHashes[] stored = new BlockHashes[SIZES.length];
            for (int k = 0; k < SIZES.length; k++) {
                stored[k] = hashes(rnd, SIZES[k]);
                engine.save(INSTANCE, 0, Arrays.copyOf(ids, SIZES[k]), stored[k]).join();
            }
            BlockHashes absent = hashes(rnd, 512);
            int round = 0;
            for (; round < rounds && System.nanoTime() - start < budgetNanos; round++) {
                BlockHashes prefix = stored[PICKS[round % PICKS.length]];
                // the lookup that begins its load (a worker in the scheduler's process), copied now
                // and then, mostly dropped unused (rolled back: the same call, the cheap branch)
                QueryResult begun = engine.queryAndBegin(INSTANCE, prefix, 0);
                endLookup(engine, begun, targets, round % 4 == 0);
                if (round % 4 == 1) { // a lookup that leaves the plan to the load (in one or two parts)
                    endLookup(engine, engine.query(INSTANCE, prefix), targets, round % 8 == 1);
                } else if (round % 4 == 3) {
                    endLookup(engine, engine.query(INSTANCE, absent), targets, false);
                }
                if (round % 16 == 2) { // a new request's save, small; the pool's eviction when it fills
                    int n = round % 32 == 2 ? 256 : 16;
                    engine.save(INSTANCE, 0, Arrays.copyOf(ids, n), hashes(rnd, n)).join();
                }
            }
            engine.unregisterInstance(INSTANCE);
            RpcMetrics calls = scratch.server().rpcMetrics();
            return new Result(round, System.nanoTime() - start, (long) calls.requests.labelValues("Query", "OK").get(),
                    (long) calls.requests.labelValues("EndCopy", "OK").get());
        } catch (IOException e) {
            throw new IllegalStateException("warm-up: the scratch server did not start: " + e, e);
        }
    }
}
