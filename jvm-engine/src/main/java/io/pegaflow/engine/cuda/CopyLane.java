package io.pegaflow.engine.cuda;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.CopyBatch;
import io.pegaflow.engine.transfer.TransferFuture;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;

/**
 * One lane of the CUDA copy engine: a stream with its events, a reusable pinned descriptor
 * buffer (mapped, so the kernel reads it directly; optionally uploaded to a device buffer
 * first) and, with the bounce path on, a second stream and a device bounce buffer in slots.
 * A batch holds the lane from submit until its copies finish; this class turns the batch into
 * driver calls: merged runs to the copy engine, scattered pieces to the gather/scatter kernel
 * in chunks, back-to-back pool stretches through the bounce buffer ({@link CudaTransferEngine}
 * says when each path is taken and why).
 */
final class CopyLane {
    static final int THREADS = 256;
    static final int MAX_GRID = 65535;
    static final long DESC_BYTES = 24;
    /**
     * Descriptors per launch ramp up from 256 (the GPU starts after a few microseconds of
     * host work) to 8192 (256 MiB of 32 KiB pieces, so the gaps between launches stay
     * negligible beside the copy).
     */
    static final int FIRST_CHUNK = 256;
    static final int MAX_CHUNK = 8192;
    /** Long runs per cuMemcpyBatchAsync, ramping the same way: 16 (32 MiB of 2 MiB runs) to 1024. */
    static final int FIRST_RUNS = 16;
    static final int MAX_RUNS = 1024;
    /** Average bytes back to back in the pool from which a group takes the bounce path (a block of a small model is 1-2 MiB). */
    static final long MIN_BOUNCE_STRETCH = 256 << 10;

    private final CudaTransferEngine engine;
    private final HostPool pool;
    private final CudaOptions options;
    private final CudaDevice device;
    private final long function;
    final String name;
    final BlockingQueue<CopyLane> home;
    final long stream;
    final long doneEvent;
    final long callerEvent;
    /** Volatile: a waiter of an earlier batch may read it while a later batch grows it (same events, more). */
    volatile long[] groupEvents = new long[0];
    long staging;
    long stagingBytes;
    long deviceDesc;
    long deviceDescBytes;
    final MemorySegment params;
    final MemorySegment argDesc;
    final MemorySegment argCount;
    /** Long runs waiting for one cuMemcpyBatchAsync on {@link #stream}. */
    final CopyRunList runs;
    final BlockingQueue<Future> pending = new LinkedBlockingQueue<>();
    final Thread completer;
    /** Queues layer-wise loads instead of the submitting thread ({@link #enqueueLater}). */
    private final java.util.concurrent.ExecutorService enqueuer;
    /** The bounce path (0 when off): the kernel's stream, the device buffer and its slots' events. */
    final long aux;
    final long bounce;
    final long slotBytes;
    final int slots;
    final long[] filled;
    final long[] freed;
    /** This lane's side of the engine's save pace (null: saves not paced, or no bounce path). */
    private final SavePace.Lane pace;
    /**
     * A paced save's long runs (a cross-layer layout's whole blocks) go to the copy engine in
     * units of at most {@link #slotBytes}, each under a permit of the pace as a bounce slot's
     * copy is: the bytes listed in the open unit (0: none open) and that unit's end mark among
     * {@link #RUN_UNITS}, after the slots' own in {@link #pace}.
     */
    private long runUnitFill;
    private int runUnit;
    static final int RUN_UNITS = 4;
    final boolean[] slotUsed;
    private int slot;
    private long slotFill;
    private int slotDescStart;
    /** The current slot's pool stretches: host address, bounce address, bytes. */
    private long[] stretchHost = new long[16];
    private long[] stretchBounce = new long[16];
    private long[] stretchLen = new long[16];
    private int stretchCount;
    /** The {@code CUDA_MEMCPY2D} struct of this lane's pitched copies ({@link #copyStretches}). */
    private final MemorySegment copy2D;

