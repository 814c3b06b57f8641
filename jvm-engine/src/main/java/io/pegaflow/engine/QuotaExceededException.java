package io.pegaflow.engine;

/**
 * A tenant's share of a server resource is used up (leases, open copies, instances,
 * concurrent calls, waiting flushes): the message names the quota, its value and the flag
 * that sets it. Carried as {@link ErrorCode#POOL_EXHAUSTED} (gRPC RESOURCE_EXHAUSTED), so a
 * client treats it as it treats a full pool: that save or lookup is skipped, nothing changed.
 */
public final class QuotaExceededException extends PoolExhaustedException {
    public QuotaExceededException(String message) {
        super(message);
    }
}
