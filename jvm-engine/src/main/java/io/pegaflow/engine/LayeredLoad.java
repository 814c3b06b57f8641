package io.pegaflow.engine;

import io.pegaflow.engine.transfer.TransferFuture;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The copies of one {@link PegaEngine#loadLayered} load: each part's (a plan can come in two) transfer
 * and which of its groups holds each region's pieces. Complete once {@code loadLayered}
 * returned (every part was submitted).
 */
public final class LayeredLoad {
    CompletableFuture<CopyResult> result; // set once by PegaEngine.loadLayered
    private final List<TransferFuture> parts = new java.util.concurrent.CopyOnWriteArrayList<>();
    private final List<int[]> groupOfRegion = new java.util.concurrent.CopyOnWriteArrayList<>();
    private volatile long plannedNanos;
    private final AtomicLong buildNanos = new AtomicLong();
    private final AtomicLong submitNanos = new AtomicLong();
    /** The copies wait for this ({@link PegaEngine#loadLayered(String, int, Token, long[], CompletableFuture)}); null: none. */
    CompletableFuture<?> gate;
    /** Its pool side staged at the lookup and claimed for it (null: copied from the pool). */
    io.pegaflow.engine.transfer.StagedLoad staged;

    /** Whether its pool side was staged at its lookup and its copies read the staging buffer ({@link io.pegaflow.engine.transfer.Stager}). */
    public boolean fromStage() {
        return staged != null;
    }

    /** {@link System#nanoTime} when the store's plan returned (0: it never did); the rest of the start is the enqueue. */
    public long plannedNanos() {
        return plannedNanos;
    }

    void planned() {
        plannedNanos = System.nanoTime();
    }

    /**
     * Of the start after the store's plan: nanoseconds spent listing the copy batches' pieces
     * (every part and lane together); most of the rest until {@code loadLayered} returned is
     * {@link #submitNanos}.
     */
    public long buildNanos() {
        return buildNanos.get();
    }

    /**
     * Nanoseconds spent handing the built batches to the copy engine ({@code TransferEngine.submit}:
     * for the CUDA engine, waiting for a free lane, pinning pool chunks on first touch, the batch
     * queued to the lane's thread).
     */
    public long submitNanos() {
        return submitNanos.get();
    }

    /**
     * {@link System#nanoTime} when the copy engine queued (host copies: began) the first copy of
     * any part ({@link TransferFuture#firstCopyNanos}); 0 until then or where the engine does not
     * say.
     */
    public long firstCopyNanos() {
        long first = 0;
        for (TransferFuture p : parts) {
            long t = p.firstCopyNanos();
            if (t != 0 && (first == 0 || t < first)) {
                first = t;
            }
        }
        return first;
    }

    /**
     * Whether every part is queued on the device ({@link TransferFuture#queuedOnDevice}): a
     * forward whose stream waits for each layer ({@link #awaitLayer}) reads nothing before it
     * lands, and what is left of the load can fail only as the device fails. False before any
     * part was submitted, and for host copies.
     */
    public boolean queuedOnDevice() {
        if (parts.isEmpty()) {
            return false;
        }
        for (TransferFuture p : parts) {
            if (!p.queuedOnDevice()) {
                return false;
            }
        }
        return true;
    }

    void built(long nanos) {
        buildNanos.addAndGet(nanos);
    }

    void submitted(long nanos) {
        submitNanos.addAndGet(nanos);
    }

    /** Completes when every byte landed and the load ended; fails naming the destination blocks. */
    public CompletableFuture<CopyResult> result() {
        return result;
    }

    /**
     * Orders CUDA stream {@code stream} (0: blocks this thread; the legacy default stream is
     * {@code CU_STREAM_LEGACY}, 1) after region {@code region}'s
     * pieces of every part. A failed copy is not thrown here: {@link #result} reports it
     * (the caller then marks the blocks invalid), and waiting on it ends at once.
     */
    public void awaitLayer(int region, long stream) {
        for (int p = 0; p < parts.size(); p++) {
            int[] groups = groupOfRegion.get(p);
            int g = region >= 0 && region < groups.length ? groups[region] : -1;
            if (g < 0) {
                continue;
            }
            try {
                parts.get(p).awaitGroup(g, stream);
            } catch (RuntimeException failed) {
                // the result fails with it
            }
        }
    }

    void add(TransferFuture part, int[] groups) {
        groupOfRegion.add(groups);
        parts.add(part);
    }
}
