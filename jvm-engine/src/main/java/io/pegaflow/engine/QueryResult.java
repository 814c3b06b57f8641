package io.pegaflow.engine;

/**
 * Answer to a prefix query: how many leading blocks are resident, and the lease pinning them
 * ({@code null} when {@code hitBlocks == 0}: nothing to load, nothing to release).
 */
public record QueryResult(int hitBlocks, Token lease) {
    public boolean hasLease() {
        return lease != null;
    }
}
