package io.pegaflow.engine;

/** An argument is malformed or out of range (block id, size, layout, hash). */
public final class InvalidArgumentException extends PegaflowException {
    public InvalidArgumentException(String message) {
        super(ErrorCode.INVALID_ARGUMENT, message);
    }
}
