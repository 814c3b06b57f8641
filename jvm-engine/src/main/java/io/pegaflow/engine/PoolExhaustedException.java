package io.pegaflow.engine;

/** The host pool cannot hold a save even after evicting every unreferenced block. */
public class PoolExhaustedException extends PegaflowException {
    public PoolExhaustedException(String message) {
        super(ErrorCode.POOL_EXHAUSTED, message);
    }
}
