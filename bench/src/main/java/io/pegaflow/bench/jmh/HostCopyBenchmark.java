package io.pegaflow.bench.jmh;

import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.CopyBatch;
import io.pegaflow.engine.transfer.HostTransferEngine;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Collections;
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
 * The host copy engine moving scattered 32 KiB pieces (vLLM's per-layer K or V of a block,
 * Llama-3.1-8B) against one bulk {@link MemorySegment#copy} of the same number of bytes, in
 * the same run. Both copy 256 MiB from a "device" region into the pool; the scattered batch
 * takes the pieces in random block order, so no two merge.
 */
@State(Scope.Benchmark)
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.MILLISECONDS)
public class HostCopyBenchmark {
    @Param({"32768"})
    int pieceBytes;

    @Param({"268435456"})
    long totalBytes;

    private Arena arena;
    private HostPool pool;
    private HostTransferEngine copier;
    private MemorySegment device;
    private CopyBatch scattered;

    @Setup(Level.Trial)
    public void setUp() {
        arena = Arena.ofShared();
        device = arena.allocate(totalBytes, 4096);
        device.fill((byte) 7);
        pool = HostPool.anonymous(totalBytes);
        pool.segment().fill((byte) 1); // fault the pages in before measuring
        copier = new HostTransferEngine(pool, 1);
        int pieces = (int) (totalBytes / pieceBytes);
        List<Integer> order = new ArrayList<>();
        for (int i = 0; i < pieces; i++) {
            order.add(i);
        }
        Collections.shuffle(order, new Random(1));
        scattered = new CopyBatch(CopyBatch.Direction.TO_HOST, pieces);
        for (int i = 0; i < pieces; i++) {
            scattered.add(device.address() + (long) order.get(i) * pieceBytes, (long) i * pieceBytes, pieceBytes);
        }
        if (scattered.coalescedRanges() < pieces * 0.99) {
            throw new IllegalStateException("scattered batch merged into " + scattered.coalescedRanges() + " ranges");
        }
    }

    @Benchmark
    public void scatteredPieces() {
        copier.copy(scattered);
    }

    @Benchmark
    public void bulkCopy() {
        MemorySegment.copy(device, 0, pool.segment(), 0, totalBytes);
    }

    @TearDown(Level.Trial)
    public void tearDown() {
        copier.close();
        pool.close();
        arena.close();
    }
}