    CopyLane(CudaTransferEngine engine, HostPool pool, CudaOptions options, CudaDevice device, long function, Arena arena,
            String name, BlockingQueue<CopyLane> home) {
        this.engine = engine;
        this.pool = pool;
        this.options = options;
        this.device = device;
        this.function = function;
        this.slots = options.bounceSlots();
        this.filled = new long[slots];
        this.freed = new long[slots];
        this.slotUsed = new boolean[slots];
        this.params = arena.allocate(ADDRESS, 2);
        this.argDesc = arena.allocate(JAVA_LONG);
        this.argCount = arena.allocate(JAVA_INT);
        this.copy2D = arena.allocate(CudaDriver.MEMCPY2D_BYTES, 8);
        this.runs = new CopyRunList(arena);
        this.name = name;
        this.home = home;
        this.stream = CudaDriver.streamCreate(CudaDriver.CU_STREAM_NON_BLOCKING);
        this.doneEvent = CudaDriver.eventCreate(CudaDriver.CU_EVENT_BLOCKING_SYNC | CudaDriver.CU_EVENT_DISABLE_TIMING);
        this.callerEvent = CudaDriver.eventCreate(CudaDriver.CU_EVENT_DISABLE_TIMING);
        params.setAtIndex(ADDRESS, 0, argDesc);
        params.setAtIndex(ADDRESS, 1, argCount);
        long bytes = options.bounceBytes();
        this.slotBytes = bytes / slots;
        if (bytes > 0) {
            this.aux = CudaDriver.streamCreate(CudaDriver.CU_STREAM_NON_BLOCKING);
            this.bounce = CudaDriver.memAlloc(bytes);
            for (int s = 0; s < slots; s++) {
                filled[s] = CudaDriver.eventCreate(CudaDriver.CU_EVENT_DISABLE_TIMING);
                freed[s] = CudaDriver.eventCreate(CudaDriver.CU_EVENT_DISABLE_TIMING);
            }
            this.pace = engine.savePace() == null ? null : engine.savePace().new Lane(slots + RUN_UNITS);
        } else {
            this.aux = 0;
            this.bounce = 0;
            this.pace = null;
        }
        this.completer = Thread.ofPlatform().daemon().name("pegaflow-cuda-" + name).start(this::complete);
        this.enqueuer = java.util.concurrent.Executors.newSingleThreadExecutor(
                Thread.ofPlatform().daemon().name("pegaflow-cuda-queue-" + name).factory());
    }

    /** On the submitting thread, with the device current: marks where the caller's stream stands for {@link #enqueue}. */
    void recordCaller(CopyBatch batch) {
        if (batch.waitStream() != 0) {
            CudaDriver.eventRecord(callerEvent, batch.waitStream());
        }
    }

    /**
     * {@link #enqueue} on this lane's own thread: the caller returns at once and waits for
     * each group through {@link Future#awaitGroup}, which returns once the group is queued
     * (and its stream wait placed). A failure to queue goes to {@code failed}, which drains
     * the streams and fails the future.
     */
    void enqueueLater(CopyBatch batch, Future future, java.util.function.Consumer<Throwable> failed) {
        enqueuer.execute(() -> {
            try {
                device.makeCurrent();
                enqueue(batch, future); // a held batch waits for its hold there
                future.markQueuedOnDevice();
                pending.add(future);
            } catch (Throwable e) {
                failed.accept(e);
            }
        });
    }

