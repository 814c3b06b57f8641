package io.pegaflow.engine.cuda;

import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.CopyBatch;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicIntegerArray;

/**
 * The host pool registered with CUDA ({@code PORTABLE | DEVICEMAP}) in chunks of
 * {@link CudaOptions#registerChunkBytes()}: with unified addressing the device sees it at its
 * host address, which the copy engine and the kernel both use. Chunks are pinned at creation
 * or, with {@link CudaOptions#pinInBackground()}, by a daemon thread, a batch pinning the
 * chunks it touches first; {@link #release} unpins them all.
 */
final class PinnedPool {
    private static final System.Logger LOG = System.getLogger(PinnedPool.class.getName());
    private final HostPool pool;
    private final CudaDevice device;
    private final CudaOptions options;
    private final long createdNanos;
    private final long chunkBytes;
    private final long mappedBytes;
    private final int chunks;
    /** 1 where chunk {@code c} is pinned (set under {@code pinLocks[c]}). */
    private final AtomicIntegerArray pinned;
    private final Object[] pinLocks;
    private final CompletableFuture<Long> fullyPinned = new CompletableFuture<>();
    private Thread pinner;
    private volatile boolean closed;

    PinnedPool(HostPool pool, CudaDevice device, CudaOptions options, long createdNanos) {
        this.pool = pool;
        this.device = device;
        this.options = options;
        this.createdNanos = createdNanos;
        this.chunkBytes = options.registerChunkBytes();
        this.mappedBytes = (pool.size() + 4095) / 4096 * 4096; // the mapping extends to the page end
        this.chunks = (int) ((mappedBytes + chunkBytes - 1) / chunkBytes);
        this.pinned = new AtomicIntegerArray(chunks);
        this.pinLocks = new Object[chunks];
        for (int c = 0; c < chunks; c++) {
            pinLocks[c] = new Object();
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
    void register() {
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
    void pin(int c) {
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
    void ensurePinned(CopyBatch batch) {
        if (fullyPinned.isDone() && !fullyPinned.isCompletedExceptionally()) {
            return;
        }
        int last = -1;
        for (int i = 0; i < batch.size(); i++) {
            last = pinRange(batch.hostOffset(i), batch.length(i), last);
        }
    }

    /** Pins the chunks of pool bytes {@code [off, off + len)} not pinned yet (a staged load's stretch). */
    void ensurePinned(long off, long len) {
        if (!(fullyPinned.isDone() && !fullyPinned.isCompletedExceptionally())) {
            pinRange(off, len, -1);
        }
    }

    /** Pins the chunks of {@code [off, off + len)} but {@code skip} (just checked); returns the last chunk. */
    private int pinRange(long off, long len, int skip) {
        int end = (int) ((off + len - 1) / chunkBytes);
        int c = (int) (off / chunkBytes);
        for (; c <= end; c++) {
            if (c != skip && pinned.get(c) == 0) {
                pin(c);
            }
        }
        return end;
    }

    /** Nanoseconds from creation until every chunk of the pool was pinned (waits for the background pinning). */
    long awaitFullyPinned() {
        return fullyPinned.join();
    }

    /**
     * Bytes from {@code hostAddress} (inside the pool) to the end of its pinned chunk: the
     * most one async copy may cover starting there.
     */
    long bytesToChunkEnd(long hostAddress) {
        long chunk = options.registerChunkBytes();
        long off = hostAddress - pool.address();
        return chunk - Math.floorMod(off, chunk);
    }

    /** Stops the background pinning after the chunk it is pinning. */
    void stop() {
        closed = true;
    }

    /** Stops the background pinning, waits for it, and unpins every pinned chunk. */
    void release() {
        stop();
        Thread t = pinner;
        if (t != null) {
            try {
                t.join();
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
    }
}
