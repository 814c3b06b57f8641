package io.pegaflow.engine.store;

import io.pegaflow.engine.CopyPlan;
import io.pegaflow.engine.Token;
import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.store.OpenCopy.OpenLoad;
import io.pegaflow.engine.store.OpenCopy.Reservation;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.IdentityHashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.function.LongSupplier;
import java.util.function.ObjLongConsumer;
import java.util.function.Predicate;

/**
 * The saves and loads between their plan and {@link LocalStore#endCopy}, by plan id, and the
 * orphans of unregistered instances held until their plan's hold ends, then rolled back. Runs
 * under {@link LocalStore}'s lock: the store calls it from callers' threads and the sweeper
 * with the lock held; the scheduled orphan release ({@link #releaseOrphansQuietly}) takes it.
 */
final class OpenCopies {
    /**
     * What a plan promises ({@link CopyPlan#holdNanos}): its slots stay as they are this long
     * from its issue even if its instance is unregistered. 10 s, or the copy TTL if shorter: a
     * copy takes milliseconds to a second, and the pins of a client that really died are
     * released soon after its session.
     */
    static final long HOLD_NANOS = TimeUnit.SECONDS.toNanos(10);

    private final StoreLock lock;
    private final PoolSpace pool;
    private final ObjLongConsumer<Counter> count;
    private final LongSupplier clock;
    private final long copyTtlNanos;
    private final long holdNanos;
    /** Runs the orphans' releases; null when the store has no sweeper thread (its sweep releases them). */
    private final ScheduledExecutorService sweeper;
    // --- guarded by lock ---
    /** Saves and loads between their plan and endCopy, by plan id. */
    private final Map<Token, OpenCopy> open = new HashMap<>();
    /** Open copies of unregistered instances: no longer endable, held until their hold ends ({@link #orphan}). */
    private final List<OpenCopy> orphans = new ArrayList<>();
    /** The store clock's time of the next scheduled orphan release (Long.MAX_VALUE: none). */
    private long orphanWakeAt = Long.MAX_VALUE;
    private final SecureRandom ids = new SecureRandom();

    OpenCopies(StoreLock lock, PoolSpace pool, ObjLongConsumer<Counter> count, LongSupplier clock, long copyTtlNanos,
            ScheduledExecutorService sweeper) {
        this.lock = lock;
        this.pool = pool;
        this.count = count;
        this.clock = clock;
        this.copyTtlNanos = copyTtlNanos;
        this.holdNanos = Math.min(HOLD_NANOS, copyTtlNanos);
        this.sweeper = sweeper;
    }

    /** How long a new plan's slots are held ({@link #HOLD_NANOS}, or the copy TTL if shorter). */
    long holdNanos() {
        return holdNanos;
    }

    /** When a copy opened now is given up on and rolled back. */
    long deadline() {
        return clock.getAsLong() + copyTtlNanos;
    }

    int size() {
        return open.size();
    }

    /** The open copy {@code id}, or null. */
    OpenCopy get(Token id) {
        return open.get(id);
    }

    /** A fresh id for a copy, unused by any open copy. */
    Token newId() {
        return newId(id -> false);
    }

    /** A fresh id, unused by any open copy and by anything {@code alsoTaken} holds. */
    Token newId(Predicate<Token> alsoTaken) {
        Token id;
        do {
            id = Token.random(ids);
        } while (alsoTaken.test(id) || open.containsKey(id));
        return id;
    }

    /** {@code op} is open under {@code id}, counted for its instance ({@link Quotas}). */
    void opened(Token id, OpenCopy op) {
        open.put(id, op);
        op.instance().openCopies++;
    }

    /** Copy {@code id} ({@code op}) ends: no longer open, nor counted for its instance. */
    void ended(Token id, OpenCopy op) {
        open.remove(id);
        op.instance().openCopies--;
    }

    /** How many copies each instance has open (for invariant checks). */
    Map<Instance, Integer> perInstance() {
        Map<Instance, Integer> opened = new IdentityHashMap<>();
        for (OpenCopy op : open.values()) {
            opened.merge(op.instance(), 1, Integer::sum);
        }
        return opened;
    }

