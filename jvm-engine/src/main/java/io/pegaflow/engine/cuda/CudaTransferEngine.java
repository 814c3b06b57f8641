package io.pegaflow.engine.cuda;

import static java.lang.foreign.ValueLayout.JAVA_LONG;

import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.CopyBatch;
import io.pegaflow.engine.transfer.LayerSplit;
import io.pegaflow.engine.transfer.TransferEngine;
import io.pegaflow.engine.transfer.TransferFuture;
import java.io.IOException;
import java.io.InputStream;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.function.LongFunction;

/**
 * Moves {@link CopyBatch}es between GPU memory and the host pool on one device.
 *
 * <ul>
 *   <li><b>Pinned pool</b> ({@link PinnedPool}). At creation the pool is registered with CUDA
 *       ({@code PORTABLE | DEVICEMAP}) in chunks; with unified addressing the device sees it
 *       at its host address, which both the copy engine and the kernel use.</li>
 *   <li><b>Lanes</b> ({@link CopyLane}, its long runs listed in a {@link CopyRunList}). Each direction has a few lanes: a stream, events and a reusable pinned
 *       descriptor buffer (mapped, so the kernel reads it directly; optionally uploaded to a
 *       device buffer first). A batch holds a lane from submit until its copies finish, so
 *       buffers are reused without per-call allocation and without racing the previous
 *       batch.</li>
 *   <li><b>Per batch.</b> Descriptors contiguous on both sides are merged. Merged runs of at
 *       least {@link CudaOptions#dmaThresholdBytes()} go to the copy engine, listed into
 *       {@code cuMemcpyBatchAsync} calls where the driver has it ({@link CudaOptions#dmaBatch()};
 *       one {@code cuMemcpyAsync} per 2 MiB run leaves a gap after each, which batching
 *       removes: docs/gpu.md, "How a batch moves"); the rest, vLLM's scattered
 *       16-64 KiB pieces, become descriptors and are moved by the NVRTC gather/scatter
 *       kernel, one CTA per piece, launched in chunks (256 pieces, doubling to 8192) so that
 *       building the next chunk's descriptors overlaps the copy of the previous one.</li>
 *   <li><b>Bounce path.</b> Where a group's scattered pieces lie back to back in the pool (a
 *       block's layers: whole-block saves and loads), the PCIe side goes through the copy
 *       engine instead: a load copies the pool stretches into a slot of the lane's device
 *       bounce buffer ({@link CudaOptions#bounceBytes()}) and the kernel scatters the slot
 *       to the pieces on a second stream; a save gathers into a slot, then copies it out.
 *       Slots handed between the streams by events keep the copy engine busy while the kernel
 *       works in device memory. The copy engine moves long runs at the PCIe line, where the
 *       kernel's own PCIe reads fall short of it (docs/gpu.md, "Server mode at line speed").</li>
 *   <li><b>Ordering.</b> A batch with a {@link CopyBatch#waitStream()} records an event on that
 *       stream when submitted and its lane waits for it, so a save reads what the caller's
 *       kernels wrote. Each group of a multi-group batch (a layer) records an event that
 *       {@link TransferFuture#awaitGroup} makes a caller's stream wait on.</li>
 *   <li><b>Completion.</b> One thread per lane blocks on the lane's done event (blocking
 *       sync, no spinning), returns the lane, and completes the future.</li>
 * </ul>
 */
public final class CudaTransferEngine implements TransferEngine {
    private static final System.Logger LOG = System.getLogger(CudaTransferEngine.class.getName());
    static final String KERNEL_RESOURCE = "pega_copy.cu";
    static final String KERNEL_NAME = "pega_copy";
    /** {@code 0} turns pitched copies off (A/B runs; docs/gpu.md, "Layer-wise loads and the launch rate"). */
    public static final String COPY_2D_ENV = "PEGAFLOW_CUDA_COPY_2D";
    private final CudaDevice device;
    private final HostPool pool;
    private final CudaOptions options;
    private final long registrationNanos;
    private final long createdNanos = System.nanoTime();
    private final PinnedPool pinned;
    private long module;
    private long function;
    /** Env {@link #COPY_2D_ENV}: whether loads' strided pool stretches go as pitched copies (read at creation, before anything is allocated). */
    private final boolean pitched = LayerSplit.parse(System.getenv(COPY_2D_ENV), COPY_2D_ENV, 0, 1, 1,
            "0 (one listed copy per pool stretch) or 1 (pitched copies where stretches lie at one stride, the default)") == 1;
    private final Arena arena = Arena.ofShared();
    private final java.util.concurrent.atomic.AtomicLong bouncedBytes = new java.util.concurrent.atomic.AtomicLong();
    private final java.util.concurrent.atomic.AtomicLong pacedGroups = new java.util.concurrent.atomic.AtomicLong();
    private final java.util.concurrent.atomic.AtomicLong pitchedCopies = new java.util.concurrent.atomic.AtomicLong();
    /** Saves' copies on the copy engine a few at a time ({@link CudaOptions#savePaceCopies}; null: not paced). */
    private final SavePace savePace;
    private final BlockingQueue<CopyLane> saveLanes;
    private final BlockingQueue<CopyLane> loadLanes;
    private final List<CopyLane> allLanes = new ArrayList<>();
    private volatile boolean closed;
    /** Loads staged at their lookup ({@link CudaOptions#stageBytes()}); null when off or its buffer could not be had. */
    private DeviceStager stager;
    /** Long runs go to the copy engine batched ({@link CudaOptions#dmaBatch()}), checked at creation. */
    private volatile boolean dmaBatch;

