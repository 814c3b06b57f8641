package io.pegaflow.engine;

import static org.assertj.core.api.Assertions.assertThat;

import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.metrics.CounterMetrics;
import io.pegaflow.engine.metrics.Gauge;
import io.pegaflow.engine.store.LocalStore;
import java.time.Duration;
import java.util.Random;
import org.junit.jupiter.api.Test;

/** The store contract on the embedded control plane: {@link PegaEngine#create} and a bare {@link LocalStore}. */
class LocalStoreContractTest extends BlockStoreContract {
    private PegaEngine engine;
    private LocalStore store;

    @Override
    protected PegaEngine engine(EngineConfig config) {
        return engine = PegaEngine.create(config);
    }

    @Override
    protected BlockStore store(EngineConfig config) {
        return store = new LocalStore(config, config.poolBytes());
    }

    @Override
    protected void verifyInvariants() {
        if (store != null) {
            store.verifyInvariants();
        } else {
            engine.verifyInvariants();
        }
    }

    @Override
    protected int openOperations() {
        return store.openOperations(); // an embedded engine does not expose its store's
    }

    @Override
    protected void sweep() {
        if (store != null) {
            store.sweep();
        } else {
            engine.sweep();
        }
    }

    @Override
    protected boolean followsTheConfiguredClock() {
        return true;
    }

    /** Embedded only: the server feeds its own Prometheus sink (ServerTest checks /metrics). */
    @Test
    void theConfiguredMetricsSinkSeesEveryGaugeAndCounter() {
        CounterMetrics sink = new CounterMetrics();
        Random rnd = new Random(42);
        try (PegaEngine e = PegaEngine.create(EngineConfig.builder().poolSize("64kb").metrics(sink).sweepInterval(Duration.ZERO).build());
                KvWorld world = new KvWorld("inst", "ns", KvWorld.Kind.MLA, 1, 1, 2, 32, 256, 0)) {
            world.register(e);
            byte[][] h = KvWorld.randomHashes(rnd, 3);
            for (int i = 0; i < h.length; i++) {
                world.fillPattern(i, h[i]);
            }
            e.save("inst", 0, new long[] {0, 1, 2}, BlockHashes.of(h)).join();
            e.query("inst", BlockHashes.of(h));
            assertThat(sink.get(Gauge.RESIDENT_BLOCKS)).isEqualTo(3);
            assertThat(sink.get(Gauge.PINNED_BLOCKS)).isEqualTo(3);
            assertThat(sink.get(Gauge.POOL_USED_BYTES)).isEqualTo(3 * 2 * 256);
            assertThat(sink.get(Counter.SAVE_BLOCKS)).isEqualTo(3);
            EngineStats stats = e.stats();
            for (Gauge g : Gauge.values()) {
                assertThat(sink.get(g)).as(g.metricName()).isEqualTo(stats.get(g));
            }
            for (Counter c : Counter.values()) {
                assertThat(sink.get(c)).as(c.metricName()).isEqualTo(stats.get(c));
            }
        }
    }
}
