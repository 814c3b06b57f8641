package io.pegaflow.engine.cuda;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.CopyBatch;
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
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.function.LongFunction;

/**
 * Moves {@link CopyBatch}es between GPU memory and the host pool on one device.
 *
 * <ul>
 *   <li><b>Pinned pool.</b> At creation the pool is registered with CUDA
 *       ({@code PORTABLE | DEVICEMAP}) in chunks; with unified addressing the device sees it
 *       at its host address, which both the copy engine and the kernel use.</li>
 *   <li><b>Lanes.</b> Each direction has a few lanes: a stream, events and a reusable pinned
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
    private static final int THREADS = 256;
    private static final int MAX_GRID = 65535;
    private static final long DESC_BYTES = 24;
    /**
     * Descriptors per launch ramp up from 256 (the GPU starts after a few microseconds of
     * host work) to 8192 (256 MiB of 32 KiB pieces, ~5 ms of PCIe time, so the gaps between
     * launches stay negligible).
     */
    private static final int FIRST_CHUNK = 256;
    private static final int MAX_CHUNK = 8192;
    /** Long runs per cuMemcpyBatchAsync, ramping the same way: 16 (32 MiB of 2 MiB runs) to 1024. */
    private static final int FIRST_RUNS = 16;
    private static final int MAX_RUNS = 1024;
    /** Average bytes back to back in the pool from which a group takes the bounce path (a block of a small model is 1-2 MiB). */
    static final long MIN_BOUNCE_STRETCH = 256 << 10;

    private final CudaDevice device;
    private final HostPool pool;
    private final CudaOptions options;
    private final long registrationNanos;
    private final long createdNanos = System.nanoTime();
    private final long chunkBytes;
    private final long mappedBytes;
    private final int chunks;
    /** 1 where chunk {@code c} is pinned (set under {@code pinLocks[c]}). */
    private final java.util.concurrent.atomic.AtomicIntegerArray pinned;
    private final Object[] pinLocks;
    private final CompletableFuture<Long> fullyPinned = new CompletableFuture<>();
    private Thread pinner;
    private long module;
    private long function;
    private final Arena arena = Arena.ofShared();
    private final java.util.concurrent.atomic.AtomicLong bouncedBytes = new java.util.concurrent.atomic.AtomicLong();
    private final BlockingQueue<Lane> saveLanes;
    private final BlockingQueue<Lane> loadLanes;
    private final List<Lane> allLanes = new ArrayList<>();
    private volatile boolean closed;
    /** Long runs go to the copy engine batched ({@link CudaOptions#dmaBatch()}), checked at creation. */
    private boolean dmaBatch;

    private CudaTransferEngine(HostPool pool, CudaOptions options) {
        this.pool = pool;
        this.options = options;
        this.device = CudaDevice.open(options.device());
        this.chunkBytes = options.registerChunkBytes();
        this.mappedBytes = (pool.size() + 4095) / 4096 * 4096; // the mapping extends to the page end
        this.chunks = (int) ((mappedBytes + chunkBytes - 1) / chunkBytes);
        this.pinned = new java.util.concurrent.atomic.AtomicIntegerArray(chunks);
        this.pinLocks = new Object[chunks];
        for (int c = 0; c < chunks; c++) {
            pinLocks[c] = new Object();
        }
        boolean ok = false;
        try {
            if (CudaDriver.deviceAttribute(CudaDriver.ATTR_UNIFIED_ADDRESSING, device.handle()) != 1) {
                throw new CudaException(device + " lacks unified addressing; the host pool cannot be mapped at its host address", -1);
            }
            long start = System.nanoTime();
            register();
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
                Lane s = new Lane("save-" + i, saveLanes);
                Lane l = new Lane("load-" + i, loadLanes);
                allLanes.add(s);
                allLanes.add(l);
                saveLanes.add(s);
                loadLanes.add(l);
            }
            warmUp();
            dmaBatch = options.dmaBatch() && CudaDriver.hasMemcpyBatch() && batchSelfTest();
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
        for (Lane lane : allLanes) {
            lane.ensureStaging(WARM_DESCRIPTORS * DESC_BYTES);
            if (!options.hostDescriptors()) {
                lane.ensureDeviceDesc(WARM_DESCRIPTORS * DESC_BYTES);
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
        Lane lane = allLanes.get(0);
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

    /**
     * Pins the pool in chunks ({@code registerChunkBytes}). Pinning pays per page and the
     * driver serializes it within a process (on the H200, 16 threads pinning chunks barely
     * helped: docs/gpu.md, "Pool attach"), so with {@code pinInBackground} only the first chunk
     * is pinned here and a daemon thread pins the rest in order; a batch that touches a chunk
     * not yet pinned pins it first ({@link #ensurePinned}). Without it every chunk is pinned
     * here.
     */
    private void register() {
        pin(0);
        if (!options.pinInBackground()) {
            for (int c = 1; c < chunks; c++) {
                pin(c);
            }
            fullyPinned.complete(System.nanoTime() - createdNanos);
            return;
        }
        if (chunks == 1) {
            fullyPinned.complete(System.nanoTime() - createdNanos);
            return;
        }
        pinner = Thread.ofPlatform().daemon().name("pegaflow-pin").start(() -> {
            try {
                for (int c = 1; c < chunks && !closed; c++) {
                    pin(c);
                }
                fullyPinned.complete(System.nanoTime() - createdNanos);
            } catch (RuntimeException e) {
                // a later batch retries its chunks itself and fails with the driver's reason
                LOG.log(System.Logger.Level.WARNING, "pinning the host pool in the background stopped: " + e);
                fullyPinned.completeExceptionally(e);
            }
        });
    }

    /** Pins chunk {@code c} unless it is; safe from any thread. */
    private void pin(int c) {
        if (pinned.get(c) != 0) {
            return;
        }
        synchronized (pinLocks[c]) {
            if (pinned.get(c) != 0 || closed) {
                return;
            }
            long base = pool.address();
            long off = c * chunkBytes;
            long len = Math.min(chunkBytes, mappedBytes - off);
            device.makeCurrent();
            try {
                CudaDriver.memHostRegister(base + off, len, CudaDriver.CU_MEMHOSTREGISTER_PORTABLE
                        | CudaDriver.CU_MEMHOSTREGISTER_DEVICEMAP);
            } catch (CudaException e) {
                java.nio.file.Path file = pool.file();
                if (file != null && !file.toAbsolutePath().startsWith("/dev/shm")) {
                    // seen on the H200: a pool file on a disk file system cannot be pinned
                    throw new CudaException(e.getMessage() + "; the pool file " + file + " is not under /dev/shm: the "
                            + "kernel pins only shared memory (tmpfs) for CUDA, so give pegaflow-server a --pool-path "
                            + "under /dev/shm", e);
                }
                throw e;
            }
            pinned.set(c, 1);
            long mapped = CudaDriver.memHostGetDevicePointer(base + off);
            if (mapped != base + off) {
                throw new CudaException("pinned pool chunk at 0x" + Long.toHexString(base + off) + " is mapped at device address 0x"
                        + Long.toHexString(mapped) + "; this engine needs registered memory at its host address", -1);
            }
        }
    }

    /** Pins, before a batch is queued, every chunk its pool side touches that is not pinned yet. */
    private void ensurePinned(CopyBatch batch) {
        if (fullyPinned.isDone() && !fullyPinned.isCompletedExceptionally()) {
            return;
        }
        int last = -1;
        for (int i = 0; i < batch.size(); i++) {
            long off = batch.hostOffset(i);
            int end = (int) ((off + batch.length(i) - 1) / chunkBytes);
            for (int c = (int) (off / chunkBytes); c <= end; c++) {
                if (c != last && pinned.get(c) == 0) {
                    pin(c);
                }
                last = c;
            }
        }
    }

    /** Nanoseconds from creation until every chunk of the pool was pinned (waits for the background pinning). */
    public long awaitFullyPinned() {
        return fullyPinned.join();
    }

    public CudaDevice device() {
        return device;
    }

    /**
     * Bytes from {@code hostAddress} (inside the pool) to the end of its pinned chunk: the
     * most one async copy may cover starting there.
     */
    public long bytesToChunkEnd(long hostAddress) {
        long chunk = options.registerChunkBytes();
        long off = hostAddress - pool.address();
        return chunk - Math.floorMod(off, chunk);
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
    public TransferFuture submit(CopyBatch batch) {
        if (closed) {
            throw new CudaException("CUDA copy engine is closed", -1);
        }
        ensurePinned(batch);
        BlockingQueue<Lane> lanes = batch.direction() == CopyBatch.Direction.TO_HOST ? saveLanes : loadLanes;
        Lane lane;
        try {
            lane = lanes.take();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new CudaException("interrupted while waiting for a free CUDA copy lane", e);
        }
        CudaFuture future = new CudaFuture(lane, batch.groupCount());
        try {
            device.makeCurrent();
            lane.enqueue(batch, future);
            lane.pending.add(future);
        } catch (RuntimeException | Error e) {
            // what was queued before the failure still runs: let it finish before the caller
            // rolls the plan back (freeing the slots) and before the lane's buffers are reused
            try {
                CudaDriver.streamSynchronize(lane.stream);
                if (lane.aux != 0) {
                    CudaDriver.streamSynchronize(lane.aux);
                }
            } catch (RuntimeException drained) {
                e.addSuppressed(drained);
            }
            lanes.add(lane);
            future.completeExceptionally(e);
        }
        return future;
    }

    /** A batch in flight on a lane; group events stay valid until the lane is reused. */
    private final class CudaFuture extends TransferFuture {
        final Lane lane;
        final int groups;

        CudaFuture(Lane lane, int groups) {
            this.lane = lane;
            this.groups = groups;
        }

        @Override
        public void awaitGroup(int group, long stream) {
            if (group < 0 || group >= Math.max(1, groups)) {
                throw new IllegalArgumentException("group " + group + " out of range [0, " + Math.max(1, groups) + ")");
            }
            if (isDone()) {
                join(); // rethrows a failure; nothing left to wait for otherwise
                return;
            }
            // If the lane was reused meanwhile, the event marks a later point of the same
            // stream: waiting on it over-waits, never under-waits.
            long event = groups > 1 ? lane.groupEvents[group] : lane.doneEvent;
            device.makeCurrent();
            if (stream == 0) {
                CudaDriver.eventSynchronize(event);
            } else {
                CudaDriver.streamWaitEvent(stream, event);
            }
        }
    }

    /** Copies listed for one {@code cuMemcpyBatchAsync}: destinations, sources, sizes (host arrays, read during the call). */
    private final class RunList {
        private MemorySegment dst = arena.allocate(JAVA_LONG, 64);
        private MemorySegment src = arena.allocate(JAVA_LONG, 64);
        private MemorySegment len = arena.allocate(JAVA_LONG, 64);
        private final MemorySegment attr = arena.allocate(CudaDriver.MEMCPY_ATTRIBUTES_BYTES, 8);
        private final MemorySegment attrIdx = arena.allocate(JAVA_LONG);
        private final MemorySegment failIdx = arena.allocate(JAVA_LONG);
        int count;

        RunList() {
            attr.set(JAVA_INT, 0, CudaDriver.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM); // location hints: none; flags: 0
        }

        void add(long from, long to, long bytes) {
            if (count == len.byteSize() / 8) { // bounded: a list is flushed at MAX_RUNS
                dst = grow(dst);
                src = grow(src);
                len = grow(len);
            }
            dst.setAtIndex(JAVA_LONG, count, to);
            src.setAtIndex(JAVA_LONG, count, from);
            len.setAtIndex(JAVA_LONG, count, bytes);
            count++;
        }

        private MemorySegment grow(MemorySegment old) {
            MemorySegment m = arena.allocate(JAVA_LONG, 2L * count);
            m.copyFrom(old);
            return m;
        }

        /** Queues the listed copies on {@code stream} in one call. */
        void flush(long stream) {
            if (count == 0) {
                return;
            }
            int n = count;
            count = 0;
            CudaDriver.memcpyBatchAsync(dst.address(), src.address(), len.address(), n, attr.address(), attrIdx.address(),
                    failIdx.address(), stream);
        }

        void clear() {
            count = 0;
        }
    }

    /** A stream with its events and descriptor buffers; owned by one batch at a time. */
    private final class Lane {
        final String name;
        final BlockingQueue<Lane> home;
        final long stream;
        final long doneEvent;
        final long callerEvent;
        long[] groupEvents = new long[0];
        long staging;
        long stagingBytes;
        long deviceDesc;
        long deviceDescBytes;
        final MemorySegment params = arena.allocate(ADDRESS, 2);
        final MemorySegment argDesc = arena.allocate(JAVA_LONG);
        final MemorySegment argCount = arena.allocate(JAVA_INT);
        /** Long runs waiting for one cuMemcpyBatchAsync on {@link #stream}. */
        final RunList runs = new RunList();
        final BlockingQueue<CudaFuture> pending = new LinkedBlockingQueue<>();
        final Thread completer;
        /** The bounce path (0 when off): the kernel's stream, the device buffer and its slots' events. */
        final long aux;
        final long bounce;
        final long slotBytes;
        final int slots = options.bounceSlots();
        final long[] filled = new long[slots];
        final long[] freed = new long[slots];
        final boolean[] slotUsed = new boolean[slots];
        private int slot;
        private long slotFill;
        private int slotDescStart;
        /** The current slot's pool stretches: host address, bounce address, bytes. */
        private long[] stretchHost = new long[16];
        private long[] stretchBounce = new long[16];
        private long[] stretchLen = new long[16];
        private int stretchCount;

        Lane(String name, BlockingQueue<Lane> home) {
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
            } else {
                this.aux = 0;
                this.bounce = 0;
            }
            this.completer = Thread.ofPlatform().daemon().name("pegaflow-cuda-" + name).start(this::complete);
        }

        /** On the submitting thread, with the device current: queue every copy of the batch. */
        void enqueue(CopyBatch batch, CudaFuture future) {
            if (batch.waitStream() != 0) {
                CudaDriver.eventRecord(callerEvent, batch.waitStream());
                CudaDriver.streamWaitEvent(stream, callerEvent);
                if (bounce != 0) {
                    CudaDriver.streamWaitEvent(aux, callerEvent); // a save's gathers read what the caller wrote
                }
            }
            boolean toHost = batch.direction() == CopyBatch.Direction.TO_HOST;
            int groups = Math.max(1, batch.groupCount());
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
            for (int g = 0; g < groups; g++) {
                int end = batch.size() == 0 ? 0 : batch.groupEnd(g);
                int start = batch.size() == 0 ? 0 : batch.groupStart(g);
                if (bounce != 0 && worthBouncing(batch, start, end)) {
                    bounced(batch, start, end, toHost);
                } else {
                    direct(batch, start, end, toHost);
                }
                runs.flush(stream);
                if (groups > 1) {
                    CudaDriver.eventRecord(groupEvents[g], stream);
                }
            }
            CudaDriver.eventRecord(doneEvent, stream);
        }

        // Per-batch state of enqueue (one batch holds the lane at a time).
        private MemorySegment desc;
        /** Descriptors written so far in this batch; each launch covers a range of them. */
        private int n;
        private int chunk;
        private int runChunk;

        /**
         * Pieces [i, end): merge runs; long ones go to the copy engine at once, short ones
         * become descriptors the kernel moves over PCIe, launched a chunk at a time so the GPU
         * copies chunk k while this thread writes chunk k+1 (the host-side work overlaps
         * instead of adding up).
         */
        private void direct(CopyBatch batch, int i, int end, boolean toHost) {
            long poolBase = pool.address();
            int chunkStart = n;
            while (i < end) {
                long dev = batch.deviceAddress(i);
                long host = poolBase + batch.hostOffset(i);
                int j = batch.runEnd(i, end);
                long len = batch.runBytes(i, j);
                long src = toHost ? dev : host;
                long dst = toHost ? host : dev;
                if (len >= options.dmaThresholdBytes()) {
                    longRun(src, dst, len, toHost);
                } else {
                    descriptor(src, dst, len);
                    if (n - chunkStart == chunk) {
                        launch(chunkStart, n, stream);
                        chunkStart = n;
                        chunk = Math.min(chunk * 2, MAX_CHUNK);
                    }
                }
                i = j;
            }
            launch(chunkStart, n, stream);
        }

        private void longRun(long src, long dst, long len, boolean toHost) {
            copyRun(src, dst, len, toHost, stream);
            if (runs.count >= runChunk) { // the copy engine starts on the first runs while the rest are listed
                runs.flush(stream);
                runChunk = Math.min(runChunk * 2, MAX_RUNS);
            }
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
         * copy engine, and a piece longer than a slot takes the kernel's direct path.
         */
        private void bounced(CopyBatch batch, int i, int end, boolean toHost) {
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
            if (any && !toHost) {
                // a load's last scatter ran on aux (in order, so it covers the earlier ones)
                int lastSlot = (slot + slots - 1) % slots;
                CudaDriver.streamWaitEvent(stream, freed[lastSlot]);
            }
        }

        /** Queues the current slot's copy and kernel (see {@link #bounced}) and moves to the next slot. */
        private void closeSlot(boolean toHost) {
            int s = slot;
            runs.flush(stream); // long runs listed so far go first: the waits below must not hold them back
            if (toHost) {
                if (slotUsed[s]) {
                    CudaDriver.streamWaitEvent(aux, freed[s]);
                }
                launch(slotDescStart, n, aux);
                CudaDriver.eventRecord(filled[s], aux);
                CudaDriver.streamWaitEvent(stream, filled[s]);
                for (int k = 0; k < stretchCount; k++) {
                    copyRun(stretchBounce[k], stretchHost[k], stretchLen[k], true, stream);
                }
                runs.flush(stream);
                CudaDriver.eventRecord(freed[s], stream);
            } else {
                if (slotUsed[s]) {
                    CudaDriver.streamWaitEvent(stream, freed[s]);
                }
                for (int k = 0; k < stretchCount; k++) {
                    copyRun(stretchHost[k], stretchBounce[k], stretchLen[k], false, stream);
                }
                runs.flush(stream);
                CudaDriver.eventRecord(filled[s], stream);
                CudaDriver.streamWaitEvent(aux, filled[s]);
                launch(slotDescStart, n, aux);
                CudaDriver.eventRecord(freed[s], aux);
            }
            bouncedBytes.addAndGet(slotFill);
            slotUsed[s] = true;
            slot = (s + 1) % slots;
            slotFill = 0;
            slotDescStart = n;
            stretchCount = 0;
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
            while (len > 0) {
                long host = toHost ? dst : src;
                long part = Math.min(len, bytesToChunkEnd(host));
                if (dmaBatch) {
                    runs.add(src, dst, part);
                } else if (toHost) {
                    CudaDriver.memcpyDtoHAsync(dst, src, part, stream);
                } else {
                    CudaDriver.memcpyHtoDAsync(dst, src, part, stream);
                }
                src += part;
                dst += part;
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
            CudaDriver.launchKernel(function, Math.min(to - from, MAX_GRID), THREADS, 0, on, params);
        }

        private void ensureStaging(long bytes) {
            if (bytes <= stagingBytes) {
                return;
            }
            long size = Math.max(bytes, Math.max(1 << 16, stagingBytes * 2));
            if (staging != 0) {
                CudaDriver.memFreeHost(staging);
                staging = 0;
                stagingBytes = 0;
            }
            staging = CudaDriver.memAllocHost(size);
            stagingBytes = size;
        }

        private void ensureDeviceDesc(long bytes) {
            if (bytes <= deviceDescBytes) {
                return;
            }
            long size = Math.max(bytes, Math.max(1 << 16, deviceDescBytes * 2));
            if (deviceDesc != 0) {
                // The previous batch on this lane completed before the lane was handed out.
                CudaDriver.memFree(deviceDesc);
                deviceDesc = 0;
                deviceDescBytes = 0;
            }
            deviceDesc = CudaDriver.memAlloc(size);
            deviceDescBytes = size;
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
                CudaFuture f;
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
                home.add(this);
                if (failure == null) {
                    f.complete(null);
                } else {
                    f.completeExceptionally(failure);
                }
            }
        }

        void destroy() {
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
    }

    /** Waits for every lane to come back (all batches done), then frees streams, kernel and pinning. */
    @Override
    public void close() {
        if (closed) {
            return;
        }
        closed = true;
        int lanes = options.lanesPerDirection();
        for (BlockingQueue<Lane> q : List.of(saveLanes, loadLanes)) {
            List<Lane> back = new ArrayList<>();
            try {
                while (back.size() < lanes) {
                    Lane l = q.poll(60, TimeUnit.SECONDS);
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
        device.makeCurrent();
        for (Lane l : allLanes) {
            l.destroy();
        }
        allLanes.clear();
        if (module != 0) {
            CudaDriver.moduleUnload(module);
            module = 0;
        }
        Thread t = pinner;
        if (t != null) {
            try {
                t.join(); // closed is set: it stops after the chunk it is pinning
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        device.makeCurrent();
        for (int c = 0; c < chunks; c++) {
            synchronized (pinLocks[c]) {
                if (pinned.get(c) != 0) {
                    CudaDriver.memHostUnregister(pool.address() + c * chunkBytes);
                    pinned.set(c, 0);
                }
            }
        }
        arena.close();
        device.close();
    }
}