    /**
     * The copies of an unregistered instance can no longer be ended: they are held until
     * their hold ends, then rolled back (see {@link LocalStore#unregisterInstance}).
     */
    void orphan(Instance inst) {
        long first = Long.MAX_VALUE;
        for (Iterator<OpenCopy> it = open.values().iterator(); it.hasNext(); ) {
            OpenCopy op = it.next();
            if (op.instance() == inst) {
                it.remove();
                inst.openCopies--;
                orphans.add(op);
                first = Math.min(first, heldUntil(op) - clock.getAsLong());
            }
        }
        if (first != Long.MAX_VALUE) {
            wakeForOrphans(first); // released when their hold ends, not at the next periodic sweep (up to 30 s later)
        }
    }

    /** When an open copy's hold ends: its issue plus {@link #holdNanos}. */
    long heldUntil(OpenCopy op) {
        return op.deadlineNanos() - copyTtlNanos + holdNanos;
    }

    /**
     * Has the sweeper thread release orphans in {@code delay} ns, unless a wake-up at that time
     * or earlier is already due (one chain of wake-ups, whatever the unregisters).
     */
    private void wakeForOrphans(long delay) {
        long at = clock.getAsLong() + Math.max(0, delay);
        if (sweeper == null || (orphanWakeAt != Long.MAX_VALUE && orphanWakeAt - at <= 0)) {
            return; // no sweeper thread (sweep() releases them), or woken in time already
        }
        orphanWakeAt = at;
        try {
            sweeper.schedule(this::releaseOrphansQuietly, Math.max(0, delay) + 1, TimeUnit.NANOSECONDS);
        } catch (RejectedExecutionException e) {
            // closing: close() drops them
        }
    }

    /** On the sweeper thread: rolls back what is due, and comes back for the next one. */
    private void releaseOrphansQuietly() {
        lock.lock();
        try {
            if (lock.closed()) {
                return;
            }
            orphanWakeAt = Long.MAX_VALUE;
            long next = releaseOrphans(clock.getAsLong());
            if (next != Long.MAX_VALUE) {
                wakeForOrphans(next);
            }
        } catch (RuntimeException e) {
            System.getLogger(LocalStore.class.getName()).log(System.Logger.Level.WARNING,
                    "releasing the open copies of unregistered instances failed", e);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Rolls back the open copies of unregistered instances whose hold has ended; the
     * nanoseconds until the next one's ends ({@code Long.MAX_VALUE}: none left).
     */
    private long releaseOrphans(long now) {
        long next = Long.MAX_VALUE;
        for (Iterator<OpenCopy> it = orphans.iterator(); it.hasNext(); ) {
            OpenCopy op = it.next();
            long left = heldUntil(op) - now;
            if (left <= 0) {
                it.remove();
                abort(op);
            } else {
                next = Math.min(next, left);
            }
        }
        return next;
    }

    /**
     * Rolls back saves and loads whose copier never ended them (its process died without a
     * session), then the orphans whose hold ended.
     */
    void expire(long now) {
        for (Iterator<OpenCopy> it = open.values().iterator(); it.hasNext(); ) {
            OpenCopy op = it.next();
            if (op.deadlineNanos() - now <= 0) {
                it.remove();
                op.instance().openCopies--;
                abort(op);
                count.accept(Counter.COPIES_EXPIRED, 1);
            }
        }
        releaseOrphans(now);
    }

    /** Undoes an open save or load that will never end normally. */
    private void abort(OpenCopy op) {
        switch (op) {
            case Reservation r -> {
                pool.rollBack(r.worker(), r.blocks());
                count.accept(Counter.SAVE_FAILURES, 1);
            }
            case OpenLoad l -> {
                pool.unpinAll(l.blocks());
                count.accept(Counter.LOAD_FAILURES, 1);
            }
        }
    }

    /** Forgets every open copy and orphan (at close). */
    void clear() {
        open.clear();
        orphans.clear();
    }
}
