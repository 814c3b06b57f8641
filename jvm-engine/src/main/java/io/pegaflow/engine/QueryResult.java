package io.pegaflow.engine;

/**
 * Answer to a prefix query: how many leading blocks are resident, and the lease pinning them
 * ({@code null} when {@code hitBlocks == 0}: nothing to load, nothing to release).
 * {@code pendingBlocks > 0} means "not yet": that many blocks after the resident prefix are
 * being read back from a lower tier (SSD); no lease is issued, and the caller asks again.
 * {@code begun}: the plan of the load a {@link BlockStore#queryAndBegin} began with the lease
 * (null: none began; the worker's load asks for its plan).
 */
public record QueryResult(int hitBlocks, Token lease, int pendingBlocks, CopyPlan begun) {
    public QueryResult(int hitBlocks, Token lease) {
        this(hitBlocks, lease, 0, null);
    }

    public QueryResult(int hitBlocks, Token lease, int pendingBlocks) {
        this(hitBlocks, lease, pendingBlocks, null);
    }

    public boolean hasLease() {
        return lease != null;
    }

    /** The prefix continues in a lower tier and is being read back: ask again. */
    public boolean pending() {
        return pendingBlocks > 0;
    }
}
