package io.pegaflow.engine.metrics;

import java.util.function.LongSupplier;

/**
 * The one interface through which the engine reports metrics. The default
 * {@link CounterMetrics} keeps them in memory (embedded mode, tests, the workload report);
 * the server plugs in a Prometheus-backed sink. Implementations must be thread-safe and
 * cheap: {@link #add} is called on hot paths (copy completion, query).
 */
public interface MetricsSink {
    void add(Counter counter, long delta);

    /** Registers the callback that yields a gauge's current value. Called once per gauge. */
    void gauge(Gauge gauge, LongSupplier value);

    /** One observation of a distribution, in nanoseconds (a sink without histograms ignores it). */
    default void observe(Histogram histogram, long nanos) {}
}
