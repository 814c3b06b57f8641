package io.pegaflow.engine.store;

import io.pegaflow.engine.CopyPlan;
import io.pegaflow.engine.Token;
import java.util.Arrays;
import java.util.List;

/**
 * A save or load between its plan and {@link LocalStore#endCopy}: what it claimed or pinned,
 * and the plan telling the copier where each slot is. Not thread-safe: guarded by LocalStore's
 * lock.
 */
sealed interface OpenCopy permits OpenCopy.Reservation, OpenCopy.OpenLoad {
    Instance instance();

    /**
     * When the store gives up on it and rolls it back (its copier is presumed dead). Its
     * instance unregistered, it is rolled back when its plan's hold ends instead (issue plus
     * {@link CopyPlan#holdNanos}, never later than this).
     */
    long deadlineNanos();

    /** An open save: the instance, the worker and the blocks it claimed. */
    record Reservation(Instance instance, Instance.Worker worker, List<PlannedBlock> blocks, long deadlineNanos)
            implements OpenCopy {
        /** Where each claimed slot goes, as runs of slots back to back in the pool (one per block, usually). */
        CopyPlan plan(Token id, int skipped, long holdNanos) {
            CopyPlan.Runs runs = new CopyPlan.Runs(blocks.size());
            for (PlannedBlock p : blocks) {
                runs.addBlock(p.requestIndex, p.regions, p.block.slotOffset, worker.slots, worker.slotBytes);
            }
            return runs.plan(id, CopyPlan.Direction.SAVE, blocks.size(), skipped, holdNanos);
        }
    }

    /** An open load: the worker it copies for, the blocks it pinned, and whether a query began it (queryAndBegin). */
    record OpenLoad(Instance instance, Instance.Worker worker, Block[] blocks, long deadlineNanos, boolean byQuery)
            implements OpenCopy {
        /**
         * Where each of the worker's slots is for leased blocks {@code from .. to - 1}, as runs
         * (lease index = index into the destination ids); the plan's block count is the whole
         * load's, so a copier planning in parts knows how many remain.
         */
        CopyPlan plan(Token id, int from, int to, long holdNanos) {
            int[] all = new int[worker.regions.length];
            Arrays.setAll(all, r -> r);
            CopyPlan.Runs runs = new CopyPlan.Runs(to - from);
            for (int i = from; i < to; i++) {
                runs.addBlock(i, all, blocks[i].slotOffset, worker.slots, worker.slotBytes);
            }
            return runs.plan(id, CopyPlan.Direction.LOAD, blocks.length, 0, holdNanos);
        }
    }

    /** One block of a save: which of the worker's regions it writes and the allocation backing them. */
    final class PlannedBlock {
        final int requestIndex;
        final HashKey key;
        Block block;
        final int[] regions;
        final long bytes;
        long allocation;

        PlannedBlock(int requestIndex, HashKey key, Block block, int[] regions, long bytes) {
            this.requestIndex = requestIndex;
            this.key = key;
            this.block = block;
            this.regions = regions;
            this.bytes = bytes;
        }
    }
}
