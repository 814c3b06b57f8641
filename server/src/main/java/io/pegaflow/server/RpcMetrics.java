package io.pegaflow.server;

import io.grpc.ForwardingServerCall;
import io.grpc.Metadata;
import io.grpc.ServerCall;
import io.grpc.ServerCallHandler;
import io.grpc.ServerInterceptor;
import io.grpc.Status;
import io.prometheus.metrics.core.metrics.Counter;
import io.prometheus.metrics.core.metrics.Histogram;
import io.prometheus.metrics.model.registry.PrometheusRegistry;

/**
 * {@code pegaflow_rpc_requests_total{method,status}} and {@code pegaflow_rpc_duration_seconds{method}}
 * for every call, gRPC or local socket (the same method names and gRPC status names).
 */
final class RpcMetrics implements ServerInterceptor {
    final Counter requests;
    final Histogram duration;

    RpcMetrics(PrometheusRegistry registry) {
        requests = Counter.builder().name("pegaflow_rpc_requests").help("gRPC calls by method and status")
                .labelNames("method", "status").withoutExemplars().register(registry);
        duration = Histogram.builder().name("pegaflow_rpc_duration_seconds").help("gRPC call duration")
                .classicUpperBounds(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1, 5)
                .labelNames("method").withoutExemplars().register(registry);
    }

    /** A call that did not go through gRPC (the local socket). */
    void record(String method, String status, long nanos) {
        requests.labelValues(method, status).inc();
        duration.labelValues(method).observe(nanos / 1e9);
    }

    @Override
    public <Q, R> ServerCall.Listener<Q> interceptCall(ServerCall<Q, R> call, Metadata headers, ServerCallHandler<Q, R> next) {
        String method = call.getMethodDescriptor().getBareMethodName();
        long start = System.nanoTime();
        return next.startCall(new ForwardingServerCall.SimpleForwardingServerCall<>(call) {
            @Override
            public void close(Status status, Metadata trailers) {
                requests.labelValues(method, status.getCode().name()).inc();
                duration.labelValues(method).observe((System.nanoTime() - start) / 1e9);
                super.close(status, trailers);
            }
        }, headers);
    }
}
