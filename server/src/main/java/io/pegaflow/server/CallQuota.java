package io.pegaflow.server;

import io.grpc.ForwardingServerCallListener;
import io.grpc.Metadata;
import io.grpc.ServerCall;
import io.grpc.ServerCallHandler;
import io.grpc.ServerInterceptor;
import io.pegaflow.client.Errors;
import io.pegaflow.engine.QuotaExceededException;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Concurrent calls per tenant ({@link Caller#tenant}), at most {@code --max-calls-per-tenant}:
 * as an interceptor, gRPC calls in flight (Health and the liveness sessions aside: a session
 * is held open for its instance's life; runs after {@link Credentials}, which puts the caller
 * in the context); a second instance counts the local socket's connections (each serves one
 * call at a time; kept apart because a client pools idle ones). One more is refused naming the
 * quota; other tenants are not affected. Thread-safe.
 */
final class CallQuota implements ServerInterceptor {
    private final int max;
    private final Map<String, AtomicInteger> inFlight = new ConcurrentHashMap<>();

    CallQuota(int max) {
        this.max = max;
    }

    /** Takes one of {@code tenant}'s calls; false when it has {@code max} in flight. */
    boolean tryAcquire(String tenant) {
        AtomicInteger n = inFlight.computeIfAbsent(tenant, k -> new AtomicInteger());
        if (n.incrementAndGet() > max) {
            n.decrementAndGet();
            return false;
        }
        return true;
    }

    void release(String tenant) {
        inFlight.computeIfPresent(tenant, (k, n) -> n.decrementAndGet() <= 0 ? null : n);
    }

    /** Tenants with calls in flight now. */
    java.util.Set<String> tenants() {
        return java.util.Set.copyOf(inFlight.keySet());
    }

    int inFlight(String tenant) {
        AtomicInteger n = inFlight.get(tenant);
        return n == null ? 0 : n.get();
    }

    QuotaExceededException refusal(String what) {
        return new QuotaExceededException(what + ": this tenant has " + max + " " + (what.startsWith("a local-socket")
                ? "local-socket connections open" : "calls in flight") + ", the most one may (--max-calls-per-tenant); "
                + "try again when one ends");
    }

    @Override
    public <Q, R> ServerCall.Listener<Q> interceptCall(ServerCall<Q, R> call, Metadata headers, ServerCallHandler<Q, R> next) {
        String method = call.getMethodDescriptor().getBareMethodName();
        if (method.equals("Health") || method.equals("Session")) {
            return next.startCall(call, headers);
        }
        String tenant = Credentials.CALLER.get().tenant();
        if (!tryAcquire(tenant)) {
            io.grpc.StatusRuntimeException refused = Errors.toStatus(refusal(method));
            call.close(refused.getStatus(), refused.getTrailers());
            return new ServerCall.Listener<>() {};
        }
        java.util.concurrent.atomic.AtomicBoolean done = new java.util.concurrent.atomic.AtomicBoolean();
        Runnable end = () -> {
            if (done.compareAndSet(false, true)) {
                release(tenant);
            }
        };
        ServerCall.Listener<Q> inner;
        try {
            inner = next.startCall(call, headers);
        } catch (RuntimeException e) {
            end.run();
            throw e;
        }
        return new ForwardingServerCallListener.SimpleForwardingServerCallListener<>(inner) {
            @Override
            public void onComplete() {
                try {
                    super.onComplete();
                } finally {
                    end.run();
                }
            }

            @Override
            public void onCancel() {
                try {
                    super.onCancel();
                } finally {
                    end.run();
                }
            }
        };
    }
}
