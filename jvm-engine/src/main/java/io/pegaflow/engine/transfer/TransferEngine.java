package io.pegaflow.engine.transfer;

import io.pegaflow.engine.LayerRegion;

/**
 * Moves the bytes of a {@link CopyBatch} between registered regions and the host pool.
 * The engine decides what to copy; implementations decide how (host memcpy here, a CUDA
 * copy engine and gather kernel later). Contract for every implementation:
 * <ul>
 *   <li>{@link #submit} never waits for the copy itself (a GPU engine may wait for a free
 *       stream); the future completes when every byte of the batch has landed, or
 *       exceptionally if any piece failed (the batch is then treated as failed as a
 *       whole).</li>
 *   <li>A batch's {@link CopyBatch#waitStream()} and groups are honoured where the engine
 *       has streams; a host engine has nothing to order against.</li>
 *   <li>Any thread may call {@link #submit}; batches submitted concurrently may run
 *       concurrently. Pieces of one batch never overlap each other.</li>
 *   <li>An engine reads a batch only until the future {@link #submit} returned completes
 *       (either way): then the caller may {@link CopyBatch#release} it, and its piece array
 *       goes to the next batch.</li>
 *   <li>{@link #close()} waits for submitted batches to finish.</li>
 * </ul>
 */
public interface TransferEngine extends AutoCloseable {
    /** Starts the copies of {@code batch}; the caller must not modify the batch afterwards. */
    TransferFuture submit(CopyBatch batch);

    /**
     * Checks that {@code region} (already valid on its own) is memory this engine can copy
     * from and to. Called at registration, before the control plane sees the region; refuses
     * with {@link io.pegaflow.engine.InvalidArgumentException} naming the numbers (address,
     * size, what it found there). The default accepts everything: host copies cannot check a
     * raw pointer, the caller guarantees it. Any thread.
     */
    default void checkRegion(LayerRegion region) {}

    /**
     * {@link #checkRegion} for every region of one registration; an engine whose check reads
     * something per call (the host engine: the process's mappings) reads it once here.
     */
    default void checkRegions(java.util.List<LayerRegion> regions) {
        for (LayerRegion r : regions) {
            checkRegion(r);
        }
    }

    /**
     * How a load whose compute waits layer by layer ({@code PegaEngine.loadLayered}) is cut
     * into batches for this engine ({@link LayerSplit}): an engine whose fast path needs long
     * stretches or several streams asks for them here. Default: one layer per group, one batch.
     */
    default LayerSplit layerSplit() {
        return LayerSplit.PER_LAYER;
    }

    /**
     * The engine's staging of loads at their lookup ({@link Stager}), or null where it has
     * none or it is off (the default).
     */
    default Stager stager() {
        return null;
    }

    /** A short name for logs and reports, e.g. {@code host} or {@code cuda-kernel}. */
    String name();

    @Override
    void close();
}