    private CudaTransferEngine(HostPool pool, CudaOptions options) {
        this.pool = pool;
        this.options = options;
        this.savePace = options.savePaceCopies() > 0 ? new SavePace(options.savePaceCopies()) : null;
        this.device = CudaDevice.open(options.device());
        this.pinned = new PinnedPool(pool, device, options, createdNanos);
        boolean ok = false;
        try {
            if (CudaDriver.deviceAttribute(CudaDriver.ATTR_UNIFIED_ADDRESSING, device.handle()) != 1) {
                throw new CudaException(device + " lacks unified addressing; the host pool cannot be mapped at its host address", -1);
            }
            long start = System.nanoTime();
            pinned.register();
            this.registrationNanos = System.nanoTime() - start;
            LOG.log(System.Logger.Level.INFO, () -> String.format(java.util.Locale.ROOT,
                    "pinned the %s host pool on %s in %.2f s", io.pegaflow.engine.Sizes.format(pool.size()), device,
                    registrationNanos / 1e9));
            Nvrtc nvrtc = Nvrtc.load(options.nvrtcDirs());
            byte[] cubin = nvrtc.compileCached(kernelSource(), KERNEL_NAME, device.arch(), List.of("-default-device"),
                    options.kernelCacheDir());
            this.module = CudaDriver.moduleLoadData(cubin);
            this.function = CudaDriver.moduleGetFunction(module, KERNEL_NAME);
            this.saveLanes = new ArrayBlockingQueue<>(options.lanesPerDirection());
            this.loadLanes = new ArrayBlockingQueue<>(options.lanesPerDirection());
            for (int i = 0; i < options.lanesPerDirection(); i++) {
                CopyLane s = new CopyLane(this, pool, options, device, function, arena, "save-" + i, saveLanes);
                CopyLane l = new CopyLane(this, pool, options, device, function, arena, "load-" + i, loadLanes);
                allLanes.add(s);
                allLanes.add(l);
                saveLanes.add(s);
                loadLanes.add(l);
            }
            warmUp();
            dmaBatch = options.dmaBatch() && CudaDriver.hasMemcpyBatch() && batchSelfTest();
            if (options.stageBytes() > 0) {
                // its device memory is taken at the first lookup that stages: a worker outside the
                // scheduler's process never stages and never holds it
                stager = new DeviceStager(this, device, pool, pinned, options.stageBytes(), arena);
            }
            ok = true;
        } finally {
            if (!ok) {
                releaseResources();
            }
        }
    }

    /** Descriptors every lane's buffer holds from the start: a 2,048-block batch of a 32-layer K/V model. */
    private static final int WARM_DESCRIPTORS = 1 << 17;

    /**
     * Before the first real batch: sizes every lane's descriptor buffer for a large batch and
     * runs the descriptor path and the kernel a dozen times, pool to a scratch device buffer
     * (the pool is only read: its bytes belong to the control plane), so the first save or load
     * runs at steady speed instead of paying buffer growth, the kernel's first launches and the
     * JIT of the descriptor loop.
     */
    private void warmUp() {
        device.makeCurrent();
        for (CopyLane lane : allLanes) {
            lane.ensureStaging(WARM_DESCRIPTORS * CopyLane.DESC_BYTES);
            if (!options.hostDescriptors()) {
                lane.ensureDeviceDesc(WARM_DESCRIPTORS * CopyLane.DESC_BYTES);
            }
        }
        int pieces = 1 << 16;
        long piece = 16;
        long span = Math.max(piece, (pool.size() - piece) / piece * piece);
        long scratch = CudaDriver.memAlloc(pieces * piece);
        try {
            CopyBatch batch = new CopyBatch(CopyBatch.Direction.TO_DEVICE, pieces);
            for (int i = 0; i < pieces; i++) {
                // every other 16 bytes of the pool: pieces that do not merge, as vLLM's do not
                batch.add(scratch + i * piece, (2 * i * piece) % span, piece);
            }
            for (int round = 0; round < 12; round++) {
                submit(batch).join();
            }
        } finally {
            CudaDriver.memFree(scratch);
        }
        if (options.bounceBytes() > 0) {
            warmUpBounce();
        }
    }