    /**
     * With the device current, after {@link #recordCaller}: queue every copy of the batch. A
     * held batch's groups past its lead ({@link io.pegaflow.engine.transfer.LayerSplit#leadGroups};
     * without a lead, all of them) are queued once its hold opens, this thread waiting for it there.
     */
    void enqueue(CopyBatch batch, Future future) {
        if (batch.waitStream() != 0) {
            CudaDriver.streamWaitEvent(stream, callerEvent);
            if (bounce != 0) {
                CudaDriver.streamWaitEvent(aux, callerEvent); // a save's gathers read what the caller wrote
            }
        }
        boolean toHost = batch.direction() == CopyBatch.Direction.TO_HOST;
        int groups = Math.max(1, batch.groupCount());
        // a batch of several groups is a layer-wise load: the forward computes beside it
        int cap = options.layerSplit().kernelBlocks();
        grid = groups > 1 && cap > 0 ? cap : MAX_GRID;
        // a save on the kernel alone: few SMs, and the copy engine left to vLLM's own copies
        boolean saveOnKernel = toHost && options.saveKernelBlocks() > 0;
        if (saveOnKernel) {
            grid = options.saveKernelBlocks();
        }
        ensureStaging(batch.size() * DESC_BYTES);
        if (!options.hostDescriptors()) {
            ensureDeviceDesc(batch.size() * DESC_BYTES);
        }
        ensureGroupEvents(groups > 1 ? groups : 0);
        java.util.Arrays.fill(slotUsed, false); // the previous batch's work on both streams ended before its done event
        desc = MemorySegment.ofAddress(staging).reinterpret(stagingBytes);
        n = 0;
        chunk = FIRST_CHUNK;
        runChunk = FIRST_RUNS;
        runUnitFill = 0;
        if (batch.stage() != null) {
            fromStage(batch, future, groups);
            return;
        }
        // a layer-wise load through the copy engine: each group's last scatter, on aux, marks
        // the group; stream (the copy engine's side) goes on to the next layer without
        // waiting for it, and waits for aux once, before the batch's done event
        boolean layersOnAux = groups > 1 && !toHost && options.layerSplit().copyEngine();
        boolean auxBehind = false;
        // the first group a held batch queues only once its hold opens: after its lead where it
        // has one (a layer-wise load of several groups), else the first; a batch of one group
        // passed its hold before it came here (CudaTransferEngine.submit)
        boolean led = groups > 1 && batch.held() && options.layerSplit().leadBytes() > 0;
        int heldFrom = !batch.held() ? groups : led ? options.layerSplit().leadGroups(batch) : 0;
        // a paced lead takes the groups' own path, one group queued at a time (LayerSplit.leadPaced)
        boolean paced = led && options.layerSplit().leadPaced();
        for (int g = 0; g < groups; g++) {
            if (g == heldFrom) {
                batch.awaitGate();
            }
            int end = batch.size() == 0 ? 0 : batch.groupEnd(g);
            int start = batch.size() == 0 ? 0 : batch.groupStart(g);
            boolean scattered = false;
            boolean leadOnAux = false;
            if (led && g < heldFrom && !paced) {
                // a held batch's lead, queued before its step: the kernel moves it, no copy
                // engine, so the step's own input copies (queued on the copy engine meanwhile)
                // wait behind none of it; on aux where there is one, so the copy engine's
                // groups after the hold start at once even while the lead still runs
                // (docs/gpu.md, "Loads started at allocation")
                leadOnAux = aux != 0;
                direct(batch, start, end, toHost, true, leadOnAux ? aux : stream);
            } else if (saveOnKernel) {
                direct(batch, start, end, true, true, stream);
            } else if (bounce != 0 && (layersOnAux ? end - start >= 2 : worthBouncing(batch, start, end))) {
                scattered = bounced(batch, start, end, toHost, !layersOnAux);
            } else {
                direct(batch, start, end, toHost, false, stream);
            }
            closeRunUnit();
            runs.flush(stream);
            if (g == 0) {
                future.markFirstCopy();
            }
            auxBehind |= leadOnAux; // the done event below joins aux
            if (groups > 1) {
                if (leadOnAux) {
                    CudaDriver.eventRecord(groupEvents[g], aux);
                } else if (layersOnAux && (scattered || auxBehind)) {
                    // the group's pieces on stream (if any) and its scatters on aux, both
                    CudaDriver.eventRecord(callerEvent, stream);
                    CudaDriver.streamWaitEvent(aux, callerEvent);
                    CudaDriver.eventRecord(groupEvents[g], aux);
                    auxBehind = true;
                } else {
                    CudaDriver.eventRecord(groupEvents[g], stream);
                }
                future.queued(g + 1);
                if (paced && g < heldFrom - 1) {
                    paceLead(batch, groupEvents[g]);
                }
            }
        }
        if (auxBehind) {
            CudaDriver.eventRecord(callerEvent, aux);
            CudaDriver.streamWaitEvent(stream, callerEvent);
        }
        CudaDriver.eventRecord(doneEvent, stream);
    }

