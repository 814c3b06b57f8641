package io.pegaflow.engine;

/**
 * A model instance (one vLLM engine): its id, the namespace its blocks are keyed under, its
 * tensor-parallel size and the number of workers that will register ({@code worldSize} =
 * TP x PP). The namespace must digest everything vLLM's block hash does not cover (model,
 * dtype, block size, KV layout, TP scheme): instances sharing a namespace share blocks.
 */
public record InstanceSpec(String instanceId, String namespace, int tpSize, int worldSize) {
    /**
     * Checks the spec on its own, lengths and sizes first against {@link Limits} (nothing is
     * allocated for a spec before this passes).
     */
    public void validate() {
        Limits.checkName("instance id", instanceId);
        Limits.checkPrintable("instance id", instanceId);
        if (instanceId == null || instanceId.isBlank()) {
            throw new InvalidArgumentException("instance id '" + instanceId + "' is blank; expected a non-empty id");
        }
        Limits.checkName("namespace of instance '" + instanceId + "'", namespace);
        Limits.checkPrintable("namespace of instance '" + instanceId + "'", namespace);
        if (namespace == null || namespace.isEmpty()) {
            throw new InvalidArgumentException("namespace of instance '" + instanceId + "' is empty; expected a non-empty digest");
        }
        if (tpSize < 1 || tpSize > Limits.MAX_TP_SIZE) {
            throw new InvalidArgumentException("tpSize " + tpSize + " of instance '" + instanceId + "'; expected 1.."
                    + Limits.MAX_TP_SIZE + " (Limits.MAX_TP_SIZE)");
        }
        if (worldSize > Limits.MAX_WORLD_SIZE) {
            throw new InvalidArgumentException("worldSize " + worldSize + " of instance '" + instanceId
                    + "'; expected at most " + Limits.MAX_WORLD_SIZE + " (Limits.MAX_WORLD_SIZE)");
        }
        if (worldSize < tpSize || worldSize % tpSize != 0) {
            throw new InvalidArgumentException("worldSize " + worldSize + " of instance '" + instanceId
                    + "'; expected a positive multiple of tpSize " + tpSize);
        }
    }
}
