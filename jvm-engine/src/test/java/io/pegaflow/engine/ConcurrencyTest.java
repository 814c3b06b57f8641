package io.pegaflow.engine;

import static org.assertj.core.api.Assertions.assertThat;

import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.metrics.Gauge;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.Test;

/**
 * Several threads save, query, load and release over shared conversation prefixes, on two
 * instances of one namespace (TP 2 each), with a pool far smaller than the data so eviction
 * runs constantly. Checked: every loaded byte is the content saved for its hash (a pinned
 * block evicted and reused would show up here), pool and pin accounting return to exact
 * values, and pressure really happened.
 */
class ConcurrencyTest {
    private static final int THREADS = 4;
    private static final int ITERATIONS = 300;
    private static final int CHAINS = 24;
    private static final int CHAIN_LENGTH = 12;
    private static final long SEED = 20261130L;

    @Test
    void concurrentTrafficUnderEvictionPressureKeepsEveryByteAndEveryCount() throws Exception {
        System.out.println("ConcurrencyTest seed " + SEED);
        Random setup = new Random(SEED);
        byte[][][] chains = new byte[CHAINS][][];
        for (int c = 0; c < CHAINS; c++) {
            chains[c] = KvWorld.randomHashes(setup, CHAIN_LENGTH);
        }
        // One block = 2 tp ranks x 2 layers x 2 segments x 256 B = 2 KiB; 288 unique blocks.
        EngineConfig config = EngineConfig.builder().poolSize("192kb").copyThreads(2).sweepInterval(Duration.ofMillis(5)).build();
        try (PegaEngine engine = PegaEngine.create(config);
                KvWorld a = new KvWorld("a", "shared", KvWorld.Kind.SPLIT_KFIRST, 2, 1, 2, THREADS * 2 * CHAIN_LENGTH, 256, 0);
                KvWorld b = new KvWorld("b", "shared", KvWorld.Kind.SPLIT_KFIRST, 2, 1, 2, THREADS * 2 * CHAIN_LENGTH, 256, 0)) {
            a.register(engine);
            b.register(engine);
            AtomicLong verifiedBlocks = new AtomicLong();
            AtomicLong exhausted = new AtomicLong();
            ExecutorService threads = Executors.newFixedThreadPool(THREADS);
            List<Future<?>> done = new ArrayList<>();
            for (int t = 0; t < THREADS; t++) {
                int thread = t;
                KvWorld world = t % 2 == 0 ? a : b;
                String inst = world.spec.instanceId();
                done.add(threads.submit(() -> {
                    Random rnd = new Random(SEED + thread);
                    long srcBase = (long) thread * 2 * CHAIN_LENGTH;
                    long dstBase = srcBase + CHAIN_LENGTH;
                    for (int it = 0; it < ITERATIONS; it++) {
                        byte[][] chain = chains[rnd.nextInt(CHAINS)];
                        int len = 1 + rnd.nextInt(CHAIN_LENGTH);
                        byte[][] prefix = java.util.Arrays.copyOf(chain, len);
                        QueryResult q = engine.query(inst, BlockHashes.of(prefix));
                        if (q.hasLease()) {
                            long[] dst = new long[q.hitBlocks()];
                            for (int i = 0; i < dst.length; i++) {
                                dst[i] = dstBase + i;
                            }
                            int mode = rnd.nextInt(8);
                            if (mode == 0) {
                                engine.release(inst, q.lease());
                            } else if (mode == 1) {
                                engine.load(inst, 0, q.lease(), dst).join();
                                engine.release(inst, q.lease());
                                for (int i = 0; i < dst.length; i++) {
                                    assertThat(world.holdsPattern(world.workers.get(0), dst[i], prefix[i])).isTrue();
                                }
                            } else {
                                CompletableFuture<CopyResult> l0 = engine.load(inst, 0, q.lease(), dst);
                                CompletableFuture<CopyResult> l1 = engine.load(inst, 1, q.lease(), dst);
                                l0.join();
                                l1.join();
                                for (int i = 0; i < dst.length; i++) {
                                    assertThat(world.holdsPattern(dst[i], prefix[i]))
                                            .as("thread %d iteration %d block %d", thread, it, i).isTrue();
                                }
                                verifiedBlocks.addAndGet(dst.length);
                            }
                        }
                        int missing = len - q.hitBlocks();
                        if (missing > 0) {
                            long[] src = new long[missing];
                            byte[][] hashes = new byte[missing][];
                            for (int i = 0; i < missing; i++) {
                                src[i] = srcBase + i;
                                hashes[i] = prefix[q.hitBlocks() + i];
                                world.fillPattern(src[i], hashes[i]);
                            }
                            try {
                                CompletableFuture<CopyResult> s0 = engine.save(inst, 0, src, BlockHashes.of(hashes));
                                CompletableFuture<CopyResult> s1 = engine.save(inst, 1, src, BlockHashes.of(hashes));
                                s0.join();
                                s1.join();
                            } catch (PoolExhaustedException e) {
                                exhausted.incrementAndGet();
                            }
                        }
                    }
                    return null;
                }));
            }
            for (Future<?> f : done) {
                f.get();
            }
            threads.shutdown();
            engine.verifyInvariants();
            EngineStats stats = engine.stats();
            assertThat(stats.get(Gauge.ACTIVE_LEASES)).isZero();
            assertThat(stats.get(Gauge.PINNED_BLOCKS)).isZero();
            assertThat(stats.get(Counter.EVICTIONS)).as("pool pressure").isGreaterThan(100);
            assertThat(stats.get(Counter.HIT_BLOCKS)).isPositive();
            assertThat(verifiedBlocks.get()).as("blocks loaded and verified byte-exact").isGreaterThan(200);
            assertThat(stats.get(Gauge.POOL_USED_BYTES)).isLessThanOrEqualTo(stats.get(Gauge.POOL_CAPACITY_BYTES));
            System.out.printf("ConcurrencyTest: evictions=%d hits=%d verified=%d exhausted=%d%n",
                    stats.get(Counter.EVICTIONS), stats.get(Counter.HIT_BLOCKS), verifiedBlocks.get(), exhausted.get());
        }
    }
}
