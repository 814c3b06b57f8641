package io.pegaflow.bench.jmh;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.hash.VllmBlockHasher;
import java.util.Random;
import java.util.concurrent.TimeUnit;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;

/**
 * The store's keys of a request's blocks where vLLM's own hashes differ per process
 * (docs/connector.md, "Keys"): vLLM's hash chain over a 16K-token prompt in blocks of 16, which
 * the scheduler side computes at a request's first lookup, inside vLLM's scheduling step.
 */
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.MILLISECONDS)
@State(Scope.Benchmark)
public class BlockHasherBenchmark {
    @Param({"sha256", "sha256_cbor", "xxhash"})
    String algorithm;

    @Param({"16384"})
    int tokens;

    VllmBlockHasher hasher;
    int[] ids;

    @Setup
    public void setUp() {
        hasher = new VllmBlockHasher(VllmBlockHasher.Algorithm.of(algorithm), "0");
        Random rnd = new Random(7);
        ids = new int[tokens];
        for (int i = 0; i < tokens; i++) {
            ids[i] = 1000 + rnd.nextInt(127_000);
        }
    }

    @Benchmark
    public BlockHashes chain() {
        return hasher.chain(null, ids, 16);
    }
}
