package io.pegaflow.server;

import static org.assertj.core.api.Assertions.assertThat;

import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.metrics.Histogram;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import io.prometheus.metrics.model.snapshots.Labels;
import org.junit.jupiter.api.Test;

/**
 * Every metric the server registers is built without exemplars: nothing in the server traces,
 * and an exemplar sampler on an increment sat inside each answer of a query that came after an
 * idle stretch (docs/benchmarks/README.md, "A spaced-out query's answer in the server"). A
 * metric with exemplars keeps one given explicitly; these must keep none.
 */
class MetricsExemplarsTest {
    private static final Labels TRACE = Labels.of("trace_id", "0af7651916cd43dd8448eb211c80319c", "span_id", "b7ad6b7169203331");

    @Test
    void theEnginesCountersAndHistogramsKeepNoExemplar() {
        PrometheusSink sink = new PrometheusSink(new PrometheusRegistry());
        for (Counter c : Counter.values()) {
            var counter = sink.counter(c);
            counter.incWithExemplar(1, TRACE);
            assertThat(counter.collect().getDataPoints().get(0).getExemplar()).as(c.metricName()).isNull();
        }
        for (Histogram h : Histogram.values()) {
            var histogram = sink.histogram(h);
            histogram.observeWithExemplar(0.001, TRACE);
            assertThat(histogram.collect().getDataPoints().get(0).getExemplars().size()).as(h.metricName()).isZero();
        }
    }

    @Test
    void theCallMetricsKeepNoExemplar() {
        RpcMetrics rpc = new RpcMetrics(new PrometheusRegistry());
        rpc.requests.labelValues("Query", "OK").incWithExemplar(1, TRACE);
        rpc.duration.labelValues("Query").observeWithExemplar(0.0005, TRACE);
        assertThat(rpc.requests.collect().getDataPoints().get(0).getExemplar()).isNull();
        assertThat(rpc.duration.collect().getDataPoints().get(0).getExemplars().size()).isZero();

        AdminEndpoints admin = new AdminEndpoints(null, null, null, null, new PrometheusRegistry());
        admin.requests.labelValues("pins", "200").incWithExemplar(1, TRACE);
        assertThat(admin.requests.collect().getDataPoints().get(0).getExemplar()).isNull();
    }
}