    /**
     * The bounce path's loads the same way: 16 KiB pieces back to back in the pool, in
     * reverse order on a scratch device buffer (so they do not merge), a dozen rounds on
     * every load lane at once (~3 GiB in all; docs/gpu.md, "How a batch moves").
     */
    private void warmUpBounce() {
        long piece = 16 << 10;
        long bytes = Math.min(64L << 20, pool.size() / piece * piece);
        int pieces = (int) (bytes / piece);
        if (pieces < 2) {
            return;
        }
        int lanes = options.lanesPerDirection();
        long scratch = CudaDriver.memAlloc(bytes * lanes);
        try {
            List<CopyBatch> batches = new ArrayList<>();
            for (int l = 0; l < lanes; l++) {
                CopyBatch batch = new CopyBatch(CopyBatch.Direction.TO_DEVICE, pieces);
                for (int i = 0; i < pieces; i++) {
                    batch.add(scratch + l * bytes + (pieces - 1 - i) * piece, i * piece, piece);
                }
                batches.add(batch);
            }
            for (int round = 0; round < 12; round++) {
                List<TransferFuture> inFlight = new ArrayList<>();
                for (CopyBatch b : batches) {
                    inFlight.add(submit(b));
                }
                inFlight.forEach(TransferFuture::join);
            }
        } finally {
            CudaDriver.memFree(scratch);
        }
    }

    /**
     * Runs {@code cuMemcpyBatchAsync} both ways through a lane on buffers of its own (never the
     * pool) and compares the bytes; false, logged, when the driver's batch copy does not work
     * here, and each run then takes its own {@code cuMemcpyAsync}.
     */
    private boolean batchSelfTest() {
        long half = 64 << 10;
        long host = CudaDriver.memAllocHost(2 * half);
        long dev = CudaDriver.memAlloc(half);
        CopyLane lane = allLanes.get(0);
        try {
            MemorySegment h = MemorySegment.ofAddress(host).reinterpret(2 * half);
            for (long o = 0; o < half; o += 8) {
                h.set(JAVA_LONG, o, o * 0x9E3779B97F4A7C15L + 1);
                h.set(JAVA_LONG, half + o, 0);
            }
            // two runs each way, swapped halves: the order of the runs is checked too
            lane.runs.add(host, dev + half / 2, half / 2);
            lane.runs.add(host + half / 2, dev, half / 2);
            lane.runs.flush(lane.stream);
            lane.runs.add(dev + half / 2, host + half, half / 2);
            lane.runs.add(dev, host + half + half / 2, half / 2);
            lane.runs.flush(lane.stream);
            CudaDriver.streamSynchronize(lane.stream);
            boolean same = h.asSlice(0, half).mismatch(h.asSlice(half, half)) < 0;
            if (!same) {
                LOG.log(System.Logger.Level.WARNING, "cuMemcpyBatchAsync moved the wrong bytes on " + device
                        + "; long runs take one cuMemcpyAsync each");
            }
            return same;
        } catch (CudaException e) {
            LOG.log(System.Logger.Level.WARNING, "cuMemcpyBatchAsync failed on " + device + " (" + e.getMessage()
                    + "); long runs take one cuMemcpyAsync each");
            return false;
        } finally {
            lane.runs.clear();
            CudaDriver.memFree(dev);
            CudaDriver.memFreeHost(host);
        }
    }

    /** Bytes moved through the lanes' bounce buffers since creation, warm-up included (the bounce path's own count). */
    public long bouncedBytes() {
        return bouncedBytes.get();
    }

    void countBounced(long bytes) {
        bouncedBytes.addAndGet(bytes);
    }

    /**
     * Groups of paced leads ({@link io.pegaflow.engine.transfer.LayerSplit#leadPaced}) queued only
     * once the group before them landed, their hold still closed, since creation.
     */
    public long pacedGroups() {
        return pacedGroups.get();
    }

    void countPaced() {
        pacedGroups.incrementAndGet();
    }

    /** The engine's save pace, or null where saves are not paced. */
    SavePace savePace() {
        return savePace;
    }

