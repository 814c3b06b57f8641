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
    // the group being prepared: absolute host and device addresses and lengths of its stretches
    private long[] host = new long[16];
    private long[] dev = new long[16];
    private long[] len = new long[16];
    // its copies, listed by prepareGroup and queued by queueGroup: op i copies rows[i] rows (1: a
    // plain copy) of len[at[i]] bytes from host[at[i]] to dev[at[i]], the host rows pitch[i] apart
    private int[] at = new int[16];
    private int[] rows = new int[16];
    private long[] pitch = new long[16];
    private int ops;
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
        if (host.length < count) {
            host = new long[count];
            dev = new long[count];
            len = new long[count];
            at = new int[count];
            rows = new int[count];
            pitch = new long[count];
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
                pitch[n] = host[i + 1] - host[i];
                i += r;
            } else {
                rows[n] = 1;
                i++;
            }
            n++;
        }
        ops = n;
        prepared = g;
    }

    @Override
    protected void queueGroup(StageLayout layout, int g) {
        device.makeCurrent(); // per call: the staging thread has no context of its own to rely on
        if (events.length < layout.groups()) {
            long[] more = java.util.Arrays.copyOf(events, layout.groups());
            for (int e = events.length; e < more.length; e++) {
                more[e] = CudaDriver.eventCreate(CudaDriver.CU_EVENT_DISABLE_TIMING);
            }
            events = more;
        }
        if (prepared != g) {
            prepareGroup(layout, g);
        }
        prepared = -1;
        for (int o = 0; o < ops; o++) {
            int i = at[o];
            if (rows[o] > 1) {
                engine.countPitched();
                CudaDriver.memcpy2DHtoDAsync(copy2D, dev[i], len[i], host[i], pitch[o], len[i], rows[o], stream);
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

    @Override
    protected void free() {
        device.makeCurrent();
        CudaDriver.streamSynchronize(stream);
        for (long e : events) {
            CudaDriver.eventDestroy(e);
        }
        CudaDriver.streamDestroy(stream);
        CudaDriver.memFree(buffer);
    }
}
