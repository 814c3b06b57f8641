package io.pegaflow.engine;

/** The instance id (or a worker of it) was never registered, or was unregistered. */
public final class UnknownInstanceException extends PegaflowException {
    public UnknownInstanceException(String message) {
        super(ErrorCode.UNKNOWN_INSTANCE, message);
    }
}
