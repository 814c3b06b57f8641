package io.pegaflow.engine;

import io.pegaflow.engine.transfer.CopyBatch;

/**
 * What one save or load copies, as the control plane hands it to the process that moves the
 * bytes: for each {@code k}, the slot of region {@code regionIndex[k]} (an index into the
 * worker's registered layers) of the caller's block at index {@code blockIndex[k]} (into the
 * block ids of the request) and pool offset {@code hostOffset[k]} (segments back to back).
 * A save copies block to pool, a load pool to block. {@code id} names the open operation for
 * {@link BlockStore#endCopy} (128 random bits, bound to the instance it was issued to);
 * {@link Token#NONE} means nothing to copy (every block skipped). Until it ends,
 * the blocks involved stay pinned.
 */
public record CopyPlan(Token id, Direction direction, int blocks, int skippedBlocks, int[] blockIndex,
        int[] regionIndex, long[] hostOffset) {
    /** Which way the bytes go. */
    public enum Direction {
        /** GPU (or host) KV regions to the pool. */
        SAVE,
        /** The pool to KV regions. */
        LOAD;

        public CopyBatch.Direction batch() {
            return this == SAVE ? CopyBatch.Direction.TO_HOST : CopyBatch.Direction.TO_DEVICE;
        }
    }

    /** A save with nothing to copy. */
    static CopyPlan nothing(int skippedBlocks) {
        return new CopyPlan(Token.NONE, Direction.SAVE, 0, skippedBlocks, new int[0], new int[0], new long[0]);
    }

    /** Whether there is nothing to copy (and nothing to end). */
    public boolean isEmpty() {
        return id.equals(Token.NONE);
    }

    public int slots() {
        return hostOffset.length;
    }
}
