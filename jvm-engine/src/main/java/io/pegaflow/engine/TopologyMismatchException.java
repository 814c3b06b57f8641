package io.pegaflow.engine;

/** Registrations disagree: geometry across ranks, or a namespace shared by incompatible layouts. */
public final class TopologyMismatchException extends PegaflowException {
    public TopologyMismatchException(String message) {
        super(ErrorCode.TOPOLOGY_MISMATCH, message);
    }
}
