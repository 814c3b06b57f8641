package io.pegaflow.engine;

import io.pegaflow.engine.transfer.CopyBatch;
import java.util.Arrays;

/**
 * What one save or load copies, as the control plane hands it to the process that moves the
 * bytes, as runs: run {@code j} covers regions {@code runRegion[j] .. runRegion[j] +
 * runCount[j] - 1} (indexes into the worker's registered layers) of the caller's block at
 * index {@code runBlock[j]} (into the block ids of the request), whose slots lie back to back
 * in the pool from offset {@code runOffset[j]} (each slot {@link LayerRegion#slotBytes} long,
 * its segments back to back). A save copies block to pool, a load pool to block.
 *
 * <p>Runs, not one entry per slot: a block's slots are allocated together, so a plan of
 * 2,048 blocks of 32 layers is 2,048 runs instead of 65,536 triples, and its cost (building,
 * the wire, reading) follows the block count. {@code id} names the open operation for
 * {@link BlockStore#endCopy} (128 random bits, bound to the instance it was issued to);
 * {@link Token#NONE} means nothing to copy (every block skipped). Until it ends, the blocks
 * involved stay pinned.
 *
 * <p>{@code holdNanos}: the store keeps the plan's slots as they are (a load's blocks pinned,
 * a save's slots claimed) for at least this long from when it issued the plan, whatever
 * becomes of the instance's session, unless the copier itself ends the plan; 0 when it makes
 * no such promise (an older server). A copier that finished within it (by its own clock, from
 * before it asked) knows the slots held through its copy without asking the store
 * (docs/gpu.md).
 */
public record CopyPlan(Token id, Direction direction, int blocks, int skippedBlocks, int[] runBlock, int[] runRegion,
        int[] runCount, long[] runOffset, long holdNanos) {
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

    public CopyPlan {
        if (holdNanos < 0) {
            throw new PegaflowException(ErrorCode.INTERNAL, "copy plan " + id + " held for " + holdNanos
                    + " ns; expected >= 0");
        }
        int n = runBlock.length;
        if (runRegion.length != n || runCount.length != n || runOffset.length != n) {
            throw new PegaflowException(ErrorCode.INTERNAL, "copy plan " + id + " with " + n + " run blocks, "
                    + runRegion.length + " run regions, " + runCount.length + " run counts and " + runOffset.length
                    + " run offsets; expected equal counts");
        }
    }

    /** Whether there is nothing to copy (and nothing to end). */
    public boolean isEmpty() {
        return id.equals(Token.NONE);
    }

    public int runs() {
        return runBlock.length;
    }

    /** Slots copied: the sum of the run counts. */
    public long slots() {
        long n = 0;
        for (int c : runCount) {
            n += c;
        }
        return n;
    }

    /**
     * Builds a plan block by block: each block's slots, in plan order, merge into one run
     * while each is the next region and lies right after the previous one in the pool.
     */
    public static final class Runs {
        private int[] block;
        private int[] region;
        private int[] count;
        private long[] offset;
        private int n;

        public Runs(int expectedRuns) {
            int cap = Math.max(16, expectedRuns);
            block = new int[cap];
            region = new int[cap];
            count = new int[cap];
            offset = new long[cap];
        }

        /**
         * The slots of {@code requestBlock} in worker regions {@code regions} (plan order):
         * region {@code r}'s slot is slot {@code slotOf[r]} of the block, at pool offset
         * {@code slotOffset[slotOf[r]]}, {@code slotBytes[r]} long.
         */
        public void addBlock(int requestBlock, int[] regions, long[] slotOffset, int[] slotOf, long[] slotBytes) {
            long expect = -1;
            int last = -2;
            for (int r : regions) {
                long off = slotOffset[slotOf[r]];
                if (off == expect && r == last + 1) {
                    count[n - 1]++;
                } else {
                    addRun(requestBlock, r, off);
                }
                expect = off + slotBytes[r];
                last = r;
            }
        }

        private void addRun(int requestBlock, int regionIndex, long poolOffset) {
            if (n == block.length) {
                int cap = n * 2;
                block = Arrays.copyOf(block, cap);
                region = Arrays.copyOf(region, cap);
                count = Arrays.copyOf(count, cap);
                offset = Arrays.copyOf(offset, cap);
            }
            block[n] = requestBlock;
            region[n] = regionIndex;
            count[n] = 1;
            offset[n] = poolOffset;
            n++;
        }

        public CopyPlan plan(Token id, Direction direction, int blocks, int skipped, long holdNanos) {
            return new CopyPlan(id, direction, blocks, skipped, Arrays.copyOf(block, n), Arrays.copyOf(region, n),
                    Arrays.copyOf(count, n), Arrays.copyOf(offset, n), holdNanos);
        }
    }
}
