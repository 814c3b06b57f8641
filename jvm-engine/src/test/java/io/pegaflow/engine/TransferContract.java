package io.pegaflow.engine;

import static org.assertj.core.api.Assertions.assertThat;

import io.pegaflow.engine.metrics.Gauge;
import io.pegaflow.engine.transfer.TransferEngine;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

/**
 * The copy-engine contract, written once and run against every implementation (host
 * memcpy, CUDA): through the engine, save -> query -> load into different block ids is
 * byte-exact for every layout, an untouched block stays untouched, and concurrent saves and
 * loads from several threads do not mix bytes. Subclasses supply the memory the "device"
 * tensors live in and the copy engine.
 */
abstract class TransferContract {
    /** Memory for the device-side KV tensors of one test. */
    abstract DeviceMemory memory();

    /** Engine settings with this implementation's copy engine. */
    abstract EngineConfig.Builder config();

    /**
     * Whether this copy engine queues a layer-wise load on a device, each layer behind an event a
     * stream can wait on ({@link LayeredLoad#queuedOnDevice}: the connector's step then does not
     * wait for its last byte); host copies do not.
     */
    boolean queuesOnDevice() {
        return false;
    }

    static Stream<Arguments> layouts() {
        List<Arguments> out = new ArrayList<>();
        for (KvWorld.Kind kind : KvWorld.Kind.values()) {
            out.add(Arguments.of(kind, 1, 1));
            out.add(Arguments.of(kind, 2, 2));
        }
        return out.stream();
    }

    @ParameterizedTest(name = "{0} tp={1} pp={2}")
    @MethodSource("layouts")
    void roundTripIsByteExactIntoOtherBlockIds(KvWorld.Kind kind, int tp, int pp) {
        long seed = kind.ordinal() * 31L + tp * 7L + pp;
        Random rnd = new Random(seed);
        int saved = 6;
        int numBlocks = 2 * saved + 3;
        try (PegaEngine engine = PegaEngine.create(config().poolSize("64mb").build());
                KvWorld world = new KvWorld(memory(), "inst", "ns-" + kind, kind, tp, pp, 2 * pp, numBlocks, 4096 + 256, 512)) {
            world.register(engine);
            List<Long> ids = new ArrayList<>();
            for (long b = 0; b < numBlocks; b++) {
                ids.add(b);
                world.fillRandom(b, rnd);
            }
            Collections.shuffle(ids, rnd);
            long[] src = ids.subList(0, saved).stream().mapToLong(Long::longValue).toArray();
            long[] dst = ids.subList(saved, 2 * saved).stream().mapToLong(Long::longValue).toArray();
            long control = ids.get(2 * saved);
            byte[] controlBefore = world.snapshot(control);
            List<byte[]> expected = new ArrayList<>();
            for (long b : src) {
                expected.add(world.snapshot(b));
            }
            byte[][] hashes = KvWorld.randomHashes(rnd, saved);
            List<CompletableFuture<CopyResult>> saves = new ArrayList<>();
            for (WorkerSpec w : world.workers) {
                saves.add(engine.save("inst", w.workerRank(), src, BlockHashes.of(hashes)));
            }
            saves.forEach(CompletableFuture::join);
            for (long b : src) {
                world.fillRandom(b, rnd); // a load that read the device side would now differ
            }
            QueryResult q = engine.query("inst", BlockHashes.of(hashes));
            assertThat(q.hitBlocks()).isEqualTo(saved);
            for (WorkerSpec w : world.workers) {
                engine.load("inst", w.workerRank(), q.lease(), dst).join();
            }
            for (int i = 0; i < saved; i++) {
                assertThat(world.snapshot(dst[i])).as("seed %d: block %d loaded into %d", seed, src[i], dst[i])
                        .isEqualTo(expected.get(i));
            }
            assertThat(world.snapshot(control)).as("seed %d: control block %d", seed, control).isEqualTo(controlBefore);
            engine.verifyInvariants();
        }
    }