    /**
     * A staged load ({@link CopyBatch#fromStage}): each group, once its staging copies are
     * queued, scattered by the kernel from the staging buffer into the batch's pieces on this
     * lane's stream, after that group's staging event; the group's event follows. The PCIe side
     * ran (or runs) on the stager's stream from the lookup on. A held batch scatters only once its
     * hold opens unless a lead is set ({@link io.pegaflow.engine.transfer.LayerSplit#leadBytes}),
     * which the connector allows only where nothing writes the blocks between allocation and the
     * step (docs/gpu.md, "Loads started at allocation"); the scatter takes SMs, not the copy
     * engine, so the step's input copies never wait behind it.
     */
    private void fromStage(CopyBatch batch, Future future, int groups) {
        io.pegaflow.engine.transfer.StagedLoad staged = batch.stage();
        DeviceStager stager = (DeviceStager) staged.stager();
        long base = 0;
        if (batch.held() && options.layerSplit().leadBytes() == 0) {
            batch.awaitGate();
        }
        io.pegaflow.engine.transfer.StageLayout.Cursor at = null;
        for (int g = 0; g < groups; g++) {
            staged.awaitQueued(g);
            if (at == null) {
                base = stager.address(); // taken on the staging thread before its first group was queued
                at = staged.layout().cursor();
            }
            at.group(g);
            CudaDriver.streamWaitEvent(stream, stager.event(g));
            int chunkStart = n;
            for (int i = batch.groupStart(g); i < batch.groupEnd(g); i++) {
                long len = batch.length(i);
                descriptor(base + at.offset(batch.hostOffset(i), len), batch.deviceAddress(i), len);
                if (n - chunkStart == chunk) {
                    launch(chunkStart, n, stream);
                    chunkStart = n;
                    chunk = Math.min(chunk * 2, MAX_CHUNK);
                }
            }
            launch(chunkStart, n, stream);
            if (g == 0) {
                future.markFirstCopy();
            }
            if (groups > 1) {
                CudaDriver.eventRecord(groupEvents[g], stream);
                future.queued(g + 1);
            }
        }
        CudaDriver.eventRecord(doneEvent, stream);
    }

    /**
     * A paced lead's wait between its groups: until the group just queued landed (its event) or
     * the batch's hold opened, whichever comes first. The step's input copies, queued on the copy
     * engine meanwhile, so find at most one group ahead of them; once the hold opens the rest go
     * at once. Spins: the wait is one group's copy (about a millisecond at 16K tokens), and a
     * parked thread woken late would leave PCIe idle for longer than the copy engine needs.
     */
    private void paceLead(CopyBatch batch, long groupEvent) {
        while (!batch.gateOpen()) {
            if (CudaDriver.eventQuery(groupEvent)) {
                engine.countPaced();
                return;
            }
            Thread.onSpinWait();
        }
    }

    // Per-batch state of enqueue (one batch holds the lane at a time).
    /** The most thread blocks one launch of this batch takes. */
    private int grid = MAX_GRID;
    private MemorySegment desc;
    /** Descriptors written so far in this batch; each launch covers a range of them. */
    private int n;
    private int chunk;
    private int runChunk;

    /**
     * Pieces [i, end): merge runs; long ones go to the copy engine at once, short ones
     * become descriptors the kernel moves over PCIe, launched a chunk at a time so the GPU
     * copies chunk k while this thread writes chunk k+1 (the host-side work overlaps
     * instead of adding up). The kernels go on stream {@code on}, long runs on {@link #stream};
     * {@code kernelOnly}: long runs too go to the kernel (nothing on the copy engine).
     */
    private void direct(CopyBatch batch, int i, int end, boolean toHost, boolean kernelOnly, long on) {
        long poolBase = pool.address();
        int chunkStart = n;
        while (i < end) {
            long dev = batch.deviceAddress(i);
            long host = poolBase + batch.hostOffset(i);
            int j = batch.runEnd(i, end);
            long len = batch.runBytes(i, j);
            long src = toHost ? dev : host;
            long dst = toHost ? host : dev;
            if (len >= options.dmaThresholdBytes() && !kernelOnly) {
                longRun(src, dst, len, toHost);
            } else {
                descriptor(src, dst, len);
                if (n - chunkStart == chunk) {
                    launch(chunkStart, n, on);
                    chunkStart = n;
                    chunk = Math.min(chunk * 2, MAX_CHUNK);
                }
            }
            i = j;
        }
        launch(chunkStart, n, on);
    }

    private void longRun(long src, long dst, long len, boolean toHost) {
        if (toHost && pace != null) {
            pacedRun(src, dst, len);
            return;
        }
        copyRun(src, dst, len, toHost, stream);
        if (runs.count >= runChunk) { // the copy engine starts on the first runs while the rest are listed
            runs.flush(stream);
            runChunk = Math.min(runChunk * 2, MAX_RUNS);
        }
    }

