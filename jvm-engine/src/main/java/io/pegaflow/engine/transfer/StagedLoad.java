package io.pegaflow.engine.transfer;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Supplier;

/**
 * A load's pool side copied into a {@link Stager}'s buffer ahead of the load, from the lookup
 * that began it on, before vLLM has allocated the blocks it will write. The load that takes
 * it ({@link #claim}) moves each group from the staging buffer once that group is queued
 * there ({@link #awaitQueued}); a load that does not take it lets it go ({@link #release}).
 * Either way the buffer is free again once nothing reads it.
 */
public final class StagedLoad {
    private static final int FILLING = 0, CLAIMED = 1, RELEASED = 2, FAILED = 3, DONE = 4;

    private final Stager stager;
    private final long bytes;
    private final Supplier<StageLayout> layoutOf;
    private final AtomicInteger state = new AtomicInteger(FILLING);
    private final long createdNanos = System.nanoTime();
    private volatile CompletableFuture<?> gate;
    private volatile StageLayout layout;
    /** Groups queued in the staging buffer; guarded by this. */
    private int queued;
    private Throwable failure;

    StagedLoad(Stager stager, long bytes, Supplier<StageLayout> layoutOf) {
        this.stager = stager;
        this.bytes = bytes;
        this.layoutOf = layoutOf;
    }

    public Stager stager() {
        return stager;
    }

    /** Bytes the layout stages (known when staging was asked for). */
    public long bytes() {
        return bytes;
    }

    /**
     * Takes this staging for one load whose copies are held until {@code hold} completes (null:
     * not held): the rest of the staging then goes as fast as the line once the hold opens.
     * False when it already failed, was released or taken: the load then reads the pool itself.
     */
    public boolean claim(CompletableFuture<?> hold) {
        gate = hold;
        return state.compareAndSet(FILLING, CLAIMED);
    }

    /** Lets an unclaimed staging go (its lease was released, or its load went another way). */
    public void release() {
        if (state.compareAndSet(FILLING, RELEASED)) {
            stager.free(this);
            synchronized (this) {
                notifyAll();
            }
        }
    }

    /** The claimed load's copies ended (either way): the buffer is free for the next load. */
    public void finish() {
        state.set(DONE);
        stager.free(this);
    }

    /** The layout, computed on the staging thread; valid once {@link #awaitQueued} returned. */
    public StageLayout layout() {
        return layout;
    }

    /**
     * Blocks until group {@code g} is queued in the staging buffer (the copy engine orders
     * its own reads after that group's copies); fails if staging failed or was let go.
     */
    public synchronized void awaitQueued(int g) {
        while (queued <= g) {
            if (failure != null) {
                throw new IllegalStateException("staging group " + g + " of " + bytes + " bytes failed: " + failure, failure);
            }
            int now = state.get();
            if (now == RELEASED || now == DONE) {
                throw new IllegalStateException("staging of " + bytes + " bytes was " + (now == DONE ? "ended" : "released")
                        + " before group " + g);
            }
            try {
                wait();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IllegalStateException("interrupted waiting for staged group " + g, e);
            }
        }
    }

    // ---------------------------------------------------------------- the staging thread's side

    StageLayout computeLayout() {
        StageLayout l = layoutOf.get();
        if (l.totalBytes() != bytes) {
            throw new IllegalStateException("staging layout of " + l.totalBytes() + " bytes for a load of " + bytes
                    + "; expected equal");
        }
        layout = l;
        return l;
    }

    /** When it was asked for ({@link System#nanoTime}). */
    long createdNanos() {
        return createdNanos;
    }

    /** Whether no load took it and it was asked for more than {@code nanos} ago. */
    boolean unclaimedLongerThan(long nanos) {
        return state.get() == FILLING && System.nanoTime() - createdNanos > nanos;
    }

    /** Whether staging stops: let go before anyone took it, or the load that took it already ended. */
    boolean abandoned() {
        int s = state.get();
        return s == RELEASED || s == DONE;
    }

    /**
     * Whether the next group waits for the one before it to land: until a load took this staging
     * and its hold opened, so the step's own input copies, queued on the copy engine meanwhile,
     * find at most one group ahead of them.
     */
    boolean paced() {
        int s = state.get();
        if (s == FILLING) {
            return true;
        }
        CompletableFuture<?> g = gate;
        return s == CLAIMED && g != null && !g.isDone();
    }

    synchronized void queued(int g) {
        queued = Math.max(queued, g + 1);
        notifyAll();
    }

    void fail(Throwable t) {
        // the state first: a claim that sees the failure's effects can no longer succeed
        boolean unclaimed = state.compareAndSet(FILLING, FAILED);
        synchronized (this) {
            failure = t;
            notifyAll();
        }
        if (unclaimed) {
            stager.free(this); // nobody reads it; a claimed one is freed when its load ends
        }
    }
}
