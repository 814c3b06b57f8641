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
 * one copy. Batches run on a small pool of copy threads (a batch above 8 MiB per thread is
 * split across them); the pool side goes through the
 * pool's arena-scoped segment, so a copy after the pool closed fails instead of crashing.
 */
public final class HostTransferEngine implements TransferEngine {
    /** All of the address space: the device side is a raw address supplied by registration. */
    private static final MemorySegment EVERYTHING = MemorySegment.NULL.reinterpret(Long.MAX_VALUE);

    /** Batches above this many bytes per thread are split across the copy threads. */
    private static final long SPLIT_BYTES = 8L << 20;

    private final HostPool pool;
    private final int threads;
    private final ExecutorService copyThreads;
    /** Null: loads are not staged at their lookup ({@link Stager#ENV} unset or 0). */
    private final HostStager stager;

    /** With {@link Stager#ENV}'s staging buffer, if set. */
    public HostTransferEngine(HostPool pool, int threads) {
        this(pool, threads, Stager.bytesFromEnvironment(System.getenv(Stager.ENV)));
    }

    /**
     * {@code stageBytes}: the host buffer loads are staged in at their lookup (0: none). Host
     * copies gain nothing from it (every copy is a memcpy either way); it runs the staged path
     * where vLLM runs on CPUs, so the CPU tiers check what a GPU engine's staging does.
     */
    public HostTransferEngine(HostPool pool, int threads, long stageBytes) {
        if (threads < 1) {
            throw new IllegalArgumentException("copy threads " + threads + "; expected >= 1");
        }
        this.pool = pool;
        this.threads = threads;
        this.stager = Stager.checkBytes(stageBytes) > 0 ? new HostStager(pool, stageBytes) : null;
        AtomicInteger n = new AtomicInteger();
        this.copyThreads = Executors.newFixedThreadPool(threads, r -> {
            Thread t = new Thread(r, "pegaflow-copy-" + n.incrementAndGet());
            t.setDaemon(true);
            return t;
        });
    }

    /**
     * Refuses a region that is not wholly in memory this process may read and write
     * ({@code /proc/self/maps}; accepted unchecked where the process has no such file): a
     * bad pointer handed over by an embedding host is an error here, not a SIGSEGV later.
     */
    @Override
    public void checkRegion(io.pegaflow.engine.LayerRegion region) {
        checkRegions(java.util.List.of(region));
    }

    /** {@link #checkRegion} for each region, the mappings read once for all of them. */
    @Override
    public void checkRegions(java.util.List<io.pegaflow.engine.LayerRegion> regions) {
        java.util.List<ProcessMappings.Mapping> maps = ProcessMappings.read();
        if (maps == null) {
            return;
        }
        for (io.pegaflow.engine.LayerRegion region : regions) {
            String wrong = ProcessMappings.uncovered(maps, region.baseAddress(), region.regionBytes());
            if (wrong != null) {
                throw new io.pegaflow.engine.InvalidArgumentException(String.format(
                        "region '%s' at 0x%x (%d bytes): %s; host copies need memory this process can read and write",
                        region.layerName(), region.baseAddress(), region.regionBytes(), wrong));
            }
        }
    }

    @Override
    public Stager stager() {
        return stager;
    }

