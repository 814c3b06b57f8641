package io.pegaflow.bench.jmh;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.Token;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.WorkerSpec;
import java.lang.foreign.Arena;
import java.time.Duration;
import java.util.List;
import java.util.Random;
import java.util.concurrent.TimeUnit;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;

/**
 * Query + lease of an N-block resident prefix (the scheduler's lookup cost; the original
 * PegaFlow's figure is beside ours in docs/benchmarks/README.md), and the release of such a
 * lease, measured apart: each benchmark's counterpart runs in a per-invocation fixture outside
 * the timed region (fine at millisecond scale). The cost does not depend on block size, so a
 * block is one 512-byte latent slot: 32K of them fit a 16 MiB pool.
 */
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.MILLISECONDS)
public class QueryLeaseBenchmark {

    /** The engine with N sealed blocks, shared by both benchmarks. */
    @State(Scope.Benchmark)
    public static class Store {
        @Param({"32768"})
        int blocks;

        PegaEngine engine;
        Arena arena;
        BlockHashes hashes;

        @Setup(Level.Trial)
        public void setUp() {
            engine = PegaEngine.create(EngineConfig.builder().poolBytes(blocks * 512L + (1 << 20))
                    .sweepInterval(Duration.ZERO).build());
            arena = Arena.ofShared();
            long base = arena.allocate(blocks * 512L, 4096).address();
            engine.registerInstance(new InstanceSpec("bench", "bench-ns", 1, 1));
            engine.registerWorker("bench", new WorkerSpec(0, 0, 0,
                    List.of(new LayerRegion("layer.0", KvLayout.MLA, base, blocks * 512L, blocks, 512, 512, 0))));
            Random rnd = new Random(1);
            byte[] packed = new byte[blocks * 32];
            rnd.nextBytes(packed);
            hashes = new BlockHashes(packed, 32);
            long[] ids = new long[blocks];
            for (int i = 0; i < blocks; i++) {
                ids[i] = i;
            }
            engine.save("bench", 0, ids, hashes).join();
        }

        @TearDown(Level.Trial)
        public void tearDown() {
            engine.close();
            arena.close();
        }
    }

    /** Releases, untimed, the lease each queryLease invocation took. */
    @State(Scope.Thread)
    public static class Issued {
        QueryResult result;

        @TearDown(Level.Invocation)
        public void release(Store store) {
            store.engine.release("bench", result.lease());
        }
    }

    /** Takes, untimed, the lease each releaseLease invocation drops. */
    @State(Scope.Thread)
    public static class Held {
        Token lease;

        @Setup(Level.Invocation)
        public void lease(Store store) {
            lease = store.engine.query("bench", store.hashes).lease();
        }
    }

    @Benchmark
    public int queryLease(Store store, Issued issued) {
        issued.result = store.engine.query("bench", store.hashes);
        return issued.result.hitBlocks();
    }

    @Benchmark
    public void releaseLease(Store store, Held held) {
        store.engine.release("bench", held.lease);
    }
}
