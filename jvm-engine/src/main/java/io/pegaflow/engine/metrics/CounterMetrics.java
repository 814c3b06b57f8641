package io.pegaflow.engine.metrics;

import java.util.EnumMap;
import java.util.Map;
import java.util.concurrent.atomic.LongAdder;
import java.util.function.LongSupplier;

/** In-memory {@link MetricsSink}: striped counters and gauge callbacks, read by snapshot. */
public final class CounterMetrics implements MetricsSink {
    private final LongAdder[] counters = new LongAdder[Counter.values().length];
    private final LongSupplier[] gauges = new LongSupplier[Gauge.values().length];

    public CounterMetrics() {
        for (int i = 0; i < counters.length; i++) {
            counters[i] = new LongAdder();
        }
    }

    @Override
    public void add(Counter counter, long delta) {
        counters[counter.ordinal()].add(delta);
    }

    @Override
    public void gauge(Gauge gauge, LongSupplier value) {
        gauges[gauge.ordinal()] = value;
    }

    public long get(Counter counter) {
        return counters[counter.ordinal()].sum();
    }

    /** Current value of a gauge, or 0 when nobody registered it. */
    public long get(Gauge gauge) {
        LongSupplier s = gauges[gauge.ordinal()];
        return s == null ? 0 : s.getAsLong();
    }

    public Map<Counter, Long> counters() {
        Map<Counter, Long> m = new EnumMap<>(Counter.class);
        for (Counter c : Counter.values()) {
            m.put(c, get(c));
        }
        return m;
    }

    public Map<Gauge, Long> gauges() {
        Map<Gauge, Long> m = new EnumMap<>(Gauge.class);
        for (Gauge g : Gauge.values()) {
            m.put(g, get(g));
        }
        return m;
    }
}
