package io.pegaflow.engine;

/**
 * Stable error codes of the engine. The C ABI (bridge) returns them as integers and the
 * server maps them to gRPC status codes, so the numeric values never change meaning.
 */
public enum ErrorCode {
    OK(0),
    INVALID_ARGUMENT(1),
    UNKNOWN_INSTANCE(2),
    UNKNOWN_LEASE(3),
    REGISTRATION_INCOMPLETE(4),
    TOPOLOGY_MISMATCH(5),
    POOL_EXHAUSTED(6),
    TRANSFER_FAILED(7),
    CLOSED(8),
    INTERNAL(9),
    /** A CUDA driver or NVRTC call failed, or CUDA was asked for where there is none. */
    CUDA(10),
    /** A wait on a completion ran out of time; the operation is still in flight. */
    TIMEOUT(11),
    /** pegaflow-server did not answer (down, restarting, or past the call's deadline). */
    UNAVAILABLE(12),
    /**
     * The caller may not do this: no or a wrong server credential, or an id (lease, copy,
     * session) that belongs to another instance. Nothing changed.
     */
    PERMISSION_DENIED(13);

    private final int value;

    ErrorCode(int value) {
        this.value = value;
    }

    /** The integer carried across the C ABI. */
    public int value() {
        return value;
    }
}
