package io.pegaflow.engine.transfer;

import java.util.concurrent.CompletableFuture;

/**
 * Completion of one {@link CopyBatch}: completes when every byte landed, exceptionally if a
 * piece failed. A GPU copy engine can also order a caller's CUDA stream after one group of
 * the batch (a layer, for {@code wait_for_layer_load}) without blocking the host.
 */
public class TransferFuture extends CompletableFuture<Void> {
    private volatile long firstCopyNanos;
    private volatile boolean queuedOnDevice;

    /**
     * Whether every copy of the batch is queued on the device, each group behind an event a
     * stream can wait on ({@link #awaitGroup}), and nothing has failed so far: a GPU engine's
     * mark ({@link #markQueuedOnDevice}); false until then and for host copies. Such a batch can
     * still fail only as the device fails: an asynchronous CUDA error, which is sticky, so the
     * work a caller's stream queued after it fails too.
     */
    public boolean queuedOnDevice() {
        return queuedOnDevice && !isCompletedExceptionally();
    }

    /** The copy engine's mark for {@link #queuedOnDevice}, once its last copy and event are queued. */
    public void markQueuedOnDevice() {
        queuedOnDevice = true;
    }

    /**
     * {@link System#nanoTime} when the engine queued the batch's first copy on the device (a GPU
     * engine) or began it (host copies): after the batch's hold opened, for a held batch without a
     * lead; 0 until then, and for an engine that does not say.
     */
    public long firstCopyNanos() {
        return firstCopyNanos;
    }

    /** The copy engine's mark for {@link #firstCopyNanos}; later calls keep the first. */
    public void markFirstCopy() {
        if (firstCopyNanos == 0) {
            firstCopyNanos = System.nanoTime();
        }
    }

    /**
     * Makes {@code stream} (a {@code CUstream}; 0 = the calling host thread) wait until group
     * {@code group} of the batch has landed. This default blocks the host until the whole
     * batch is done, which is exact for host copies.
     */
    public void awaitGroup(int group, long stream) {
        join();
    }

    /**
     * A batch's completion that follows {@code source} (normally or exceptionally) once
     * {@code first} has run: for copy engines that wrap another one and do something of their
     * own when its copy ends, before anyone waiting on the batch wakes.
     */
    public static TransferFuture following(CompletableFuture<?> source, Runnable first) {
        TransferFuture out = new TransferFuture();
        source.whenComplete((r, e) -> {
            try {
                first.run();
            } finally {
                if (e != null) {
                    out.completeExceptionally(e);
                } else {
                    out.complete(null);
                }
            }
        });
        return out;
    }

    @Override
    public <U> CompletableFuture<U> newIncompleteFuture() {
        return new CompletableFuture<>();
    }
}
