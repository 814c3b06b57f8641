package io.pegaflow.engine;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.metrics.Gauge;
import io.pegaflow.engine.store.RemoteTier;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * Request-owned prefix queries (the native engine's {@code query_request}) and the flush
 * barrier on an embedded engine: all-or-nothing waits until the whole prefix is there, then
 * leases all of it; the wait limit ends it with nothing leased; a poll must repeat its hashes;
 * cancel and the stale sweep forget requests; no answer leaves a lease behind.
 */
class PrefixRequestsTest {
    private final FakeClock clock = new FakeClock();
    private PegaEngine engine;
    private KvWorld world;
    private byte[][] hashes;
    private PrefixRequests requests;

    @BeforeEach
    void setUp() {
        engine = PegaEngine.create(EngineConfig.builder().poolSize("4mb").sweepInterval(Duration.ZERO).build());
        world = new KvWorld("inst", "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 2, 16, 128, 0);
        world.register(engine);
        hashes = KvWorld.randomHashes(new Random(3), 6);
        for (int i = 0; i < 6; i++) {
            world.fillPattern(i, hashes[i]);
        }
        requests = new PrefixRequests(Duration.ofSeconds(30).toNanos(), Duration.ofMinutes(5).toNanos(), clock);
    }

    @AfterEach
    void tearDown() {
        engine.close();
        world.close();
    }

    private void save(int from, int to) {
        long[] ids = new long[to - from];
        byte[][] hs = new byte[to - from][];
        for (int i = from; i < to; i++) {
            ids[i - from] = i;
            hs[i - from] = hashes[i];
        }
        engine.save("inst", 0, ids, BlockHashes.of(hs)).join();
    }

    private long leases() {
        return engine.stats().get(Gauge.ACTIVE_LEASES);
    }

    @Test
    void allOrNothingLoadsUntilTheWholePrefixIsSavedThenLeasesAllOfIt() {
        save(0, 4);
        BlockHashes all = BlockHashes.of(hashes);
        PrefixRequests.Answer a = requests.query(engine, "inst", "r1", all, true);
        assertThat(a).isEqualTo(new PrefixRequests.Answer(PrefixRequests.State.LOADING, 4, 2, null));
        assertThat(leases()).isZero();
        assertThatThrownBy(() -> requests.query(engine, "inst", "r1", all.slice(0, 5), true))
                .isInstanceOf(InvalidArgumentException.class)
                .hasMessageContaining("expected the hashes it started with");
        save(4, 6);
        engine.flush(5000);
        a = requests.query(engine, "inst", "r1", all, false); // the first query's all-or-nothing holds
        assertThat(a.state()).isEqualTo(PrefixRequests.State.READY);
        assertThat(a.hitBlocks()).isEqualTo(6);
        assertThat(a.lease()).isNotNull();
        assertThat(requests.loading()).isZero();
        engine.release("inst", a.lease());
        assertThat(leases()).isZero();
    }

    @Test
    void theWaitLimitEndsAnAllOrNothingRequestWithNothingLeased() {
        save(0, 3);
        BlockHashes all = BlockHashes.of(hashes);
        assertThat(requests.query(engine, "inst", "r", all, true).state()).isEqualTo(PrefixRequests.State.LOADING);
        clock.advance(Duration.ofSeconds(31));
        PrefixRequests.Answer a = requests.query(engine, "inst", "r", all, true);
        assertThat(a).isEqualTo(new PrefixRequests.Answer(PrefixRequests.State.READY, 0, 6, null));
        assertThat(leases()).isZero();
        assertThat(requests.loading()).isZero();
    }

    @Test
    void aPlainRequestIsReadyAtOnceWithItsPrefixAndIdsAreScopedByInstance() {
        save(0, 2);
        PrefixRequests.Answer a = requests.query(engine, "inst", "r", BlockHashes.of(hashes), false);
        assertThat(a.state()).isEqualTo(PrefixRequests.State.READY);
        assertThat(a.hitBlocks()).isEqualTo(2);
        assertThat(a.missingBlocks()).isEqualTo(4);
        engine.release("inst", a.lease());
        PrefixRequests.Answer miss = requests.query(engine, "inst", "r", BlockHashes.of(hashes[5]), false);
        assertThat(miss).isEqualTo(new PrefixRequests.Answer(PrefixRequests.State.READY, 0, 1, null));
        assertThatThrownBy(() -> requests.query(engine, "other", "r", BlockHashes.of(hashes), false))
                .isInstanceOf(UnknownInstanceException.class);
        assertThat(leases()).isZero();
    }

    @Test
    void cancelAndTheStaleSweepForgetRequests() {
        BlockHashes all = BlockHashes.of(hashes);
        requests.query(engine, "inst", "a", all, true);
        requests.query(engine, "inst", "b", all, true);
        assertThat(requests.loading()).isEqualTo(2);
        assertThat(requests.cancel("inst", "a")).isTrue();
        assertThat(requests.cancel("inst", "a")).isFalse();
        clock.advance(Duration.ofMinutes(6));
        assertThat(requests.sweep()).isEqualTo(1);
        assertThat(requests.loading()).isZero();
        assertThatThrownBy(() -> requests.query(engine, "inst", "", all, false))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("request id '' is empty");
    }

    @Test
    void flushWaitsForSavesStartedBeforeItThenFlushesTheRemoteTier() {
        // a remote tier that records how many blocks were advertised when it was asked to flush
        List<Integer> advertisedAtFlush = new ArrayList<>();
        AtomicInteger advertised = new AtomicInteger();
        engine.localStore().attachRemote(new RemoteTier() {
            @Override
            public boolean missed(String namespace, BlockHashes h, int from) {
                return false;
            }

            @Override
            public void resident(String namespace, byte[] hash) {
                advertised.incrementAndGet();
            }

            @Override
            public void evicted(String namespace, byte[] hash) {}

            @Override
            public void flush() {
                advertisedAtFlush.add(advertised.get());
            }
        }, engine.poolMemory());
        long[] ids = {0, 1, 2, 3, 4, 5};
        var f = engine.save("inst", 0, ids, BlockHashes.of(hashes));
        engine.flush(-1);
        assertThat(f).isDone();
        assertThat(advertisedAtFlush).as("the tier flushed once, after the 6 saved blocks were advertised")
                .containsExactly(6);
        QueryResult q = engine.query("inst", BlockHashes.of(hashes));
        assertThat(q.hitBlocks()).isEqualTo(6);
        engine.release("inst", q.lease());
    }

    @Test
    void aRemoteTierThatDoesNotConfirmIsATimeoutNamedAsSuch() {
        engine.localStore().attachRemote(new RemoteTier() {
            @Override
            public boolean missed(String namespace, BlockHashes h, int from) {
                return false;
            }

            @Override
            public void resident(String namespace, byte[] hash) {}

            @Override
            public void evicted(String namespace, byte[] hash) {}

            @Override
            public void flush() throws Exception {
                throw new java.util.concurrent.TimeoutException("registry flush not done in 20 s");
            }
        }, engine.poolMemory());
        assertThatThrownBy(() -> engine.flush(1000))
                .isInstanceOfSatisfying(PegaflowException.class, e -> assertThat(e.code()).isEqualTo(ErrorCode.TIMEOUT))
                .hasMessageContaining("the cluster registry did not confirm in time");
    }
}
