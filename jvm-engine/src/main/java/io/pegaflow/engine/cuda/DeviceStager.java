package io.pegaflow.engine.cuda;

import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.StageLayout;
import io.pegaflow.engine.transfer.Stager;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * {@link Stager} of the CUDA engine: a device buffer filled from the pinned pool through the
 * copy engine on a stream of its own, a layer group's stretches at one stride in the pool as
 * one pitched copy (as the bounce path's slots), an event per group that the load's lane
 * orders its scatter after ({@link CopyLane}: the kernel then moves the group device to device
 * into vLLM's blocks).
 */
final class DeviceStager extends Stager {
    /**
     * Bytes at the end of a group (its tail) whose start the staging thread waits for instead of
     * the group's landing while paced: the next group is queued while the tail moves, where the
     * line idled while the thread saw a landing and queued the next group. Sized to outlast that
     * turnaround a few times over and stay a small part of a group (docs/gpu.md, "Loads staged
     * at the lookup"). A group under twice this has no tail (the thread waits for its landing).
     */
    static final long TAIL_BYTES = 8L << 20;

    private final CudaTransferEngine engine;
    private final CudaDevice device;
    private final HostPool pool;
    private final PinnedPool pinned;
    /** Taken at the first load asked to stage ({@link #allocate}), before any group is queued. */
    private volatile long buffer;
    private volatile long stream;
    private final MemorySegment copy2D;
    /** Written by the staging thread before a group is marked queued; read by a lane after ({@link io.pegaflow.engine.transfer.StagedLoad#awaitQueued}). */
    private volatile long[] events = new long[0];
    /** Per group, an event recorded where its tail's copies begin (staging thread only), and whether that group has one. */
    private long[] tailEvents = new long[0];
    private boolean[] hasTail = new boolean[0];
    // the group being prepared: absolute host and device addresses and lengths of its stretches
    private long[] host = new long[16];
    private long[] dev = new long[16];
    private long[] len = new long[16];
    // its copies, listed by prepareGroup and queued by queueGroup: op i copies rows[i] rows (1: a
    // plain copy) of len[at[i]] bytes from stretch at[i] on, row r being stretch at[i] + r (the
    // rows' host pitch is that of their stretches)
    private int[] at = new int[16];
    private int[] rows = new int[16];
    private int ops;
    /** The first of those copies in the group's tail ({@link #TAIL_BYTES}; {@code -1}: none). */
    private int tailOp = -1;
    /** The group whose copies {@link #at} lists ({@code -1}: none). */
    private int prepared = -1;

    DeviceStager(CudaTransferEngine engine, CudaDevice device, HostPool pool, PinnedPool pinned, long bytes, Arena arena) {
        super(bytes, "cuda");
        this.engine = engine;
        this.device = device;
        this.pool = pool;
        this.pinned = pinned;
        this.copy2D = arena.allocate(CudaDriver.MEMCPY2D_BYTES, 8);
    }

    /** The device buffer and the staging stream, on the staging thread at the first lookup that stages. */
    @Override
    protected void allocate() {
        device.makeCurrent();
        long b = CudaDriver.memAlloc(capacity());
        try {
            stream = CudaDriver.streamCreate(CudaDriver.CU_STREAM_NON_BLOCKING);
        } catch (RuntimeException e) {
            CudaDriver.memFree(b);
            throw e;
        }
        buffer = b;
    }

    @Override
    public long address() {
        return buffer;
    }

    /** The event group {@code g}'s copies recorded (valid once the group is queued). */
    long event(int g) {
        return events[g];
    }

    /**
     * Lists group {@code g}'s copies: its stretches pinned and addressed, the runs at one stride
     * found (each becomes one pitched copy). Host work only, done while the group before is in
     * flight, so that between seeing that group land and queueing this one only the driver's
     * calls remain.
     */
    @Override
    protected void prepareGroup(StageLayout layout, int g) {
        device.makeCurrent(); // ensurePinned may register memory with the driver
        int first = layout.groupStart(g);
        int count = layout.groupEnd(g) - first;
        if (host.length < count + 1) { // one stretch more where the tail splits a plain copy
            host = new long[count + 1];
            dev = new long[count + 1];
            len = new long[count + 1];
        }
        if (at.length < count + 1) { // one copy more where the tail splits a pitched one
            at = new int[count + 1];
            rows = new int[count + 1];
        }
        long base = pool.address();
        for (int i = 0; i < count; i++) {
            int k = first + i;
            pinned.ensurePinned(layout.stretchHost(k), layout.stretchLen(k));
            host[i] = base + layout.stretchHost(k);
            dev[i] = buffer + layout.stretchAt(k);
            len[i] = layout.stretchLen(k);
        }
        int n = 0;
        int i = 0;
        while (i < count) {
            int r = engine.pitchedCopiesOn()
                    ? CopyLane.stridedRows(host, dev, len, i, count, engine.bytesToChunkEnd(host[i])) : 1;
            at[n] = i;
            if (r >= CopyLane.MIN_PITCHED_ROWS) {
                rows[n] = r;
                i += r;
            } else {
                rows[n] = 1;
                i++;
            }
            n++;
        }
        int[] split = splitTail(host, dev, len, count, at, rows, n, TAIL_BYTES);
        ops = split[0];
        tailOp = split[1];
        prepared = g;
    }

    /**
     * Splits a group's listed copies where its last {@code tailBytes} begin and returns {@code
     * {copies, first copy of the tail}} ({@code -1}: no tail, the group is under twice it). Op
     * {@code o} copies {@code rows[o]} rows of {@code len[at[o]]} bytes from stretch {@code
     * at[o]} on (row {@code r} is stretch {@code at[o] + r}). The copy the tail begins in is
     * split in two: a pitched one at a row (its first row at least before the tail; both parts
     * keep the stretches' stride), a plain one at the byte, its second part a new stretch at
     * index {@code stretches}. The arrays need room for one copy and one stretch more.
     */
    static int[] splitTail(long[] host, long[] dev, long[] len, int stretches, int[] at, int[] rows, int ops, long tailBytes) {
        long total = 0;
        for (int o = 0; o < ops; o++) {
            total += rows[o] * len[at[o]];
        }
        if (total < 2 * tailBytes) {
            return new int[] {ops, -1};
        }
        long before = total - tailBytes; // bytes that go before the tail
        long sum = 0;
        int o = 0;
        while (sum + rows[o] * len[at[o]] <= before) {
            sum += rows[o] * len[at[o]];
            o++;
        }
        long into = before - sum; // bytes of copy o before the tail: less than the copy
        if (into == 0) {
            return new int[] {ops, o}; // o > 0: the copies before it are the bytes before the tail
        }
        int i = at[o];
        int nextAt;
        int nextRows;
        if (rows[o] > 1) {
            int k = (int) Math.max(1, into / len[i]); // whole rows before the tail, one at least
            nextAt = i + k;
            nextRows = rows[o] - k;
            rows[o] = k;
        } else {
            host[stretches] = host[i] + into;
            dev[stretches] = dev[i] + into;
            len[stretches] = len[i] - into;
            len[i] = into;
            nextAt = stretches;
            nextRows = 1;
        }
        System.arraycopy(at, o + 1, at, o + 2, ops - o - 1);
        System.arraycopy(rows, o + 1, rows, o + 2, ops - o - 1);
        at[o + 1] = nextAt;
        rows[o + 1] = nextRows;
        return new int[] {ops + 1, o + 1};
    }

    @Override
    protected void queueGroup(StageLayout layout, int g) {
        device.makeCurrent(); // per call: the staging thread has no context of its own to rely on
        if (events.length < layout.groups()) {
            long[] more = java.util.Arrays.copyOf(events, layout.groups());
            for (int e = events.length; e < more.length; e++) {
                more[e] = CudaDriver.eventCreate(CudaDriver.CU_EVENT_DISABLE_TIMING);
            }
            long[] tails = java.util.Arrays.copyOf(tailEvents, more.length);
            for (int e = tailEvents.length; e < tails.length; e++) { // made with the group's own: no driver call while paced
                tails[e] = CudaDriver.eventCreate(CudaDriver.CU_EVENT_DISABLE_TIMING);
            }
            events = more;
            tailEvents = tails;
            hasTail = java.util.Arrays.copyOf(hasTail, more.length);
        }
        if (prepared != g) {
            prepareGroup(layout, g);
        }
        prepared = -1;
        hasTail[g] = tailOp > 0;
        for (int o = 0; o < ops; o++) {
            if (o == tailOp) {
                CudaDriver.eventRecord(tailEvents[g], stream);
            }
            int i = at[o];
            if (rows[o] > 1) {
                engine.countPitched();
                CudaDriver.memcpy2DHtoDAsync(copy2D, dev[i], len[i], host[i], host[i + 1] - host[i], len[i], rows[o], stream);
            } else {
                CopyLane.copyHtoD(engine, host[i], dev[i], len[i], stream);
            }
        }
        CudaDriver.eventRecord(events[g], stream);
    }

    @Override
    protected boolean landed(int g) {
        return CudaDriver.eventQuery(events[g]);
    }

    /** Down to its tail: the copies before the tail landed (the whole group where it has none). */
    @Override
    protected boolean nearlyLanded(int g) {
        return hasTail[g] ? CudaDriver.eventQuery(tailEvents[g]) : landed(g);
    }

    @Override
    protected void free() {
        device.makeCurrent();
        CudaDriver.streamSynchronize(stream);
        for (long e : events) {
            CudaDriver.eventDestroy(e);
        }
        for (long e : tailEvents) {
            CudaDriver.eventDestroy(e);
        }
        CudaDriver.streamDestroy(stream);
        CudaDriver.memFree(buffer);
    }
}
