package io.pegaflow.engine;

/**
 * A model instance (one vLLM engine): its id, the namespace its blocks are keyed under, its
 * tensor-parallel size and the number of workers that will register ({@code worldSize} =
 * TP x PP). The namespace must digest everything vLLM's block hash does not cover (model,
 * dtype, block size, KV layout, TP scheme): instances sharing a namespace share blocks.
 */
public record InstanceSpec(String instanceId, String namespace, int tpSize, int worldSize) {
    public void validate() {
        if (instanceId == null || instanceId.isBlank()) {
            throw new InvalidArgumentException("instance id '" + instanceId + "' is blank; expected a non-empty id");
        }
        if (namespace == null || namespace.isEmpty()) {
            throw new InvalidArgumentException("namespace of instance '" + instanceId + "' is empty; expected a non-empty digest");
        }
        if (tpSize < 1) {
            throw new InvalidArgumentException("tpSize " + tpSize + " of instance '" + instanceId + "'; expected >= 1");
        }
        if (worldSize < tpSize || worldSize % tpSize != 0) {
            throw new InvalidArgumentException("worldSize " + worldSize + " of instance '" + instanceId
                    + "'; expected a positive multiple of tpSize " + tpSize);
        }
    }
}