    /**
     * A save's long run under the pace: listed a unit at a time ({@link #runUnitFill}); a unit
     * takes its permit before any of its copies is queued (without the driver's batch copy each
     * run is queued as it is listed) and is queued whole once full ({@link #closeRunUnit}).
     */
    private void pacedRun(long src, long dst, long len) {
        while (len > 0) {
            if (runUnitFill == 0) {
                pace.acquire();
            }
            long part = Math.min(len, slotBytes - runUnitFill);
            copyRun(src, dst, part, true, stream);
            runUnitFill += part;
            src += part;
            dst += part;
            len -= part;
            if (runUnitFill >= slotBytes) {
                closeRunUnit();
            }
        }
    }

    /**
     * Queues the open unit of a paced save's long runs and marks its end for the pace; nothing
     * when none is open. Before every other flush of {@link #runs} and every other permit this
     * lane takes: a permit taken while one is open and unmarked could wait for itself.
     */
    private void closeRunUnit() {
        if (runUnitFill == 0) {
            return;
        }
        runs.flush(stream);
        pace.queued(slots + runUnit, stream);
        runUnit = (runUnit + 1) % RUN_UNITS;
        runUnitFill = 0;
    }

    private void descriptor(long src, long dst, long len) {
        long at = n * DESC_BYTES;
        desc.set(JAVA_LONG, at, src);
        desc.set(JAVA_LONG, at + 8, dst);
        desc.set(JAVA_LONG, at + 16, len);
        n++;
    }

    /**
     * Whether pieces [start, end) lie back to back in the pool in stretches long enough
     * for the copy engine ({@link #MIN_BOUNCE_STRETCH} on average): a block's layers do
     * (a load or save of whole blocks), one layer across blocks does not (a layer-wise
     * batch's group), and those stay on the kernel's direct path.
     */
    private boolean worthBouncing(CopyBatch batch, int start, int end) {
        if (end - start < 2) {
            return false;
        }
        long bytes = batch.length(start);
        int stretches = 1;
        for (int i = start + 1; i < end; i++) {
            long len = batch.length(i);
            bytes += len;
            if (batch.hostOffset(i - 1) + batch.length(i - 1) != batch.hostOffset(i)) {
                stretches++;
            }
        }
        return bytes / stretches >= MIN_BOUNCE_STRETCH;
    }

    /**
     * Pieces [i, end) through the bounce buffer. A load: the copy engine moves each slot's
     * pool stretches into the slot on {@link #stream}, then the kernel scatters the slot
     * to the pieces' device addresses on {@link #aux}; a save: the kernel gathers into the
     * slot on {@code aux}, then the copy engine moves it to the pool on {@code stream}.
     * Events hand each slot between the two streams ({@code filled}, then {@code freed}
     * before it is filled again), so one slot copies over PCIe while another is scattered
     * or gathered in device memory. Runs long on both sides still go straight through the
     * copy engine, and a piece longer than a slot takes the kernel's direct path. A load's
     * {@code stream} waits for its last scatter when {@code join} (else the caller orders what
     * follows after {@code aux}). Returns whether any piece went through a slot.
     */
    private boolean bounced(CopyBatch batch, int i, int end, boolean toHost, boolean join) {
        long poolBase = pool.address();
        slotFill = 0;
        slotDescStart = n;
        stretchCount = 0;
        boolean any = false;
        while (i < end) {
            long dev = batch.deviceAddress(i);
            long host = poolBase + batch.hostOffset(i);
            int j = batch.runEnd(i, end);
            long len = batch.runBytes(i, j);
            if (len >= options.dmaThresholdBytes()) {
                longRun(toHost ? dev : host, toHost ? host : dev, len, toHost);
            } else if (len > slotBytes) {
                if (slotFill > 0) {
                    closeSlot(toHost); // its descriptors end here: the direct one below is not the slot's
                }
                int from = n;
                descriptor(toHost ? dev : host, toHost ? host : dev, len);
                launch(from, n, stream);
                slotDescStart = n;
            } else {
                if (slotFill + len > slotBytes) {
                    closeSlot(toHost);
                }
                long at = bounce + slot * slotBytes + slotFill;
                int last = stretchCount - 1;
                if (last >= 0 && stretchHost[last] + stretchLen[last] == host) {
                    stretchLen[last] += len;
                } else {
                    addStretch(host, at, len);
                }
                descriptor(toHost ? dev : at, toHost ? at : dev, len);
                slotFill += len;
                any = true;
            }
            i = j;
        }
        if (slotFill > 0) {
            closeSlot(toHost);
        }
        if (any && !toHost && join) {
            // a load's last scatter ran on aux (in order, so it covers the earlier ones)
            int lastSlot = (slot + slots - 1) % slots;
            CudaDriver.streamWaitEvent(stream, freed[lastSlot]);
        }
        return any;
    }

