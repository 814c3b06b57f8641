package io.pegaflow.engine;

import java.util.List;

/**
 * A save or load between its plan and {@link LocalStore#endCopy}: what it claimed or pinned,
 * and the plan telling the copier where each slot is. Not thread-safe: guarded by LocalStore's
 * lock.
 */
sealed interface OpenCopy permits OpenCopy.Reservation, OpenCopy.OpenLoad {
    Instance instance();

    /** When the store gives up on it and rolls it back (its copier is presumed dead). */
    long deadlineNanos();

    /** An open save: the instance, the worker and the blocks it claimed. */
    record Reservation(Instance instance, Instance.Worker worker, List<PlannedBlock> blocks, long deadlineNanos)
            implements OpenCopy {
        /** Where each claimed slot goes, as runs of slots back to back in the pool (one per block, usually). */
        CopyPlan plan(Token id, int skipped) {
            NamespaceLayout layout = instance.ns.layout;
            int tpRank = worker.spec.tpRank();
            CopyPlan.Runs runs = new CopyPlan.Runs(blocks.size());
            long[] offsets = new long[worker.regions.length];
            long[] bytes = new long[worker.regions.length];
            int[] slots = new int[worker.regions.length];
            for (int r = 0; r < worker.regions.length; r++) {
                slots[r] = layout.slot(worker.layerIds[r], tpRank);
                bytes[r] = worker.regions[r].slotBytes();
            }
            long[] off = new long[worker.regions.length];
            long[] len = new long[worker.regions.length];
            for (PlannedBlock p : blocks) {
                int[] regions = p.regions;
                long[] slotOffset = p.block.slotOffset;
                long[] o = regions.length == off.length ? off : new long[regions.length];
                long[] l = regions.length == len.length ? len : new long[regions.length];
                for (int k = 0; k < regions.length; k++) {
                    o[k] = slotOffset[slots[regions[k]]];
                    l[k] = bytes[regions[k]];
                }
                runs.addBlock(p.requestIndex, regions, o, l);
            }
            return runs.plan(id, CopyPlan.Direction.SAVE, blocks.size(), skipped);
        }
    }

    /** An open load: the blocks it pinned. */
    record OpenLoad(Instance instance, Block[] blocks, long deadlineNanos) implements OpenCopy {
        /** Where each of {@code worker}'s slots is, as runs (lease index = index into the destination ids). */
        CopyPlan plan(Token id, Instance.Worker worker) {
            NamespaceLayout layout = instance.ns.layout;
            int tpRank = worker.spec.tpRank();
            int n = worker.regions.length;
            int[] regions = new int[n];
            int[] slots = new int[n];
            long[] bytes = new long[n];
            for (int r = 0; r < n; r++) {
                regions[r] = r;
                slots[r] = layout.slot(worker.layerIds[r], tpRank);
                bytes[r] = worker.regions[r].slotBytes();
            }
            long[] off = new long[n];
            CopyPlan.Runs runs = new CopyPlan.Runs(blocks.length);
            for (int i = 0; i < blocks.length; i++) {
                long[] slotOffset = blocks[i].slotOffset;
                for (int r = 0; r < n; r++) {
                    off[r] = slotOffset[slots[r]];
                }
                runs.addBlock(i, regions, off, bytes);
            }
            return runs.plan(id, CopyPlan.Direction.LOAD, blocks.length, 0);
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