    @Override
    public TransferFuture submit(CopyBatch batch) {
        TransferFuture done = new TransferFuture();
        if (batch.stage() != null) {
            if (batch.stage().stager() != stager || batch.direction() != CopyBatch.Direction.TO_DEVICE) {
                done.completeExceptionally(new IllegalArgumentException("a staged batch for another engine, or not a load"));
                return done;
            }
            batch.opened().thenRunAsync(() -> fromStage(batch, done), copyThreads).whenComplete((ok, err) -> {
                if (err != null) {
                    done.completeExceptionally(err);
                } else {
                    done.complete(null);
                }
            });
            return done;
        }
        int parts = (int) Math.max(1, Math.min(threads, batch.totalBytes() / SPLIT_BYTES));
        // Large batches are cut into equal runs of descriptors, one per copy thread.
        CompletableFuture<?>[] runs = new CompletableFuture<?>[parts];
        int n = batch.size();
        for (int p = 0; p < parts; p++) {
            int from = (int) ((long) n * p / parts);
            int to = (int) ((long) n * (p + 1) / parts);
            runs[p] = batch.opened().thenRunAsync(() -> {
                done.markFirstCopy();
                copy(batch, from, to);
            }, copyThreads);
        }
        CompletableFuture.allOf(runs).whenComplete((ok, err) -> {
            if (err != null) {
                done.completeExceptionally(err);
            } else {
                done.complete(null);
            }
        });
        return done;
    }

    /** A staged load's pieces, group by group once each is staged, from the staging buffer. */
    private void fromStage(CopyBatch batch, TransferFuture done) {
        StagedLoad staged = batch.stage();
        MemorySegment buffer = null;
        StageLayout.Cursor at = null;
        for (int g = 0; g < batch.groupCount(); g++) {
            staged.awaitQueued(g);
            if (at == null) {
                buffer = stager.buffer; // taken on the staging thread before its first group was queued
                at = staged.layout().cursor();
                done.markFirstCopy();
            }
            at.group(g);
            for (int i = batch.groupStart(g); i < batch.groupEnd(g); i++) {
                long len = batch.length(i);
                MemorySegment.copy(buffer, at.offset(batch.hostOffset(i), len), EVERYTHING, batch.deviceAddress(i), len);
            }
        }
    }

    /** Stages into a host buffer with plain copies: each group has landed once queued. */
    private static final class HostStager extends Stager {
        private final HostPool pool;
        private java.lang.foreign.Arena arena;
        /** Written once by {@link #allocate} on the staging thread; read by copy threads after {@link StagedLoad#awaitQueued}. */
        volatile MemorySegment buffer;

        HostStager(HostPool pool, long bytes) {
            super(bytes, "host");
            this.pool = pool;
        }

        @Override
        protected void allocate() {
            java.lang.foreign.Arena a = java.lang.foreign.Arena.ofShared();
            try {
                buffer = a.allocate(capacity(), 4096);
            } catch (RuntimeException | OutOfMemoryError e) {
                a.close();
                throw e;
            }
            arena = a;
        }

        @Override
        protected void free() {
            arena.close();
        }

        @Override
        public long address() {
            return buffer.address();
        }

        @Override
        protected void queueGroup(StageLayout layout, int g) {
            MemorySegment host = pool.segment();
            for (int k = layout.groupStart(g); k < layout.groupEnd(g); k++) {
                MemorySegment.copy(host, layout.stretchHost(k), buffer, layout.stretchAt(k), layout.stretchLen(k));
            }
        }

        @Override
        protected boolean landed(int g) {
            return true;
        }

    }

    /** Performs the copies on the calling thread (used by benchmarks and by {@link #submit}). */
    public void copy(CopyBatch batch) {
        copy(batch, 0, batch.size());
    }

    private void copy(CopyBatch batch, int from, int to) {
        MemorySegment host = pool.segment();
        boolean toHost = batch.direction() == CopyBatch.Direction.TO_HOST;
        int n = to;
        int i = from;
        while (i < n) {
            long dev = batch.deviceAddress(i);
            long off = batch.hostOffset(i);
            int j = batch.runEnd(i, n);
            long len = batch.runBytes(i, j);
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
        boolean done = false;
        try {
            done = copyThreads.awaitTermination(60, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        if (!done) {
            throw new IllegalStateException("host copy threads did not finish within 60 s"); // the staging buffer stays: one may read it
        }
        if (stager != null) {
            stager.close(); // after the copy threads: none reads the buffer any more
        }
    }
}