    /** Queues the current slot's copy and kernel (see {@link #bounced}) and moves to the next slot. */
    private void closeSlot(boolean toHost) {
        int s = slot;
        closeRunUnit(); // a paced save's open unit of long runs, under its own permit
        runs.flush(stream); // long runs listed so far go first: the waits below must not hold them back
        if (toHost) {
            if (slotUsed[s]) {
                CudaDriver.streamWaitEvent(aux, freed[s]);
            }
            launch(slotDescStart, n, aux);
            CudaDriver.eventRecord(filled[s], aux);
            CudaDriver.streamWaitEvent(stream, filled[s]);
            if (pace != null) {
                pace.acquire(); // the copy engine holds few of the engine's save copies at once
            }
            copyStretches(true);
            runs.flush(stream);
            CudaDriver.eventRecord(freed[s], stream);
            if (pace != null) {
                pace.queued(s, stream);
            }
        } else {
            if (slotUsed[s]) {
                CudaDriver.streamWaitEvent(stream, freed[s]);
            }
            copyStretches(false);
            runs.flush(stream);
            CudaDriver.eventRecord(filled[s], stream);
            CudaDriver.streamWaitEvent(aux, filled[s]);
            launch(slotDescStart, n, aux);
            CudaDriver.eventRecord(freed[s], aux);
        }
        engine.countBounced(slotFill);
        slotUsed[s] = true;
        slot = (s + 1) % slots;
        slotFill = 0;
        slotDescStart = n;
        stretchCount = 0;
    }

    /**
     * The current slot's pool stretches through the copy engine on {@link #stream}. A load's
     * stretches of one length at one stride in the pool (one layer of blocks that lie in a
     * row: a layer-wise load's slot), {@link #MIN_PITCHED_ROWS} of them or more, go as one
     * pitched copy, not one listed copy each: the driver's work per listed copy holds up the
     * process's other CUDA calls, vLLM's kernel launches among them (docs/gpu.md, "Layer-wise
     * loads and the launch rate"). The rest, and a save's stretches, as before.
     */
    private void copyStretches(boolean toHost) {
        int k = 0;
        while (k < stretchCount) {
            int rows = engine.pitchedCopiesOn() && !toHost ? stridedRows(stretchHost, stretchBounce, stretchLen, k, stretchCount,
                    engine.bytesToChunkEnd(stretchHost[k])) : 1;
            if (rows >= MIN_PITCHED_ROWS) {
                engine.countPitched();
                CudaDriver.memcpy2DHtoDAsync(copy2D, stretchBounce[k], stretchLen[k], stretchHost[k],
                        stretchHost[k + 1] - stretchHost[k], stretchLen[k], rows, stream);
                k += rows;
            } else {
                copyRun(toHost ? stretchBounce[k] : stretchHost[k], toHost ? stretchHost[k] : stretchBounce[k],
                        stretchLen[k], toHost, stream);
                k++;
            }
        }
    }

    /** Once the batch's copies ended (or were drained after a failure): every save permit it still holds goes back. */
    void releaseSaveCopies() {
        if (pace != null) {
            pace.releaseAll();
        }
    }

    /** Fewer stretches in a row than this go as listed copies: a pitched copy is a call of its own. */
    static final int MIN_PITCHED_ROWS = 8;

    /** Pitched copies' stride at most this (the driver bounds a copy's pitch; a stride this long is rare). */
    static final long MAX_PITCH = 1L << 30;