    /**
     * A layered load (vLLM's in-step load: layer by layer, the engine grouping layers as its
     * copy engine asks) of 40 blocks of 8 per-layer K/V layers, 32 KiB per piece: waiting for
     * each layer from this thread returns with that layer of every block in place (later
     * layers may still be copying), and every loaded block equals the saved one.
     */
    @Test
    void aLayeredLoadIsByteExactLayerByLayer() {
        Random rnd = new Random(77);
        int saved = 40;
        try (PegaEngine engine = PegaEngine.create(config().poolSize("64mb").build());
                KvWorld world = new KvWorld(memory(), "inst", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 8, 2 * saved + 1,
                        32 << 10, 0)) {
            world.register(engine);
            long[] src = evenBlocks(saved);
            long[] dst = oddBlocksReversed(saved);
            byte[][] hashes = savePatterns(engine, world, rnd, src);
            QueryResult q = engine.query("inst", BlockHashes.of(hashes));
            assertThat(q.hitBlocks()).isEqualTo(saved);
            LayeredLoad load = engine.loadLayered("inst", 0, q.lease(), dst);
            awaitEveryLayerAndCheck(load, world, 8, src, dst, hashes);
            assertThat(load.queuedOnDevice()).as("every copy queued on the device, each layer behind its event")
                    .isEqualTo(queuesOnDevice());
            engine.verifyInvariants();
        }
    }

    /**
     * Engine settings with this implementation's copy engine staging loads at their lookup in a
     * buffer of {@code stageBytes}; {@code made} receives the engine.
     */
    abstract EngineConfig.Builder stagedConfig(long stageBytes, java.util.concurrent.atomic.AtomicReference<TransferEngine> made);

    /**
     * A load staged at its lookup ({@code queryAndBegin}; io.pegaflow.engine.transfer.Stager):
     * held until its step, its layers awaited one by one, lands byte-exact from the staging
     * buffer; while that staging is unclaimed a second lookup's load is not staged and reads
     * the pool; a released lease frees the buffer for the next; a load larger than the buffer
     * reads the pool. Every load byte-exact either way.
     */
    @Test
    void aLoadStagedAtItsLookupIsByteExactLayerByLayer() {
        Random rnd = new Random(79);
        int saved = 40;
        int layers = 8;
        long piece = 32 << 10;
        long loadBytes = saved * layers * 2 * piece;
        java.util.concurrent.atomic.AtomicReference<TransferEngine> made = new java.util.concurrent.atomic.AtomicReference<>();
        try (PegaEngine engine = PegaEngine.create(stagedConfig(loadBytes, made).poolSize("64mb").build());
                KvWorld world = new KvWorld(memory(), "inst", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, layers, 2 * saved + 1,
                        piece, 0)) {
            world.register(engine);
            io.pegaflow.engine.transfer.Stager stager = made.get().stager();
            assertThat(stager).as("the engine stages with a buffer set").isNotNull();
            assertThat(stager.allocated()).as("its buffer is taken at the first staging, not at start").isFalse();
            long[] src = evenBlocks(saved);
            long[] dst = oddBlocksReversed(saved);
            byte[][] hashes = savePatterns(engine, world, rnd, src);

            QueryResult q = engine.queryAndBegin("inst", BlockHashes.of(hashes), 0);
            assertThat(q.hitBlocks()).isEqualTo(saved);
            assertThat(stager.stagedLoads()).as("staged at the lookup").isEqualTo(1);
            QueryResult second = engine.queryAndBegin("inst", BlockHashes.of(hashes), 0);
            assertThat(stager.busyRefusals()).as("the buffer holds the first, unclaimed").isEqualTo(1);
            CompletableFuture<Void> hold = new CompletableFuture<>();
            LayeredLoad load = engine.loadLayered("inst", 0, q.lease(), dst, hold);
            assertThat(load.fromStage()).as("the first load reads its staging").isTrue();
            hold.complete(null);
            awaitEveryLayerAndCheck(load, world, layers, src, dst, hashes);

            world.fillRandom(dst[0], rnd);
            LayeredLoad plain = engine.loadLayered("inst", 0, second.lease(), dst);
            assertThat(plain.fromStage()).as("the second lookup's load was not staged").isFalse();
            plain.result().join();
            assertThat(world.holdsPattern(dst[0], hashes[0])).as("the unstaged load's block").isTrue();

            QueryResult dropped = engine.queryAndBegin("inst", BlockHashes.of(hashes), 0);
            assertThat(stager.stagedLoads()).as("the buffer was free again once the first load ended").isEqualTo(2);
            engine.release("inst", dropped.lease());
            QueryResult third = engine.queryAndBegin("inst", BlockHashes.of(hashes), 0);
            assertThat(stager.stagedLoads()).as("a released lease let its staging go").isEqualTo(3);
            world.fillRandom(dst[1], rnd);
            LayeredLoad again = engine.loadLayered("inst", 0, third.lease(), dst);
            assertThat(again.fromStage()).isTrue();
            again.result().join();
            assertThat(world.holdsPattern(dst[1], hashes[1])).as("the third load's block").isTrue();

            byte[][] more = savePatterns(engine, world, rnd, evenBlocks(saved + 1));
            QueryResult big = engine.queryAndBegin("inst", BlockHashes.of(more), 0);
            assertThat(big.hitBlocks()).isEqualTo(saved + 1);
            assertThat(stager.tooLargeRefusals()).as("one block past the buffer").isEqualTo(1);
            long[] bigDst = java.util.Arrays.copyOf(dst, saved + 1);
            bigDst[saved] = 0; // a block of the first save, free to overwrite now
            LayeredLoad large = engine.loadLayered("inst", 0, big.lease(), bigDst);
            assertThat(large.fromStage()).isFalse();
            large.result().join();
            for (int i = 0; i <= saved; i++) {
                assertThat(world.holdsPattern(bigDst[i], more[i])).as("block %d of the unstaged large load", i).isTrue();
            }
            engine.verifyInvariants();
        }
    }

