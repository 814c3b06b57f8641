package io.pegaflow.engine.transfer;

import java.util.concurrent.CompletableFuture;

/**
 * Moves the bytes of a {@link CopyBatch} between registered regions and the host pool.
 * The engine decides what to copy; implementations decide how (host memcpy here, a CUDA
 * copy engine and gather kernel later). Contract for every implementation:
 * <ul>
 *   <li>{@link #submit} never blocks on the copy itself; the future completes when every byte
 *       of the batch has landed, or exceptionally if any piece failed (the batch is then
 *       treated as failed as a whole).</li>
 *   <li>Any thread may call {@link #submit}; batches submitted concurrently may run
 *       concurrently. Pieces of one batch never overlap each other.</li>
 *   <li>{@link #close()} waits for submitted batches to finish.</li>
 * </ul>
 */
public interface TransferEngine extends AutoCloseable {
    /** Starts the copies of {@code batch}; the caller must not modify the batch afterwards. */
    CompletableFuture<Void> submit(CopyBatch batch);

    /** A short name for logs and reports, e.g. {@code host} or {@code cuda-kernel}. */
    String name();

    @Override
    void close();
}
