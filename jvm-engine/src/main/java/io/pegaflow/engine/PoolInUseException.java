package io.pegaflow.engine;

/**
 * A shared pool's lock is held by a live process (another pegaflow-server): the caller
 * changed nothing on disk. The message names the holder's pid and address as its lock file
 * records them.
 */
public final class PoolInUseException extends PegaflowException {
    private final String holderPid;
    private final String holderAddr;

    public PoolInUseException(String message, String holderPid, String holderAddr) {
        super(ErrorCode.INVALID_ARGUMENT, message);
        this.holderPid = holderPid;
        this.holderAddr = holderAddr;
    }

    /** The holder's pid as its lock file says, or "?" when it could not be read. */
    public String holderPid() {
        return holderPid;
    }

    /** The holder's address as its lock file says, or "?" when it could not be read. */
    public String holderAddr() {
        return holderAddr;
    }
}