    /**
     * vLLM's cross-layer layout (one tensor, a block's layers back to back: the GPU runners'
     * default with this connector) staged at its lookup the same way: the load reads its staging
     * and lands byte-exact layer by layer.
     */
    @Test
    void aCrossLayerLoadStagedAtItsLookupReadsItsStaging() {
        Random rnd = new Random(83);
        int saved = 16;
        int layers = 4;
        long piece = 16 << 10;
        java.util.concurrent.atomic.AtomicReference<TransferEngine> made = new java.util.concurrent.atomic.AtomicReference<>();
        try (PegaEngine engine = PegaEngine.create(stagedConfig(saved * layers * 2 * piece, made).poolSize("64mb").build());
                KvWorld world = new KvWorld(memory(), "inst", "ns", KvWorld.Kind.CROSS_LAYER, 1, 1, layers, 2 * saved + 1,
                        piece, 0)) {
            world.register(engine);
            long[] src = evenBlocks(saved);
            long[] dst = oddBlocksReversed(saved);
            byte[][] hashes = savePatterns(engine, world, rnd, src);
            QueryResult q = engine.queryAndBegin("inst", BlockHashes.of(hashes), 0);
            assertThat(engine.staged(q.lease())).as("staged at the lookup").isTrue();
            LayeredLoad load = engine.loadLayered("inst", 0, q.lease(), dst);
            assertThat(load.fromStage()).as("the load reads its staging").isTrue();
            awaitEveryLayerAndCheck(load, world, layers, src, dst, hashes);
            assertThat(made.get().stager().failedStagings()).isZero();
            engine.verifyInvariants();
        }
    }

    /** Blocks 0, 2, 4, ...: {@code n} of them. */
    private static long[] evenBlocks(int n) {
        long[] ids = new long[n];
        for (int i = 0; i < n; i++) {
            ids[i] = 2L * i;
        }
        return ids;
    }

    /** Blocks 2n-1, 2n-3, ..., 1: where {@link #evenBlocks} load back, in reverse. */
    private static long[] oddBlocksReversed(int n) {
        long[] ids = new long[n];
        for (int i = 0; i < n; i++) {
            ids[i] = 2L * (n - 1 - i) + 1;
        }
        return ids;
    }

