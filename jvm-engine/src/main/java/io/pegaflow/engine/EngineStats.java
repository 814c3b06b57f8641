package io.pegaflow.engine;

import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.metrics.Gauge;
import java.util.Map;

/** A consistent snapshot of the engine's gauges plus its counters since start. */
public record EngineStats(Map<Gauge, Long> gauges, Map<Counter, Long> counters) {
    public long get(Gauge g) {
        return gauges.getOrDefault(g, 0L);
    }

    public long get(Counter c) {
        return counters.getOrDefault(c, 0L);
    }
}
