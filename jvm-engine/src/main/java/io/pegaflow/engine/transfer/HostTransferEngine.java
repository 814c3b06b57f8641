package io.pegaflow.engine.transfer;

import io.pegaflow.engine.pool.HostPool;
import java.lang.foreign.MemorySegment;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Copies between raw host addresses (registered regions in CPU mode) and the host pool with
 * {@link MemorySegment#copy}. Runs of descriptors contiguous on both sides are merged into
 * one copy. Batches run on a small pool of copy threads; the pool side goes through the
 * pool's arena-scoped segment, so a copy after the pool closed fails instead of crashing.
 */
public final class HostTransferEngine implements TransferEngine {
    /** All of the address space: the device side is a raw address supplied by registration. */
    private static final MemorySegment EVERYTHING = MemorySegment.NULL.reinterpret(Long.MAX_VALUE);

    private final HostPool pool;
    private final ExecutorService copyThreads;

    public HostTransferEngine(HostPool pool, int threads) {
        if (threads < 1) {
            throw new IllegalArgumentException("copy threads " + threads + "; expected >= 1");
        }
        this.pool = pool;
        AtomicInteger n = new AtomicInteger();
        this.copyThreads = Executors.newFixedThreadPool(threads, r -> {
            Thread t = new Thread(r, "pegaflow-copy-" + n.incrementAndGet());
            t.setDaemon(true);
            return t;
        });
    }

    @Override
    public CompletableFuture<Void> submit(CopyBatch batch) {
        return CompletableFuture.runAsync(() -> copy(batch), copyThreads);
    }

    /** Performs the copies on the calling thread (used by benchmarks and by {@link #submit}). */
    public void copy(CopyBatch batch) {
        MemorySegment host = pool.segment();
        boolean toHost = batch.direction() == CopyBatch.Direction.TO_HOST;
        int n = batch.size();
        int i = 0;
        while (i < n) {
            long dev = batch.deviceAddress(i);
            long off = batch.hostOffset(i);
            long len = batch.length(i);
            int j = i + 1;
            while (j < n && batch.continuesPrevious(j)) {
                len += batch.length(j);
                j++;
            }
            if (toHost) {
                MemorySegment.copy(EVERYTHING, dev, host, off, len);
            } else {
                MemorySegment.copy(host, off, EVERYTHING, dev, len);
            }
            i = j;
        }
    }

    @Override
    public String name() {
        return "host";
    }

    @Override
    public void close() {
        copyThreads.shutdown();
        try {
            if (!copyThreads.awaitTermination(60, TimeUnit.SECONDS)) {
                throw new IllegalStateException("host copy threads did not finish within 60 s");
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