    /** Fills each block of {@code src} with its hash's pattern and saves them under fresh hashes, returned. */
    private static byte[][] savePatterns(PegaEngine engine, KvWorld world, Random rnd, long[] src) {
        byte[][] hashes = KvWorld.randomHashes(rnd, src.length);
        for (int i = 0; i < src.length; i++) {
            world.fillPattern(src[i], hashes[i]);
        }
        engine.save("inst", 0, src, BlockHashes.of(hashes)).join();
        return hashes;
    }

    /** Waits for each layer from this thread, checking it landed in every block, then the whole load. */
    private static void awaitEveryLayerAndCheck(LayeredLoad load, KvWorld world, int layers, long[] src, long[] dst,
            byte[][] hashes) {
        for (int layer = 0; layer < layers; layer++) {
            load.awaitLayer(layer, 0);
            for (int i = 0; i < dst.length; i++) {
                assertThat(world.holdsLayer(dst[i], hashes[i], layer)).as("layer %d of block %d after its wait", layer, dst[i])
                        .isTrue();
            }
        }
        assertThat(load.result().join().blocks()).isEqualTo(dst.length);
        for (int i = 0; i < dst.length; i++) {
            assertThat(world.holdsPattern(dst[i], hashes[i])).as("block %d loaded into %d", src[i], dst[i]).isTrue();
        }
    }

    @Test
    void concurrentSavesAndLoadsKeepTheirBytes() throws Exception {
        int threads = 4;
        int rounds = 25;
        int chain = 8;
        try (PegaEngine engine = PegaEngine.create(config().poolSize("64mb").build());
                KvWorld world = new KvWorld(memory(), "inst", "ns", KvWorld.Kind.SPLIT_KFIRST, 2, 1, 3,
                        threads * 2 * chain, 8192, 0)) {
            world.register(engine);
            ExecutorService pool = Executors.newFixedThreadPool(threads);
            List<Future<Integer>> verified = new ArrayList<>();
            for (int t = 0; t < threads; t++) {
                int thread = t;
                verified.add(pool.submit(() -> {
                    Random rnd = new Random(1000 + thread);
                    long srcBase = (long) thread * 2 * chain;
                    long dstBase = srcBase + chain;
                    int checked = 0;
                    for (int r = 0; r < rounds; r++) {
                        byte[][] hashes = KvWorld.randomHashes(rnd, chain);
                        long[] src = new long[chain];
                        long[] dst = new long[chain];
                        for (int i = 0; i < chain; i++) {
                            src[i] = srcBase + i;
                            dst[i] = dstBase + i;
                            world.fillPattern(src[i], hashes[i]);
                        }
                        CompletableFuture<CopyResult> s0 = engine.save("inst", 0, src, BlockHashes.of(hashes));
                        CompletableFuture<CopyResult> s1 = engine.save("inst", 1, src, BlockHashes.of(hashes));
                        s0.join();
                        s1.join();
                        QueryResult q = engine.query("inst", BlockHashes.of(hashes));
                        assertThat(q.hitBlocks()).isEqualTo(chain);
                        CompletableFuture<CopyResult> l0 = engine.load("inst", 0, q.lease(), dst);
                        CompletableFuture<CopyResult> l1 = engine.load("inst", 1, q.lease(), dst);
                        l0.join();
                        l1.join();
                        for (int i = 0; i < chain; i++) {
                            assertThat(world.holdsPattern(dst[i], hashes[i])).as("thread %d round %d block %d", thread, r, i).isTrue();
                            checked++;
                        }
                    }
                    return checked;
                }));
            }
            int total = 0;
            for (Future<Integer> f : verified) {
                total += f.get();
            }
            pool.shutdown();
            assertThat(total).isEqualTo(threads * rounds * chain);
            assertThat(engine.stats().get(Gauge.PINNED_BLOCKS)).isZero();
            engine.verifyInvariants();
        }
    }
}
