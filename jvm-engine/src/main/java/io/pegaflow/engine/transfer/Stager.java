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
 * of them at most. {@link #DEPTH_ENV} lets more groups be in flight meanwhile (the line then
 * never waits for the staging thread to see a group land, and the step's input copies find
 * that many groups ahead of them). A subclass says how a group is queued and when it has landed.
 */
public abstract class Stager implements AutoCloseable {
    /** MiB of the staging buffer ({@code 0}, the default: off). */
    public static final String ENV = "PEGAFLOW_PRESTAGE_MIB";

    /** Groups in flight while a staging is paced (1, the default, to {@link #MAX_DEPTH}). */
    public static final String DEPTH_ENV = "PEGAFLOW_PRESTAGE_DEPTH";
    /** The most groups {@link #DEPTH_ENV} may put in flight. */
    static final int MAX_DEPTH = 8;

    /** An unclaimed staging this old gives the buffer up to the next load that asks. */
    static final long STALE_NANOS = 2_000_000_000L;

    private static final System.Logger LOG = System.getLogger(Stager.class.getName());
    /** The largest buffer {@link #ENV} may ask for, in MiB. */
    static final long MAX_MIB = 65536;
    private static final int UNALLOCATED = 0, READY = 1, UNAVAILABLE = -1;

    private final long capacity;
    private final int depth;
    private final AtomicReference<StagedLoad> occupant = new AtomicReference<>();
    private final ExecutorService filler;
    private final AtomicLong staged = new AtomicLong();
    private final AtomicLong busy = new AtomicLong();
    private final AtomicLong tooLarge = new AtomicLong();
    private final AtomicLong failed = new AtomicLong();
    private final AtomicLong unavailable = new AtomicLong();
    /** Stagings whose first group was queued, and their nanoseconds from being asked for ({@link #stage}) to the staging thread's start, in the layout before that group, and to that group queued. */
    private final AtomicLong started = new AtomicLong();
    private final AtomicLong toFillNanos = new AtomicLong();
    private final AtomicLong layoutNanos = new AtomicLong();
    private final AtomicLong toFirstNanos = new AtomicLong();
    /**
     * Stagings whose first group the staging thread saw land while it paced them (it spins on
     * that group's copies before queueing the next), and their nanoseconds from being asked for
     * to then: beside {@link #toFirstNanos}, how long the copy engine took to move the first
     * group once it was queued, on the host's clock.
     */
    private final AtomicLong landedFirst = new AtomicLong();
    private final AtomicLong toLandedNanos = new AtomicLong();
    /**
     * Groups queued while paced, after the staging thread saw the group before them land, and
     * the nanoseconds from seeing it land to this group queued: the host's part of the time the
     * link stood idle between paced groups (the copy engine's own start and any lateness in
     * seeing the landing come on top).
     */
    private final AtomicLong pacedGroups = new AtomicLong();
    private final AtomicLong pacedGapNanos = new AtomicLong();
    /** The buffer is taken on the staging thread at the first load asked to stage, not at start ({@link #allocate}). */
    private volatile int buffer = UNALLOCATED;

    /** A stager paced as {@link #DEPTH_ENV} says (1 when unset). */
    protected Stager(long capacity, String name) {
        this(capacity, name, depthFromEnvironment(System.getenv(DEPTH_ENV)));
    }

    /** A stager with {@code depth} groups in flight while paced (1 to {@link #MAX_DEPTH}). */
    protected Stager(long capacity, String name, int depth) {
        checkBytes(capacity);
        if (depth < 1 || depth > MAX_DEPTH) {
            throw new io.pegaflow.engine.InvalidArgumentException("staging depth " + depth + "; expected 1 to " + MAX_DEPTH
                    + " (" + DEPTH_ENV + ")");
        }
        this.depth = depth;
        if (capacity == 0) {
            throw new IllegalArgumentException("staging buffer of 0 bytes; expected > 0 (0 turns staging off: make no stager)");
        }
        this.capacity = capacity;
        this.filler = Executors.newSingleThreadExecutor(Thread.ofPlatform().daemon().name("pegaflow-stage-" + name).factory());
    }

    /** {@link #ENV} as bytes, 0 when unset; refuses anything but 0 to 65536 MiB, naming the value. */
    public static long bytesFromEnvironment(String value) {
        return LayerSplit.parse(value, ENV, 0, MAX_MIB, 0,
                "MiB of the buffer a load's pool side is staged in at its lookup, 0 (off) to " + MAX_MIB) << 20;
    }

