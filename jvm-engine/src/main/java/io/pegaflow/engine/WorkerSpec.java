package io.pegaflow.engine;

import java.util.List;

/**
 * One worker (GPU process) of an instance: its rank in [0, worldSize), its tensor-parallel
 * rank, its device, and the regions of the layers it holds (all layers, or one pipeline
 * stage's share).
 */
public record WorkerSpec(int workerRank, int tpRank, int deviceId, List<LayerRegion> layers) {
    public WorkerSpec {
        layers = layers == null ? null : List.copyOf(layers);
    }
}
