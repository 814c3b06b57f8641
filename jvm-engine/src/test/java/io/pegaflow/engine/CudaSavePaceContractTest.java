package io.pegaflow.engine;

import static org.assertj.core.api.Assertions.assertThat;

import io.pegaflow.engine.cuda.CudaOptions;
import io.pegaflow.engine.cuda.CudaTransferEngine;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * The contract again with saves paced to one copy on the copy engine at a time
 * ({@link CudaOptions#savePaceCopies}) and a bounce buffer of two 1 MiB slots, so saves of whole
 * blocks take many paced copies; and saves of blocks big enough for the bounce path, and of a
 * cross-layer layout's whole blocks (long runs, no bounce slot), from four threads at once, land
 * byte-exact with every copy paced and every permit back at the end.
 */
@Tag("gpu")
class CudaSavePaceContractTest extends CudaTransferContractTest {
    private final AtomicReference<CudaTransferEngine> made = new AtomicReference<>();

    @Override
    CudaOptions options() {
        return CudaOptions.defaults().withBounce(2L << 20, 2).withSavePace(1);
    }

    @Override
    EngineConfig.Builder config() {
        return EngineConfig.builder().transfer(pool -> {
            CudaTransferEngine t = CudaTransferEngine.create(pool, options());
            made.set(t);
            return t;
        });
    }

    @Test
    void pacedSavesOfWholeBlocksFromSeveralThreadsLandByteExact() throws Exception {
        int threads = 4;
        int chain = 12; // a block's 4 layers of K and V, 64 KiB each, lie back to back in the pool: 512 KiB, the bounce path
        try (PegaEngine engine = PegaEngine.create(config().poolSize("256mb").build());
                KvWorld world = new KvWorld(memory(), "inst", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 4,
                        threads * 2 * chain, 64 << 10, 0)) {
            world.register(engine);
            long before = made.get().pacedSaveCopies();
            List<byte[][]> hashes = saveFromThreads(engine, world, threads, chain);
            // 12 blocks of 512 KiB in slots of 1 MiB: 6 copies a save at least, each paced
            assertThat(made.get().pacedSaveCopies() - before).isGreaterThanOrEqualTo(threads * chain / 2);
            assertThat(made.get().savePacePermitsFree()).isEqualTo(1);
            loadBackAndCheck(engine, world, hashes, chain);
        }
    }

    /**
     * A cross-layer layout's whole blocks, 1 MiB each (4 layers of K and V, 128 KiB a piece, back
     * to back on the device and in the pool): long runs, which go to the copy engine without a
     * bounce slot; under the pace too, a unit of at most a slot's bytes (1 MiB) a permit, so each
     * block takes one at least; byte-exact, every permit back at the end.
     */
    @Test
    void pacedSavesOfCrossLayerBlocksGoAsLongRunsUnderThePace() throws Exception {
        int threads = 4;
        int chain = 8;
        try (PegaEngine engine = PegaEngine.create(config().poolSize("256mb").build());
                KvWorld world = new KvWorld(memory(), "inst", "ns", KvWorld.Kind.CROSS_LAYER, 1, 1, 4,
                        threads * 2 * chain, 128 << 10, 0)) {
            world.register(engine);
            long paced = made.get().pacedSaveCopies();
            long bounced = made.get().bouncedBytes();
            List<byte[][]> hashes = saveFromThreads(engine, world, threads, chain);
            assertThat(made.get().bouncedBytes() - bounced).as("long runs, not bounce slots").isZero();
            assertThat(made.get().pacedSaveCopies() - paced).isGreaterThanOrEqualTo((long) threads * chain);
            assertThat(made.get().savePacePermitsFree()).isEqualTo(1);
            loadBackAndCheck(engine, world, hashes, chain);
        }
    }

    /** Thread t saves blocks [2t*chain, 2t*chain+chain) at once with the others, each filled with its hash's pattern. */
    private static List<byte[][]> saveFromThreads(PegaEngine engine, KvWorld world, int threads, int chain) {
        List<CompletableFuture<CopyResult>> saves = new ArrayList<>();
        List<byte[][]> hashes = new ArrayList<>();
        Random rnd = new Random(77);
        for (int t = 0; t < threads; t++) {
            byte[][] h = KvWorld.randomHashes(rnd, chain);
            long[] src = new long[chain];
            for (int i = 0; i < chain; i++) {
                src[i] = (long) t * 2 * chain + i;
                world.fillPattern(src[i], h[i]);
            }
            hashes.add(h);
            saves.add(engine.save("inst", 0, src, BlockHashes.of(h)));
        }
        for (CompletableFuture<CopyResult> s : saves) {
            assertThat(s.join().blocks()).isEqualTo(chain);
        }
        return hashes;
    }

    /** Each thread's saved blocks loaded into the blocks after them, holding exactly what was saved. */
    private static void loadBackAndCheck(PegaEngine engine, KvWorld world, List<byte[][]> hashes, int chain) {
        for (int t = 0; t < hashes.size(); t++) {
            QueryResult q = engine.query("inst", BlockHashes.of(hashes.get(t)));
            assertThat(q.hitBlocks()).isEqualTo(chain);
            long[] dst = new long[chain];
            for (int i = 0; i < chain; i++) {
                dst[i] = (long) t * 2 * chain + chain + i;
            }
            engine.load("inst", 0, q.lease(), dst).join();
            for (int i = 0; i < chain; i++) {
                assertThat(world.holdsPattern(dst[i], hashes.get(t)[i])).as("save %d block %d", t, i).isTrue();
            }
        }
    }
}
