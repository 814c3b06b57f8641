package io.pegaflow.engine;

import java.util.List;

/**
 * A save or load between its plan and {@link LocalStore#endCopy}: what it claimed or pinned,
 * and the plan telling the copier where each slot is. Not thread-safe: guarded by LocalStore's
 * lock.
 */
sealed interface OpenCopy permits OpenCopy.Reservation, OpenCopy.OpenLoad {
    Instance instance();

    /** An open save: the instance, the worker and the blocks it claimed. */
    record Reservation(Instance instance, Instance.Worker worker, List<PlannedBlock> blocks) implements OpenCopy {
        /** Where each claimed slot goes: triples (request index, region index, pool offset). */
        CopyPlan plan(long id, int skipped) {
            NamespaceLayout layout = instance.ns.layout;
            int n = 0;
            for (PlannedBlock p : blocks) {
                n += p.regions.length;
            }
            int[] blockIndex = new int[n];
            int[] regionIndex = new int[n];
            long[] hostOffset = new long[n];
            int k = 0;
            int tpRank = worker.spec.tpRank();
            for (PlannedBlock p : blocks) {
                for (int r : p.regions) {
                    blockIndex[k] = p.requestIndex;
                    regionIndex[k] = r;
                    hostOffset[k] = p.block.slotOffset[layout.slot(worker.layerIds[r], tpRank)];
                    k++;
                }
            }
            return new CopyPlan(id, CopyPlan.Direction.SAVE, blocks.size(), skipped, blockIndex, regionIndex, hostOffset);
        }
    }

    /** An open load: the blocks it pinned. */
    record OpenLoad(Instance instance, Block[] blocks) implements OpenCopy {
        /** Where each of {@code worker}'s slots is: triples (lease index, region index, pool offset). */
        CopyPlan plan(long id, Instance.Worker worker) {
            NamespaceLayout layout = instance.ns.layout;
            int tpRank = worker.spec.tpRank();
            int regions = worker.regions.length;
            int n = blocks.length * regions;
            int[] blockIndex = new int[n];
            int[] regionIndex = new int[n];
            long[] hostOffset = new long[n];
            int k = 0;
            for (int i = 0; i < blocks.length; i++) {
                for (int r = 0; r < regions; r++) {
                    blockIndex[k] = i;
                    regionIndex[k] = r;
                    hostOffset[k] = blocks[i].slotOffset[layout.slot(worker.layerIds[r], tpRank)];
                    k++;
                }
            }
            return new CopyPlan(id, CopyPlan.Direction.LOAD, blocks.length, 0, blockIndex, regionIndex, hostOffset);
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
