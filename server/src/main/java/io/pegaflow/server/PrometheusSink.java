package io.pegaflow.server;

import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.metrics.Gauge;
import io.pegaflow.engine.metrics.MetricsSink;
import io.prometheus.metrics.core.metrics.GaugeWithCallback;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.util.EnumMap;
import java.util.Map;
import java.util.function.LongSupplier;

/**
 * The engine's metrics in a Prometheus registry, named by Prometheus conventions: counters
 * are exposed with {@code _total}, durations in seconds ({@code ..._nanoseconds_total}
 * becomes {@code ..._seconds_total}). Without exemplars: nothing in the server traces, so there is
 * no span to attach, and the exemplar sampler's work on every increment sat inside each query's
 * answer (docs/benchmarks/README.md, "A spaced-out query's answer in the server").
 */
final class PrometheusSink implements MetricsSink {
    private final PrometheusRegistry registry;
    private final Map<Counter, io.prometheus.metrics.core.metrics.Counter> counters = new EnumMap<>(Counter.class);
    private final Map<Counter, Double> scale = new EnumMap<>(Counter.class);
    private final Map<io.pegaflow.engine.metrics.Histogram, io.prometheus.metrics.core.metrics.Histogram> histograms =
            new EnumMap<>(io.pegaflow.engine.metrics.Histogram.class);

    PrometheusSink(PrometheusRegistry registry) {
        this.registry = registry;
        for (Counter c : Counter.values()) {
            String name = c.metricName().replaceAll("_total$", "");
            double factor = 1;
            if (name.endsWith("_nanoseconds")) {
                name = name.replaceAll("_nanoseconds$", "_seconds");
                factor = 1e-9;
            }
            counters.put(c, io.prometheus.metrics.core.metrics.Counter.builder().name(name).help(c.help()).withoutExemplars()
                    .register(registry));
            scale.put(c, factor);
        }
        for (io.pegaflow.engine.metrics.Histogram h : io.pegaflow.engine.metrics.Histogram.values()) {
            histograms.put(h, io.prometheus.metrics.core.metrics.Histogram.builder().name(h.metricName()).help(h.help())
                    .classicUpperBounds(h.bounds()).withoutExemplars().register(registry));
        }
    }

    /** The Prometheus counter behind {@code counter} (tests). */
    io.prometheus.metrics.core.metrics.Counter counter(Counter counter) {
        return counters.get(counter);
    }

    /** The Prometheus histogram behind {@code histogram} (tests). */
    io.prometheus.metrics.core.metrics.Histogram histogram(io.pegaflow.engine.metrics.Histogram histogram) {
        return histograms.get(histogram);
    }

    @Override
    public void observe(io.pegaflow.engine.metrics.Histogram histogram, long nanos) {
        histograms.get(histogram).observe(nanos * 1e-9);
    }

    @Override
    public void add(Counter counter, long delta) {
        counters.get(counter).inc(delta * scale.get(counter));
    }

    @Override
    public void gauge(Gauge gauge, LongSupplier value) {
        GaugeWithCallback.builder().name(gauge.metricName()).help(gauge.help())
                .callback(cb -> cb.call(value.getAsLong())).register(registry);
    }
}