    /** Save copies queued under the pace ({@link CudaOptions#savePaceCopies}) since creation, warm-up included. */
    public long pacedSaveCopies() {
        return savePace == null ? 0 : savePace.pacedCopies();
    }

    /** Permits of the save pace free now: {@link CudaOptions#savePaceCopies} when no save copies (0 when not paced). */
    public int savePacePermitsFree() {
        return savePace == null ? 0 : savePace.permitsFree();
    }

    void countPitched() {
        pitchedCopies.incrementAndGet();
    }

    /** Whether loads' stretches at one stride go as pitched copies ({@link #COPY_2D_ENV}). */
    boolean pitchedCopiesOn() {
        return pitched;
    }

    /** Pitched copies queued so far: runs of pool stretches at one stride moved in one call each. */
    public long pitchedCopies() {
        return pitchedCopies.get();
    }

    /** Whether long runs go through {@code cuMemcpyBatchAsync} (the option, the driver and the check at creation). */
    public boolean dmaBatched() {
        return dmaBatch;
    }

    /**
     * Pins {@code pool} on {@code options.device()}, compiles (or loads from the cache) the
     * copy kernel and creates the lanes. Throws {@link CudaException} on a machine without a
     * GPU, naming what is missing.
     */
    public static CudaTransferEngine create(HostPool pool, CudaOptions options) {
        return new CudaTransferEngine(pool, options);
    }

    /** The kernel's CUDA C++ source (a resource next to this class). */
    public static String kernelSource() {
        try (InputStream in = CudaTransferEngine.class.getResourceAsStream(KERNEL_RESOURCE)) {
            if (in == null) {
                throw new IllegalStateException("kernel source " + KERNEL_RESOURCE + " missing from the jar");
            }
            return new String(in.readAllBytes(), StandardCharsets.UTF_8);
        } catch (IOException e) {
            throw new IllegalStateException("cannot read kernel source " + KERNEL_RESOURCE, e);
        }
    }

    /** Nanoseconds from creation until every chunk of the pool was pinned (waits for the background pinning). */
    public long awaitFullyPinned() {
        return pinned.awaitFullyPinned();
    }

    /**
     * Bytes from {@code hostAddress} (inside the pool) to the end of its pinned chunk: the
     * most one async copy may cover starting there.
     */
    public long bytesToChunkEnd(long hostAddress) {
        return pinned.bytesToChunkEnd(hostAddress);
    }

    public CudaDevice device() {
        return device;
    }

    /** Time spent pinning at creation (the first chunk only when the rest is pinned in the background). */
    public long registrationNanos() {
        return registrationNanos;
    }

    @Override
    public String name() {
        return "cuda";
    }

    /**
     * {@link CudaOptions#layerSplit()}; groups and the copy engine for layers only where the
     * bounce path is on (nothing else moves them faster).
     */
    @Override
    public io.pegaflow.engine.transfer.LayerSplit layerSplit() {
        io.pegaflow.engine.transfer.LayerSplit s = options.layerSplit();
        return options.bounceBytes() > 0 || (s.groupBytes() == 0 && !s.copyEngine()) ? s
                : new io.pegaflow.engine.transfer.LayerSplit(0, s.lanes(), s.kernelBlocks(), false, s.leadBytes(), s.leadPaced());
    }

    /**
     * Refuses a region whose bytes are not all CUDA device memory: a pointer past its tensor
     * would otherwise fault the copy kernel (and the process) at the first save or load.
     */
    @Override
    public void checkRegion(LayerRegion region) {
        if (closed) {
            throw new CudaException("CUDA copy engine is closed", -1);
        }
        device.makeCurrent();
        String fault = regionFault(region, device.ordinal(), CudaDriver::memGetAddressRange);
        if (fault != null) {
            throw new InvalidArgumentException(fault);
        }
    }

    /**
     * Where a region is not covered by CUDA memory, as a message, or {@code null} when every
     * byte of {@code [base, base + regionBytes)} is. {@code rangeOf} gives the allocation
     * holding an address as {@code {base, bytes}}, or {@code null} (the driver's
     * {@code cuMemGetAddressRange}). Mappings that follow each other without a gap count as
     * one allocation: PyTorch's expandable segments map a tensor in 20 MiB pieces, and the
     * driver reports each piece alone.
     */
    static String regionFault(LayerRegion region, int deviceOrdinal, LongFunction<long[]> rangeOf) {
        long start = region.baseAddress();
        long end = start + region.regionBytes();
        String where = "layer '" + region.layerName() + "': region 0x" + Long.toHexString(start) + " + "
                + region.regionBytes() + " bytes";
        String expected = " (device " + deviceOrdinal + "); expected the KV tensor's own memory";
        long[] first = rangeOf.apply(start);
        if (!holds(first, start)) {
            return where + " is not in a CUDA allocation" + expected;
        }
        long reached = first[0] + first[1];
        while (reached < end) {
            long[] next = rangeOf.apply(reached);
            if (!holds(next, reached)) {
                break;
            }
            reached = next[0] + next[1];
        }
        if (reached >= end) {
            return null;
        }
        return where + " ends " + (end - reached) + " bytes past its CUDA allocation 0x" + Long.toHexString(first[0])
                + " of " + (reached - first[0]) + " bytes" + expected;
    }

