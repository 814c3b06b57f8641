package io.pegaflow.engine.transfer;

import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.Supplier;

/**
 * Copies a load's pool side into a staging buffer of the copy engine's own from the lookup
 * that began the load on ({@code PegaEngine.queryAndBegin}), before vLLM allocates the blocks
 * the load writes: the line works through vLLM's scheduling, allocation and step preparation,
 * and the load's own copies then move the bytes from the staging buffer (device memory to
 * device memory, for a GPU engine). One load occupies the buffer at a time; a load that does
 * not fit, or comes while another occupies it, reads the pool as before. Off unless
 * {@link #ENV} gives the buffer's size (docs/gpu.md, "Loads staged at the lookup").
 *
 * <p>Groups go one at a time, each once the one before landed, until the load that took the
 * staging opens its hold (the step's start): the step's own input copies find one group ahead
 * of them at most. A subclass says how a group is queued and when it has landed.
 */
public abstract class Stager implements AutoCloseable {
    /** MiB of the staging buffer ({@code 0}, the default: off). */
    public static final String ENV = "PEGAFLOW_PRESTAGE_MIB";

    /** An unclaimed staging this old gives the buffer up to the next load that asks. */
    static final long STALE_NANOS = 2_000_000_000L;

    private final long capacity;
    private final AtomicReference<StagedLoad> occupant = new AtomicReference<>();
    private final ExecutorService filler;
    private final AtomicLong staged = new AtomicLong();
    private final AtomicLong busy = new AtomicLong();
    private final AtomicLong tooLarge = new AtomicLong();

    protected Stager(long capacity, String name) {
        if (capacity <= 0) {
            throw new IllegalArgumentException("staging buffer of " + capacity + " bytes; expected > 0");
        }
        this.capacity = capacity;
        this.filler = Executors.newSingleThreadExecutor(Thread.ofPlatform().daemon().name("pegaflow-stage-" + name).factory());
    }

    /** {@link #ENV} as bytes, 0 when unset; refuses anything but 0 to 65536 MiB, naming the value. */
    public static long bytesFromEnvironment(String value) {
        return LayerSplit.parse(value, ENV, 0, 65536, 0, "MiB of the buffer a load's pool side is staged in at its lookup, 0 (off) to 65536") << 20;
    }

    public long capacity() {
        return capacity;
    }

    /**
     * Starts staging a load of {@code bytes} whose layout {@code layout} gives (computed on the
     * staging thread, off the caller's); null when it does not fit or the buffer is taken.
     */
    public StagedLoad stage(long bytes, Supplier<StageLayout> layout) {
        if (bytes <= 0 || bytes > capacity) {
            tooLarge.incrementAndGet();
            return null;
        }
        StagedLoad s = new StagedLoad(this, bytes, layout);
        if (!occupant.compareAndSet(null, s)) {
            StagedLoad held = occupant.get();
            if (held != null && held.unclaimedLongerThan(STALE_NANOS)) {
                held.release(); // its request waited past any step: its load, if it comes, reads the pool
            }
            if (!occupant.compareAndSet(null, s)) {
                busy.incrementAndGet();
                return null;
            }
        }
        try {
            filler.execute(() -> fill(s));
        } catch (java.util.concurrent.RejectedExecutionException closed) {
            occupant.compareAndSet(s, null);
            return null;
        }
        staged.incrementAndGet();
        return s;
    }

    private void fill(StagedLoad s) {
        try {
            StageLayout l = s.computeLayout();
            for (int g = 0; g < l.groups(); g++) {
                if (s.abandoned()) {
                    return;
                }
                queueGroup(l, g);
                s.queued(g);
                if (g + 1 < l.groups()) {
                    while (s.paced() && !landed(g)) {
                        Thread.onSpinWait(); // about a millisecond a layer at 16K tokens; a parked thread woken late idles the line
                    }
                }
            }
        } catch (Throwable t) {
            s.fail(t);
        }
    }

    void free(StagedLoad s) {
        occupant.compareAndSet(s, null);
    }

    /** Loads staged since start. */
    public long stagedLoads() {
        return staged.get();
    }

    /** Loads not staged because another occupied the buffer. */
    public long busyRefusals() {
        return busy.get();
    }

    /** Loads not staged because they were larger than the buffer (or empty). */
    public long tooLargeRefusals() {
        return tooLarge.get();
    }

    /** The staging buffer's address (device memory for a GPU engine). */
    public abstract long address();

    /** On the staging thread: queues group {@code g}'s stretches into the buffer at their {@link StageLayout#stretchAt}. */
    protected abstract void queueGroup(StageLayout layout, int g);

    /** On the staging thread: whether group {@code g}'s copies have landed. */
    protected abstract boolean landed(int g);

    /** Stops the staging thread (a load in it ends at its next group); a subclass then frees its buffer. */
    @Override
    public void close() {
        StagedLoad s = occupant.get();
        if (s != null) {
            s.release();
        }
        filler.shutdown();
        try {
            if (!filler.awaitTermination(60, java.util.concurrent.TimeUnit.SECONDS)) {
                throw new IllegalStateException("the staging thread did not stop within 60 s");
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