    /**
     * How many stretches from {@code from} (of {@code count}) form one pitched copy: the same
     * length, host addresses at one stride of at least that length (rows never overlap) and
     * at most {@link #MAX_PITCH}, bounce addresses back to back, and every row before the end
     * of the pinned chunk that holds the first ({@code chunkRoom} bytes from it: a copy must
     * not span two registrations). 1 when the next stretch breaks the pattern.
     */
    static int stridedRows(long[] host, long[] bounce, long[] len, int from, int count, long chunkRoom) {
        if (from + 1 >= count || len[from + 1] != len[from]) {
            return 1;
        }
        long width = len[from];
        long pitch = host[from + 1] - host[from];
        if (pitch < width || pitch > MAX_PITCH) {
            return 1;
        }
        int rows = 1;
        while (from + rows < count
                && len[from + rows] == width
                && host[from + rows] - host[from + rows - 1] == pitch
                && bounce[from + rows] == bounce[from + rows - 1] + width
                && rows * pitch + width <= chunkRoom) {
            rows++;
        }
        return rows;
    }

    private void addStretch(long host, long at, long len) {
        if (stretchCount == stretchHost.length) {
            int cap = Math.max(16, 2 * stretchCount);
            stretchHost = java.util.Arrays.copyOf(stretchHost, cap);
            stretchBounce = java.util.Arrays.copyOf(stretchBounce, cap);
            stretchLen = java.util.Arrays.copyOf(stretchLen, cap);
        }
        stretchHost[stretchCount] = host;
        stretchBounce[stretchCount] = at;
        stretchLen[stretchCount] = len;
        stretchCount++;
    }

    /**
     * One long run through the copy engine, split where the host side crosses from one
     * pinned chunk into the next: the driver rejects an async copy whose host range spans
     * two registrations (CUDA_ERROR_INVALID_VALUE, seen on the H200).
     */
    private void copyRun(long src, long dst, long len, boolean toHost, long stream) {
        if (!toHost && !engine.dmaBatched()) {
            copyHtoD(engine, src, dst, len, stream);
            return;
        }
        while (len > 0) {
            long host = toHost ? dst : src;
            long part = Math.min(len, engine.bytesToChunkEnd(host));
            if (engine.dmaBatched()) {
                runs.add(src, dst, part);
            } else {
                CudaDriver.memcpyDtoHAsync(dst, src, part, stream);
            }
            src += part;
            dst += part;
            len -= part;
        }
    }

    /** Pool bytes at {@code host} to {@code dev} on {@code stream}, one async copy per pinned chunk they touch (see {@link #copyRun}). */
    static void copyHtoD(CudaTransferEngine engine, long host, long dev, long len, long stream) {
        while (len > 0) {
            long part = Math.min(len, engine.bytesToChunkEnd(host));
            CudaDriver.memcpyHtoDAsync(dev, host, part, stream);
            host += part;
            dev += part;
            len -= part;
        }
    }

    /** Uploads descriptors [from, to) and launches the kernel over them on {@code on}. */
    private void launch(int from, int to, long on) {
        if (to == from) {
            return;
        }
        long offset = from * DESC_BYTES;
        if (options.hostDescriptors()) {
            argDesc.set(JAVA_LONG, 0, staging + offset); // pinned and mapped at its host address (UVA)
        } else {
            CudaDriver.memcpyHtoDAsync(deviceDesc + offset, staging + offset, (to - from) * DESC_BYTES, on);
            argDesc.set(JAVA_LONG, 0, deviceDesc + offset);
        }
        argCount.set(JAVA_INT, 0, to - from);
        CudaDriver.launchKernel(function, Math.min(to - from, grid), THREADS, 0, on, params);
    }

    /** The pinned descriptor buffer holds at least {@code bytes}. */
    void ensureStaging(long bytes) {
        if (bytes > stagingBytes) {
            long size = regrow(staging, stagingBytes, bytes, CudaDriver::memFreeHost);
            staging = 0; // freed: a failed allocation below leaves nothing to free twice
            stagingBytes = 0;
            staging = CudaDriver.memAllocHost(size);
            stagingBytes = size;
        }
    }

    /** The device copy of the descriptors holds at least {@code bytes}. */
    void ensureDeviceDesc(long bytes) {
        if (bytes > deviceDescBytes) {
            long size = regrow(deviceDesc, deviceDescBytes, bytes, CudaDriver::memFree);
            deviceDesc = 0;
            deviceDescBytes = 0;
            deviceDesc = CudaDriver.memAlloc(size);
            deviceDescBytes = size;
        }
    }

