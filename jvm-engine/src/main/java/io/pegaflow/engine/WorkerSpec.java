package io.pegaflow.engine;

import java.util.HashSet;
import java.util.List;
import java.util.Set;

/**
 * One worker (GPU process) of an instance: its rank in [0, worldSize), its tensor-parallel
 * rank, its device, and the regions of the layers it holds (all layers, or one pipeline
 * stage's share), at most {@link Limits#MAX_LAYERS_PER_WORKER}: checked before the list is copied.
 */
public record WorkerSpec(int workerRank, int tpRank, int deviceId, List<LayerRegion> layers) {
    public WorkerSpec {
        if (layers != null) {
            Limits.checkCount("layers of worker " + workerRank, layers.size(), Limits.MAX_LAYERS_PER_WORKER,
                    "MAX_LAYERS_PER_WORKER");
        }
        layers = layers == null ? null : List.copyOf(layers);
    }

    /**
     * Worker 0 of a warm-up's scratch instance: {@code layers} regions in {@code arena}, each
     * split in K and V as vLLM's per-layer tensors are ([2, blocks, ...]: K of every block, then
     * V), {@code blocks} blocks of {@code segmentBytes} per half.
     */
    public static WorkerSpec scratch(java.lang.foreign.Arena arena, int layers, int blocks, long segmentBytes) {
        List<LayerRegion> regions = new java.util.ArrayList<>();
        for (int l = 0; l < layers; l++) {
            long bytes = 2L * blocks * segmentBytes;
            regions.add(new LayerRegion("model.layers." + l + ".self_attn.attn", KvLayout.SPLIT_KV,
                    arena.allocate(bytes, 64).address(), bytes, blocks, segmentBytes, segmentBytes, (long) blocks * segmentBytes));
        }
        return new WorkerSpec(0, 0, 0, regions);
    }

    /**
     * Checks a worker spec on its own (non-null, named non-overlapping valid regions), before
     * the store takes its lock; the store's registry then checks it against the instance.
     */
    public static void check(String instanceId, WorkerSpec worker) {
        if (worker == null) {
            throw new InvalidArgumentException("worker spec for instance '" + instanceId + "' is null");
        }
        if (worker.layers() == null || worker.layers().isEmpty()) {
            throw new InvalidArgumentException("worker " + worker.workerRank() + " of instance '" + instanceId
                    + "' registers no layers; expected at least one LayerRegion");
        }
        Set<String> names = new HashSet<>();
        List<LayerRegion> regions = worker.layers();
        for (LayerRegion r : regions) {
            if (r == null) {
                throw new InvalidArgumentException("worker " + worker.workerRank() + " of instance '" + instanceId
                        + "' has a null layer region");
            }
            r.validate();
            if (!names.add(r.layerName())) {
                throw new InvalidArgumentException("layer '" + r.layerName() + "' appears twice in worker "
                        + worker.workerRank() + " of instance '" + instanceId + "'");
            }
        }
        int[] overlap = LayerOverlaps.find(regions); // O(n log n): a worker may bring thousands of layers
        if (overlap != null) {
            throw new InvalidArgumentException("layers '" + regions.get(overlap[0]).layerName() + "' and '"
                    + regions.get(overlap[1]).layerName() + "' of worker " + worker.workerRank()
                    + " overlap in memory; expected disjoint regions");
        }
    }
}