    private static boolean holds(long[] range, long address) {
        return range != null && range[1] > 0 && range[0] <= address && address - range[0] < range[1];
    }

    @Override
    public io.pegaflow.engine.transfer.Stager stager() {
        return stager;
    }

    @Override
    public TransferFuture submit(CopyBatch batch) {
        if (closed) {
            throw new CudaException("CUDA copy engine is closed", -1);
        }
        if (batch.stage() != null && (stager == null || batch.stage().stager() != stager
                || batch.direction() != CopyBatch.Direction.TO_DEVICE)) {
            throw new InvalidArgumentException("a staged batch of another engine's stager, or not a load");
        }
        pinned.ensurePinned(batch);
        BlockingQueue<CopyLane> lanes = batch.direction() == CopyBatch.Direction.TO_HOST ? saveLanes : loadLanes;
        CopyLane lane;
        try {
            lane = lanes.take();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new CudaException("interrupted while waiting for a free CUDA copy lane", e);
        }
        CopyLane.Future future = lane.new Future(batch.groupCount());
        try {
            device.makeCurrent();
            lane.recordCaller(batch); // here: the caller's stream as it stands at the call
            // a paced save too: its lane's thread waits for the copy engine, never the caller
            if (batch.groupCount() > 1 && batch.direction() == CopyBatch.Direction.TO_DEVICE
                    || batch.direction() == CopyBatch.Direction.TO_HOST && savePace != null) {
                // a layer-wise load: its groups are queued on the lane's own thread, and each
                // group can be waited for as soon as it is queued (LayeredLoad, vLLM's
                // wait_for_layer_load), not only once the driver took the whole batch, which
                // can block the queuing thread for as long as the copy runs
                lane.enqueueLater(batch, future, e -> fail(lanes, lane, future, e));
                return future;
            }
            batch.awaitGate(); // held batches are layer-wise loads (queued later, above); any other waits here
            lane.enqueue(batch, future);
            future.markQueuedOnDevice();
            lane.pending.add(future);
        } catch (RuntimeException | Error e) {
            fail(lanes, lane, future, e);
        }
        return future;
    }

    /**
     * A batch that could not be queued whole ({@code e}): what was queued before the failure
     * still runs; it finishes before the caller rolls the plan back (freeing the slots) and
     * before the lane's buffers are reused, then the future fails.
     */
    private static void fail(BlockingQueue<CopyLane> lanes, CopyLane lane, CopyLane.Future future, Throwable e) {
        try {
            CudaDriver.streamSynchronize(lane.stream);
            if (lane.aux != 0) {
                CudaDriver.streamSynchronize(lane.aux);
            }
        } catch (Throwable drained) {
            e.addSuppressed(drained);
        } finally {
            lane.releaseSaveCopies();
            // whatever the drain did: the lane goes home and every waiter on the batch wakes
            lanes.add(lane);
            future.completeExceptionally(e);
        }
    }

    /** Waits for every lane to come back (all batches done), then frees streams, kernel and pinning. */
    @Override
    public void close() {
        if (closed) {
            return;
        }
        closed = true;
        pinned.stop();
        int lanes = options.lanesPerDirection();
        for (BlockingQueue<CopyLane> q : List.of(saveLanes, loadLanes)) {
            List<CopyLane> back = new ArrayList<>();
            try {
                while (back.size() < lanes) {
                    CopyLane l = q.poll(60, TimeUnit.SECONDS);
                    if (l == null) {
                        throw new IllegalStateException("CUDA copies did not finish within 60 s of close()");
                    }
                    back.add(l);
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        releaseResources();
    }

    private void releaseResources() {
        if (stager != null) {
            stager.close();
            stager = null;
        }
        device.makeCurrent();
        for (CopyLane l : allLanes) {
            l.destroy();
        }
        allLanes.clear();
        if (module != 0) {
            CudaDriver.moduleUnload(module);
            module = 0;
        }
        if (pinned != null) {
            pinned.release();
        }
        arena.close();
        device.close();
    }
}