    /** {@link #DEPTH_ENV} as a depth, 1 when unset; refuses anything but 1 to 8, naming the value. */
    public static int depthFromEnvironment(String value) {
        return (int) LayerSplit.parse(value, DEPTH_ENV, 1, MAX_DEPTH, 1,
                "groups of a paced staging in flight at once, 1 to " + MAX_DEPTH);
    }

    /** Refuses a staging size other than 0 (off) or whole 4 KiB pages up to 64 GiB, naming it. */
    public static long checkBytes(long bytes) {
        if (bytes < 0 || bytes % 4096 != 0 || bytes > MAX_MIB << 20) {
            throw new io.pegaflow.engine.InvalidArgumentException("staging buffer of " + bytes
                    + " bytes; expected 0 (off) or a multiple of 4096 up to " + (MAX_MIB << 20) + " (" + ENV + ")");
        }
        return bytes;
    }

    public long capacity() {
        return capacity;
    }

    /** Groups in flight while a staging is paced ({@link #DEPTH_ENV}). */
    public int depth() {
        return depth;
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
        if (buffer == UNAVAILABLE) {
            unavailable.incrementAndGet();
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
            unavailable.incrementAndGet();
            return null;
        }
        staged.incrementAndGet();
        return s;
    }

    /**
     * Takes the buffer on the staging thread at the first load asked to stage, so a process that
     * never stages (a server, a worker outside the scheduler's process) never holds it and the
     * lookup's thread (vLLM's scheduling thread) never waits for it; where it cannot be had (the
     * memory went to others) that staging fails (logged as {@link #fill} logs a first failure),
     * staging stays off, and loads read the pool.
     */
    private synchronized void allocateOnce() {
        if (buffer == UNALLOCATED) {
            try {
                allocate();
                buffer = READY;
            } catch (RuntimeException | OutOfMemoryError e) {
                buffer = UNAVAILABLE;
                throw new IllegalStateException("no staging buffer of " + capacity + " bytes could be had (" + e
                        + "); loads are not staged at their lookup", e);
            }
        }
        if (buffer != READY) {
            throw new IllegalStateException("no staging buffer of " + capacity + " bytes; loads are not staged at their lookup");
        }
    }

