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

    @Override
    public <U> CompletableFuture<U> newIncompleteFuture() {
        return new CompletableFuture<>();
    }
}
