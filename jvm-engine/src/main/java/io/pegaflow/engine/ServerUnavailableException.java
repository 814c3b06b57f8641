package io.pegaflow.engine;

/** pegaflow-server did not answer: down, restarting, or slower than the call's deadline. Callers treat it as a miss. */
public final class ServerUnavailableException extends PegaflowException {
    public ServerUnavailableException(String message, Throwable cause) {
        super(ErrorCode.UNAVAILABLE, message, cause);
    }
}