    /**
     * Frees a buffer of {@code had} bytes at {@code address} (0: none) that must grow to hold
     * {@code bytes}, and returns the size to allocate instead (at least double, 64 KiB at least).
     * The previous batch on this lane completed before the lane was handed out, so nothing reads it.
     */
    private static long regrow(long address, long had, long bytes, java.util.function.LongConsumer free) {
        if (address != 0) {
            free.accept(address);
        }
        return Math.max(bytes, Math.max(1 << 16, had * 2));
    }

    private void ensureGroupEvents(int groups) {
        if (groups <= groupEvents.length) {
            return;
        }
        long[] more = java.util.Arrays.copyOf(groupEvents, groups);
        for (int g = groupEvents.length; g < groups; g++) {
            more[g] = CudaDriver.eventCreate(CudaDriver.CU_EVENT_DISABLE_TIMING);
        }
        groupEvents = more;
    }

    /** Completion thread: wait for each batch's done event, free the lane, complete. */
    private void complete() {
        boolean current = false;
        while (true) {
            Future f;
            try {
                f = pending.take();
            } catch (InterruptedException e) {
                return;
            }
            Throwable failure = null;
            try {
                if (!current) {
                    device.makeCurrent();
                    current = true;
                }
                CudaDriver.eventSynchronize(doneEvent);
            } catch (Throwable t) {
                failure = t;
            }
            releaseSaveCopies(); // after the done event every copy of the batch ended
            home.add(this);
            if (failure == null) {
                f.complete(null);
            } else {
                f.completeExceptionally(failure);
            }
        }
    }

    void destroy() {
        enqueuer.shutdownNow();
        completer.interrupt();
        try {
            completer.join(5000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        CudaDriver.streamSynchronize(stream);
        for (long e : groupEvents) {
            CudaDriver.eventDestroy(e);
        }
        CudaDriver.eventDestroy(doneEvent);
        CudaDriver.eventDestroy(callerEvent);
        CudaDriver.streamDestroy(stream);
        if (bounce != 0) {
            CudaDriver.streamSynchronize(aux);
            for (int s = 0; s < slots; s++) {
                CudaDriver.eventDestroy(filled[s]);
                CudaDriver.eventDestroy(freed[s]);
            }
            if (pace != null) {
                pace.destroy();
            }
            CudaDriver.streamDestroy(aux);
            CudaDriver.memFree(bounce);
        }

        if (staging != 0) {
            CudaDriver.memFreeHost(staging);
        }
        if (deviceDesc != 0) {
            CudaDriver.memFree(deviceDesc);
        }
    }

    /** A batch in flight on this lane; group events stay valid until the lane is reused. */
    final class Future extends TransferFuture {
        final int groups;
        /** Groups whose copies and event are queued (guarded by this; {@link #enqueueLater}). */
        private int queued;

        Future(int groups) {
            this.groups = groups;
            whenComplete((v, e) -> queued(groups));
        }

        synchronized void queued(int upTo) {
            queued = Math.max(queued, upTo);
            notifyAll();
        }

        /** Until group {@code group} is queued or the batch is done (failed included). */
        private synchronized void awaitQueued(int group) {
            boolean interrupted = false;
            while (queued <= group && !isDone()) {
                try {
                    wait();
                } catch (InterruptedException e) {
                    interrupted = true;
                }
            }
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }

        @Override
        public void awaitGroup(int group, long stream) {
            if (group < 0 || group >= Math.max(1, groups)) {
                throw new IllegalArgumentException("group " + group + " out of range [0, " + Math.max(1, groups) + ")");
            }
            if (groups > 1) {
                awaitQueued(group);
            }
            if (isDone()) {
                join(); // rethrows a failure; nothing left to wait for otherwise
                return;
            }
            // If the lane was reused meanwhile, the event marks a later point of the same
            // stream: waiting on it over-waits, never under-waits.
            long event = groups > 1 ? groupEvents[group] : doneEvent;
            device.makeCurrent();
            if (stream == 0) {
                CudaDriver.eventSynchronize(event);
            } else {
                CudaDriver.streamWaitEvent(stream, event);
            }
        }
    }
}
