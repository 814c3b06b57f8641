package io.pegaflow.engine;

import java.util.List;

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
}
