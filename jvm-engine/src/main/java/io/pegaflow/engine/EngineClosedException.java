package io.pegaflow.engine;

/** The engine (or its pool) was closed. */
public final class EngineClosedException extends PegaflowException {
    public EngineClosedException(String message) {
        super(ErrorCode.CLOSED, message);
    }
}
