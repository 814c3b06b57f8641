package io.pegaflow.server;

import io.prometheus.metrics.core.metrics.CounterWithCallback;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.time.Duration;
import java.util.concurrent.atomic.AtomicLongArray;
import java.util.function.LongSupplier;

/**
 * Requests refused before they reach the service (no or a wrong credential, a message that
 * does not parse, a local-socket connection that never authenticates or stalls mid-frame, one
 * over the connection cap): counted on {@code /metrics}
 * ({@code pegaflow_rejected_requests_total{reason}}) and logged at most once per interval as
 * one line of counts, never a line or a stack trace per request, so a client that needs no
 * credential to send them cannot fill the log. Thread-safe.
 */
final class Rejections {
    /** Why a request was refused (the metric's label). */
    enum Reason {
        UNAUTHENTICATED("unauthenticated"),
        OPERATOR_ONLY("operator_only"),
        MALFORMED("malformed"),
        LOCAL_UNAUTHENTICATED("local_unauthenticated"),
        LOCAL_STALLED("local_stalled"),
        LOCAL_CONNECTION_CAP("local_connection_cap");

        final String label;

        Reason(String label) {
            this.label = label;
        }
    }

    static final Duration LOG_INTERVAL = Duration.ofSeconds(10);
    private static final System.Logger LOG = System.getLogger(Rejections.class.getName());
    private static final Reason[] REASONS = Reason.values();

    private final AtomicLongArray total = new AtomicLongArray(REASONS.length);
    private final long intervalNanos;
    private final LongSupplier clock;
    // --- guarded by this ---
    private final long[] unlogged = new long[REASONS.length];
    private long lastLog;
    private boolean logged;

    Rejections(Duration interval, LongSupplier nanoClock) {
        this.intervalNanos = interval.toNanos();
        this.clock = nanoClock;
    }

    Rejections() {
        this(LOG_INTERVAL, System::nanoTime);
    }

    /** Counts {@code reason}; logs the counts since the last line when an interval has passed (the first one at once). */
    void record(Reason reason, String detail) {
        total.incrementAndGet(reason.ordinal());
        String line = null;
        synchronized (this) {
            unlogged[reason.ordinal()]++;
            long now = clock.getAsLong();
            if (!logged || now - lastLog >= intervalNanos) {
                StringBuilder b = new StringBuilder("refused requests");
                b.append(logged ? " in the last " + Duration.ofNanos(now - lastLog).toSeconds() + " s:" : ":");
                for (int i = 0; i < REASONS.length; i++) {
                    if (unlogged[i] > 0) {
                        b.append(' ').append(REASONS[i].label).append(' ').append(unlogged[i]);
                        unlogged[i] = 0;
                    }
                }
                line = b.append(" (the latest: ").append(detail).append("; at most one line per ")
                        .append(intervalNanos / 1_000_000_000L).append(" s, counts on /metrics)").toString();
                logged = true;
                lastLog = now;
            }
        }
        if (line != null) {
            LOG.log(System.Logger.Level.WARNING, line);
        }
    }

    long count(Reason reason) {
        return total.get(reason.ordinal());
    }

    void register(PrometheusRegistry registry) {
        CounterWithCallback.builder().name("pegaflow_rejected_requests")
                .help("requests refused before the service: no or a wrong credential, malformed, stalled, over a cap")
                .labelNames("reason").callback(cb -> {
                    for (Reason r : REASONS) {
                        cb.call(total.get(r.ordinal()), r.label);
                    }
                }).register(registry);
    }
}
