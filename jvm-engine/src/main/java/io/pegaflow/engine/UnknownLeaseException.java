package io.pegaflow.engine;

/** The lease is unknown: never issued, released, fully consumed, expired, or bound to another instance. */
public final class UnknownLeaseException extends PegaflowException {
    public UnknownLeaseException(String message) {
        super(ErrorCode.UNKNOWN_LEASE, message);
    }
}