    private void fill(StagedLoad s) {
        try {
            long filling = System.nanoTime();
            if (buffer != READY) {
                allocateOnce(); // a buffer that cannot be had fails this staging, logged below as the first failure
            }
            long laying = System.nanoTime();
            StageLayout l = s.computeLayout();
            long laid = 0;
            long seenLanded = 0; // when the thread saw the group before this one land while pacing (0: it did not)
            for (int g = 0; g < l.groups(); g++) {
                if (s.abandoned()) {
                    return;
                }
                l.lay(g); // a lazy layout's group just before its copies: the rest is laid while they run
                if (g == 0) {
                    laid = System.nanoTime();
                }
                queueGroup(l, g);
                if (seenLanded != 0) {
                    pacedGapNanos.addAndGet(System.nanoTime() - seenLanded);
                    pacedGroups.incrementAndGet();
                    seenLanded = 0;
                }
                if (g == 0) { // counted before the load hears of it, so whoever waited for it sees it counted
                    long now = System.nanoTime();
                    toFillNanos.addAndGet(filling - s.createdNanos());
                    layoutNanos.addAndGet(laid - laying);
                    toFirstNanos.addAndGet(now - s.createdNanos());
                    started.incrementAndGet();
                }
                s.queued(g);
                if (g + 1 < l.groups()) {
                    // the next group's host work while this one is in flight: between seeing a
                    // paced group land and queueing the next, only the driver's calls remain
                    l.lay(g + 1);
                    prepareGroup(l, g + 1);
                }
                // The pause between a landing and the next group is the step's way onto the line: its
                // input copies, on another stream, wait behind a staging queue that never empties
                // (queueing each group behind the tail of the one before held the step back for the
                // whole staging: docs/gpu.md, "Loads staged at the lookup").
                int waitFor = g + 1 - depth; // the group that must land before the next is queued
                if (g + 1 < l.groups() && waitFor >= 0) {
                    while (s.paced() && !landed(waitFor)) {
                        Thread.onSpinWait(); // one layer's copy: a parked thread woken late would idle the line
                    }
                    if (s.paced()) {
                        seenLanded = System.nanoTime();
                    }
                    if (waitFor == 0 && s.paced()) { // seen landed, not let go by the load's hold opening
                        toLandedNanos.addAndGet(System.nanoTime() - s.createdNanos());
                        landedFirst.incrementAndGet();
                    }
                }
            }
        } catch (Throwable t) {
            long before = failed.getAndIncrement(); // counted first: whoever hears of the failure sees it counted
            s.fail(t);
            if (before == 0 || LOG.isLoggable(System.Logger.Level.DEBUG)) {
                // said once (every time at DEBUG): a staging that fails unclaimed is otherwise silent,
                // its load reading the pool as if staging were off
                LOG.log(System.Logger.Level.WARNING, "staging a load of " + s.bytes() + " bytes failed; that load reads "
                        + "the pool (or, if it had claimed the staging, fails and is recomputed): " + t, t);
            }
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

    /** Stagings that failed (the buffer could not be had, or a copy was refused); the first is logged. */
    public long failedStagings() {
        return failed.get();
    }

    /** Loads not staged because the buffer could not be had (or the stager was closed). */
    public long unavailableRefusals() {
        return unavailable.get();
    }

    /**
     * How soon stagings started: those whose first group was queued, and the nanoseconds, summed
     * over them, from being asked for ({@link #stage}, on the lookup's thread) to the staging
     * thread taking the staging up, in laying out what comes before the first group's copies
     * (all of the layout, or a lazy one's first group: {@link StageLayout#lazy}), and to that
     * group queued on the copy engine. In that order; then the stagings whose first group the
     * staging thread saw land while pacing them, and their nanoseconds from being asked for to
     * then (counted before the next group is queued); then the groups queued while paced after
     * the thread saw the group before them land, and the nanoseconds from seeing it land to
     * queueing them (the host's part of the link's idle time between paced groups).
     */
    public long[] startTimes() {
        return new long[] {started.get(), toFillNanos.get(), layoutNanos.get(), toFirstNanos.get(), landedFirst.get(),
                toLandedNanos.get(), pacedGroups.get(), pacedGapNanos.get()};
    }

    /** Whether the buffer was taken (on the staging thread, at the first load asked to stage). */
    public boolean allocated() {
        return buffer == READY;
    }

    /** Takes the buffer ({@link #capacity} bytes); on the staging thread, at the first load asked to stage. */
    protected abstract void allocate();

    /** Gives the buffer back; only after {@link #allocate} succeeded and nothing fills or reads it. */
    protected abstract void free();

    /** The staging buffer's address (device memory for a GPU engine); valid once a load's first group is queued ({@link StagedLoad#awaitQueued}). */
    public abstract long address();

    /**
     * On the staging thread: queues group {@code g}'s stretches into the buffer at their {@link
     * StageLayout#stretchAt}, doing {@link #prepareGroup}'s part first where it was not done for
     * {@code g}.
     */
    protected abstract void queueGroup(StageLayout layout, int g);

    /**
     * On the staging thread, once group {@code g - 1} is queued and before the thread waits for
     * it to land: the host's part of queueing group {@code g} (laid already), so that only what
     * must follow the landing is left to {@link #queueGroup}. Nothing by default.
     */
    protected void prepareGroup(StageLayout layout, int g) {
    }

    /** On the staging thread: whether group {@code g}'s copies have landed. */
    protected abstract boolean landed(int g);

    /**
     * Stops the staging thread (a load in it ends at its next group), then frees the buffer;
     * a thread that does not stop keeps it (freed memory under a running copy is worse than a
     * leak at exit). The caller's copies that read it have ended (PegaEngine.close waits for them).
     */
    @Override
    public final void close() {
        StagedLoad s = occupant.get();
        if (s != null) {
            s.release();
        }
        filler.shutdown();
        boolean stopped = false;
        try {
            stopped = filler.awaitTermination(60, java.util.concurrent.TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        if (!stopped) {
            LOG.log(System.Logger.Level.WARNING, "the staging thread did not stop within 60 s; its buffer is not freed");
            return;
        }
        if (buffer == READY) {
            buffer = UNAVAILABLE;
            free();
        }
    }
}
