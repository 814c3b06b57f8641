package io.pegaflow.bench.jmh;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.LayeredLoad;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.transfer.CopyBatch;
import io.pegaflow.engine.transfer.TransferEngine;
import io.pegaflow.engine.transfer.TransferFuture;
import java.time.Duration;
import java.util.ArrayList;
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
 * The engine's own share of an in-step load's plan: query + lease of an N-block prefix, then
 * {@code loadLayered} (the store's copy plan and every piece of every layer group written into
 * the batch) on a copy engine that moves nothing and completes at once, so what is timed is
 * the control plane and the batch building that a GPU load pays before its first copy kernel
 * (the CUDA engine's descriptor writes and launches come on top). Llama-3.1-8B's geometry:
 * 32 layers of vLLM's {@code [2, blocks, 16, 8, 128]} bf16 tensors, two 32 KiB pieces per layer
 * and block. {@code load} (one group, no layer events) is measured beside it.
 */
@State(Scope.Benchmark)
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.MILLISECONDS)
public class LayeredPlanBenchmark {
    private static final int LAYERS = 32;
    private static final long PIECE = 32 * 1024;

    @Param({"1024"})
    int blocks;

    private PegaEngine engine;
    private BlockHashes hashes;
    private long[] dst;

    /** Completes every batch at once without touching memory: the addresses below are never read. */
    private static TransferEngine nothingMoves() {
        return new TransferEngine() {
            @Override
            public TransferFuture submit(CopyBatch batch) {
                TransferFuture f = new TransferFuture();
                f.complete(null);
                return f;
            }

            @Override
            public String name() {
                return "nothing-moves";
            }

            @Override
            public void close() {}
        };
    }

    /** An engine holding a saved {@code blocks}-block prefix, its keys and the blocks a load writes into. */
    public record Fixture(PegaEngine engine, BlockHashes hashes, long[] dst) {}

    /**
     * Instance "bench" with one worker of Llama-3.1-8B's 32 layers (addresses never
     * dereferenced: nothing moves), a {@code blocks}-block prefix saved and resident; also
     * used by bench/probe/PlanSplitProbe.java.
     */
    public static Fixture fixture(int blocks) throws Exception {
        int regionBlocks = 2 * blocks;
        PegaEngine engine = PegaEngine.create(EngineConfig.builder().poolBytes(blocks * LAYERS * 2 * PIECE + (64L << 20))
                .sweepInterval(Duration.ZERO).transfer(pool -> nothingMoves()).build());
        engine.registerInstance(new InstanceSpec("bench", "bench-ns", 1, 1));
        List<LayerRegion> layers = new ArrayList<>();
        long base = 1L << 40; // never dereferenced: nothing moves
        for (int l = 0; l < LAYERS; l++) {
            long bytes = 2L * regionBlocks * PIECE;
            layers.add(new LayerRegion("model.layers." + l + ".self_attn.attn", KvLayout.SPLIT_KV, base, bytes, regionBlocks,
                    PIECE, PIECE, regionBlocks * PIECE));
            base += bytes;
        }
        engine.registerWorker("bench", new WorkerSpec(0, 0, 0, layers));
        byte[] packed = new byte[blocks * 32];
        new Random(1).nextBytes(packed);
        BlockHashes hashes = new BlockHashes(packed, 32);
        long[] src = new long[blocks];
        long[] dst = new long[blocks];
        for (int i = 0; i < blocks; i++) {
            src[i] = i;
            dst[i] = blocks + i;
        }
        engine.save("bench", 0, src, hashes).get(60, TimeUnit.SECONDS);
        engine.flush(60_000);
        QueryResult q = engine.query("bench", hashes);
        if (q.hitBlocks() != blocks) {
            throw new IllegalStateException("saved " + blocks + " blocks, " + q.hitBlocks() + " resident");
        }
        engine.release("bench", q.lease());
        return new Fixture(engine, hashes, dst);
    }

    @Setup(Level.Trial)
    public void setUp() throws Exception {
        Fixture f = fixture(blocks);
        engine = f.engine();
        hashes = f.hashes();
        dst = f.dst();
    }

    @Benchmark
    public Object queryThenLoadLayered() {
        QueryResult q = engine.query("bench", hashes);
        LayeredLoad load = engine.loadLayered("bench", 0, q.lease(), dst);
        return load.result().join();
    }

    @Benchmark
    public Object queryThenLoad() {
        QueryResult q = engine.query("bench", hashes);
        return engine.load("bench", 0, q.lease(), dst).join();
    }

    @Benchmark
    public Object queryAndRelease() {
        QueryResult q = engine.query("bench", hashes);
        engine.release("bench", q.lease());
        return q;
    }

    @TearDown(Level.Trial)
    public void tearDown() {
        engine.close();
    }
}
