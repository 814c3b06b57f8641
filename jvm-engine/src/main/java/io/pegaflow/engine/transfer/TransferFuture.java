package io.pegaflow.engine.transfer;

import java.util.concurrent.CompletableFuture;

/**
 * Completion of one {@link CopyBatch}: completes when every byte landed, exceptionally if a
 * piece failed. A GPU copy engine can also order a caller's CUDA stream after one group of
 * the batch (a layer, for {@code wait_for_layer_load}) without blocking the host.
 */
public class TransferFuture extends CompletableFuture<Void> {

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
