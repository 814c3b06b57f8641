package io.pegaflow.engine;

import static org.assertj.core.api.Assertions.assertThat;

import io.pegaflow.engine.metrics.Gauge;
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
            long[] src = new long[saved];
            long[] dst = new long[saved];
            for (int i = 0; i < saved; i++) {
                src[i] = 2L * i;
                dst[i] = 2L * (saved - 1 - i) + 1;
            }
            byte[][] hashes = KvWorld.randomHashes(rnd, saved);
            for (int i = 0; i < saved; i++) {
                world.fillPattern(src[i], hashes[i]);
            }
            engine.save("inst", 0, src, BlockHashes.of(hashes)).join();
            QueryResult q = engine.query("inst", BlockHashes.of(hashes));
            assertThat(q.hitBlocks()).isEqualTo(saved);
            LayeredLoad load = engine.loadLayered("inst", 0, q.lease(), dst);
            for (int layer = 0; layer < 8; layer++) {
                load.awaitLayer(layer, 0);
                for (int i = 0; i < saved; i++) {
                    assertThat(world.holdsLayer(dst[i], hashes[i], layer)).as("layer %d of block %d after its wait", layer, dst[i])
                            .isTrue();
                }
            }
            assertThat(load.result().join().blocks()).isEqualTo(saved);
            for (int i = 0; i < saved; i++) {
                assertThat(world.holdsPattern(dst[i], hashes[i])).as("block %d loaded into %d", src[i], dst[i]).isTrue();
            }
            engine.verifyInvariants();
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
