package io.pegaflow.server;

import io.pegaflow.engine.metrics.DistinctBlocks;
import io.prometheus.metrics.core.metrics.GaugeWithCallback;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.util.function.LongSupplier;

/**
 * The hit-rate ceiling on /metrics, per window of the store's {@link DistinctBlocks}:
 * {@code pegaflow_distinct_blocks{window}} (blocks asked for, estimated),
 * {@code pegaflow_window_block_lookups{window}} and {@code pegaflow_hit_rate_ceiling{window}}
 * (the share of lookups a cache of unbounded size would have served). Why: the hit rate alone
 * does not say whether a bigger pool would help; the ceiling does.
 */
final class CeilingMetrics {
    private CeilingMetrics() {}

    /** What one gauge reads from a window at a time. */
    private interface Reading {
        double of(DistinctBlocks.Window window, long now);
    }

    static void register(PrometheusRegistry registry, DistinctBlocks distinct, LongSupplier clock) {
        gauge(registry, distinct, clock, "pegaflow_distinct_blocks",
                "distinct blocks asked for within the window (HyperLogLog estimate)", DistinctBlocks.Window::distinct);
        gauge(registry, distinct, clock, "pegaflow_window_block_lookups",
                "block lookups (every hash of every query) within the window", DistinctBlocks.Window::lookups);
        gauge(registry, distinct, clock, "pegaflow_hit_rate_ceiling",
                "share of the window's block lookups whose block was asked for before within it: the hit rate a pool "
                        + "of unbounded size would reach", DistinctBlocks.Window::ceiling);
    }

    private static void gauge(PrometheusRegistry registry, DistinctBlocks distinct, LongSupplier clock, String name,
            String help, Reading reading) {
        GaugeWithCallback.builder().name(name).help(help).labelNames("window").callback(cb -> {
            long now = clock.getAsLong();
            for (DistinctBlocks.Window w : distinct.windows()) {
                cb.call(reading.of(w, now), w.name());
            }
        }).register(registry);
    }
}
