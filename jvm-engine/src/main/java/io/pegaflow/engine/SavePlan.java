package io.pegaflow.engine;

/**
 * Where a save's claimed slots go: for each {@code k}, the slot of region
 * {@code regionIndex[k]} (an index into the worker's registered layers) of the block at
 * request index {@code blockIndex[k]} is copied to pool offset {@code hostOffset[k]}
 * (segments back to back). {@code reservationId} 0 means nothing to copy (all skipped).
 */
public record SavePlan(long reservationId, int skippedBlocks, int plannedBlocks, int[] blockIndex, int[] regionIndex,
        long[] hostOffset) {
    public int slots() {
        return hostOffset.length;
    }
}
