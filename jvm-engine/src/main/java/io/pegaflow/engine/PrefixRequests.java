package io.pegaflow.engine;

import java.util.Iterator;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.LongSupplier;

/**
 * Prefix queries that belong to a request, for engines that poll (a native engine's scheduler
 * tick). The first query of a request id starts it; while a lower tier (the SSD tier, another
 * host) is reading the prefix back, or, with {@code allOrNothing}, while the whole prefix is
 * not there yet, the answer is {@link State#LOADING} and the caller asks again with the same
 * id and the same hashes. The answer that ends it is {@link State#READY}: the resident prefix
 * with its lease (or, all-or-nothing, either every block or none), after which the id is free
 * again.
 *
 * <p>A request waits at most {@code maxWaitNanos} from its first query; then it is READY with
 * what is resident (all-or-nothing: nothing, and {@code missing} says how much never came),
 * so a caller that cannot recompute learns it instead of waiting forever. Ids are the caller's
 * (its request ids), scoped by instance: another instance's request of the same name is
 * another request. At most {@link #MAX_REQUESTS} are tracked; {@link #sweep} drops those not
 * polled for {@code staleNanos} (a caller that went away; also checked on queries, once a second), and {@link #cancel} drops one now
 * (admission refused the request).
 */
public final class PrefixRequests {
    /** Requests tracked at once (each holds its hashes): beyond it a new request is refused. */
    public static final int MAX_REQUESTS = 1 << 16;
    /**
     * The one default wait for a prefix, from a request's first "not yet": a native engine's
     * polled request here and a vLLM request in the connector's scheduler side both wait this
     * long before taking what is there (a decode node's wait for the prefill host's blocks, a
     * read-back from SSD or a peer). 10 s: far beyond what recomputing a long prompt costs on a
     * GPU (docs/benchmarks/README.md, the TTFT records), so a longer wait helps no request.
     */
    public static final long DEFAULT_MAX_WAIT_NANOS = 10_000_000_000L;
    /** Default age after which an abandoned request is dropped (the original's stale-prefetch GC). */
    public static final long DEFAULT_STALE_NANOS = 300_000_000_000L;

    public enum State {
        /** Blocks are on their way (a lower tier, or the rest of an all-or-nothing prefix): ask again. */
        LOADING,
        /** The final answer: {@code hitBlocks} leased from hash 0, {@code missingBlocks} not there. */
        READY
    }

    /** {@code lease} is non-null exactly when READY with {@code hitBlocks > 0}. */
    public record Answer(State state, int hitBlocks, int missingBlocks, Token lease) {}

    private record Key(String instanceId, String requestId) {}

    private static final class Pending {
        final BlockHashes hashes;
        final boolean allOrNothing;
        final long firstNanos;
        volatile long lastNanos;

        Pending(BlockHashes hashes, boolean allOrNothing, long now) {
            this.hashes = hashes;
            this.allOrNothing = allOrNothing;
            this.firstNanos = now;
            this.lastNanos = now;
        }
    }

    private static final long SWEEP_EVERY_NANOS = 1_000_000_000L;

    private final Map<Key, Pending> requests = new ConcurrentHashMap<>();
    private volatile long lastSweepNanos;
    private final long maxWaitNanos;
    private final long staleNanos;
    private final LongSupplier clock;

    public PrefixRequests() {
        this(DEFAULT_MAX_WAIT_NANOS, DEFAULT_STALE_NANOS, System::nanoTime);
    }

    public PrefixRequests(long maxWaitNanos, long staleNanos, LongSupplier clock) {
        if (maxWaitNanos < 0 || staleNanos <= 0) {
            throw new InvalidArgumentException("prefix requests: max wait " + maxWaitNanos + " ns, stale after "
                    + staleNanos + " ns; expected >= 0 and > 0");
        }
        this.maxWaitNanos = maxWaitNanos;
        this.staleNanos = staleNanos;
        this.clock = clock;
        this.lastSweepNanos = clock.getAsLong();
    }

    /**
     * Asks for the prefix of {@code hashes} on behalf of request {@code requestId}. A request
     * still LOADING must be polled with the hashes it started with (else
     * {@link InvalidArgumentException}, nothing changes); {@code allOrNothing} is the first
     * query's.
     */
    public Answer query(PegaEngine engine, String instanceId, String requestId, BlockHashes hashes, boolean allOrNothing) {
        Limits.checkName("request id", requestId);
        if (requestId == null || requestId.isEmpty()) {
            throw new InvalidArgumentException("request id '" + requestId + "' is empty; expected the caller's request id");
        }
        if (hashes == null) {
            throw new InvalidArgumentException("query of request '" + requestId + "': hashes must not be null");
        }
        Key key = new Key(instanceId, requestId);
        long now = clock.getAsLong();
        if (now - lastSweepNanos >= SWEEP_EVERY_NANOS) {
            lastSweepNanos = now;
            sweep();
        }
        Pending p = requests.get(key);
        if (p != null && !p.hashes.equals(hashes)) {
            throw new InvalidArgumentException("request '" + requestId + "' of instance '" + instanceId + "' is loading "
                    + p.hashes.count() + " hashes and was polled with " + hashes.count()
                    + " different ones; expected the hashes it started with (cancel it to start over)");
        }
        boolean aon = p != null ? p.allOrNothing : allOrNothing;
        QueryResult q = engine.query(instanceId, hashes);
        int n = hashes.count();
        boolean whole = q.hitBlocks() == n;
        boolean waiting = q.pending() || (aon && !whole);
        if (waiting) {
            long since = p != null ? p.firstNanos : now;
            if (now - since < maxWaitNanos) {
                if (q.hasLease()) {
                    engine.release(instanceId, q.lease()); // an incomplete all-or-nothing prefix is not handed out
                }
                if (p == null) {
                    if (requests.size() >= MAX_REQUESTS) {
                        throw new PegaflowException(ErrorCode.POOL_EXHAUSTED, requests.size() + " prefix requests loading; "
                                + "expected at most " + MAX_REQUESTS + " (finish or cancel some)");
                    }
                    requests.put(key, new Pending(hashes, aon, now));
                } else {
                    p.lastNanos = now;
                }
                return new Answer(State.LOADING, q.hitBlocks(), n - q.hitBlocks(), null);
            }
            // waited long enough: the answer is what is resident now
            requests.remove(key);
            if (aon && !whole || q.pending()) {
                if (q.hasLease()) {
                    engine.release(instanceId, q.lease());
                }
                return new Answer(State.READY, 0, n, null);
            }
        }
        requests.remove(key);
        return new Answer(State.READY, q.hitBlocks(), n - q.hitBlocks(), q.lease());
    }

    /** Forgets a request (admission refused it, the caller went away); true when it was loading. */
    public boolean cancel(String instanceId, String requestId) {
        return requests.remove(new Key(instanceId, requestId)) != null;
    }

    /** Drops requests not polled for the stale age; returns how many. */
    public int sweep() {
        long now = clock.getAsLong();
        int dropped = 0;
        for (Iterator<Pending> it = requests.values().iterator(); it.hasNext(); ) {
            if (now - it.next().lastNanos >= staleNanos) {
                it.remove();
                dropped++;
            }
        }
        return dropped;
    }

    /** Requests loading now. */
    public int loading() {
        return requests.size();
    }
}
