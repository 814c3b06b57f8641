package io.pegaflow.engine;

/**
 * Base of every failure the engine reports to callers. The message names the offending value
 * and what was expected; {@link #code()} is what crosses process and language boundaries.
 * A call that throws one of these left the index, the leases and the pool as they were.
 */
public class PegaflowException extends RuntimeException {
    private final ErrorCode code;

    public PegaflowException(ErrorCode code, String message) {
        super(message);
        this.code = code;
    }

    public PegaflowException(ErrorCode code, String message, Throwable cause) {
        super(message, cause);
        this.code = code;
    }

    public ErrorCode code() {
        return code;
    }
}
