package io.pegaflow.server;

import io.pegaflow.engine.store.LocalStore;
import io.pegaflow.engine.UnknownInstanceException;
import java.time.Duration;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Liveness of clients: each instance's newest Session stream holds a token. When a stream
 * ends without the client unregistering (its process died: the TCP connection closed), the
 * instance is unregistered after {@code grace}, which releases its leases and rolls back its
 * open saves and loads when their plans' hold ends (the client may still be copying), unless
 * a newer session for the same instance started meanwhile.
 */
final class Sessions implements AutoCloseable {
    private final LocalStore store;
    private final Tenants tenants;
    private final Duration grace;
    private final Duration unsessionedTtl;
    private final AtomicLong expired = new AtomicLong();
    private final Map<String, Long> current = new ConcurrentHashMap<>();
    private final AtomicLong tokens = new AtomicLong();
    private final ScheduledExecutorService timer = Executors.newSingleThreadScheduledExecutor(r -> {
        Thread t = new Thread(r, "pegaflow-sessions");
        t.setDaemon(true);
        return t;
    });
    private final AtomicLong cleaned = new AtomicLong();

    Sessions(LocalStore store, Tenants tenants, Duration grace, Duration unsessionedTtl) {
        this.store = store;
        this.tenants = tenants;
        this.grace = grace;
        this.unsessionedTtl = unsessionedTtl;
    }

    /**
     * A client created the instance (registration {@code generation}): unless one of its
     * clients holds a liveness session by {@code unsessionedTtl} from now, it is unregistered
     * then (a raw client that registers and never opens a session left it registered forever;
     * one whose session opened and ended is unregistered after the grace by {@link #ended}).
     */
    void expireUnlessHeld(String instanceId, long generation) {
        timer.schedule(() -> {
            if (!current.containsKey(instanceId)) {
                try {
                    if (tenants.unregisterIf(instanceId, generation, () -> store.unregisterInstance(instanceId))) {
                        expired.incrementAndGet();
                        System.getLogger(Sessions.class.getName()).log(System.Logger.Level.INFO, "instance '" + instanceId
                                + "' unregistered: no client of it opened a liveness session within "
                                + unsessionedTtl.toSeconds() + " s (--unsessioned-instance-ttl-secs)");
                    }
                } catch (UnknownInstanceException alreadyGone) {
                    // unregistered meanwhile
                }
            }
        }, unsessionedTtl.toMillis(), TimeUnit.MILLISECONDS);
    }

    /** Instances unregistered because no client of theirs ever held a session. */
    long expired() {
        return expired.get();
    }

    /** A new session for the instance; it supersedes older ones. */
    long open(String instanceId) {
        long token = tokens.incrementAndGet();
        current.put(instanceId, token);
        return token;
    }

    /** The session's stream ended: clean up after the grace period unless superseded. */
    void ended(String instanceId, long token) {
        timer.schedule(() -> {
            if (current.remove(instanceId, token)) {
                try {
                    tenants.unregister(instanceId, () -> store.unregisterInstance(instanceId));
                    cleaned.incrementAndGet();
                    System.getLogger(Sessions.class.getName()).log(System.Logger.Level.WARNING,
                            "instance '" + instanceId + "' unregistered: the session of its last registrant ended "
                                    + grace.toMillis() + " ms ago (its process exited or lost the connection)");
                } catch (UnknownInstanceException alreadyGone) {
                    // the client unregistered before it went away
                }
            }
        }, grace.toMillis(), TimeUnit.MILLISECONDS);
    }

    /** Instances unregistered because their client went away. */
    long cleaned() {
        return cleaned.get();
    }

    int open() {
        return current.size();
    }

    @Override
    public void close() {
        timer.shutdownNow();
    }
}
