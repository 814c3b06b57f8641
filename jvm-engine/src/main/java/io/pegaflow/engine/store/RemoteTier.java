package io.pegaflow.engine.store;

import io.pegaflow.engine.BlockHashes;

/**
 * Other hosts' pools, seen from one {@link LocalStore} (docs/cluster.md). The store calls every
 * method under its lock: each must only record or queue work and return, never wait on the
 * network. Fetched blocks come back through {@link LocalStore#reserveFetch} and
 * {@link LocalStore#completeFetch}.
 */
public interface RemoteTier {
    /**
     * A query in {@code namespace} found nothing locally from {@code hashes[from]} on. True
     * while a lookup or fetch for that position is under way (the query answers "not yet");
     * false when other hosts are known not to hold it (the query answers with what it has).
     * {@code hashes} belongs to the caller: copy what is kept.
     */
    boolean missed(String namespace, BlockHashes hashes, int from);

    /** A block of {@code namespace} became resident (saved, read back or fetched): advertise it. */
    void resident(String namespace, byte[] hash);

    /** A resident block left the pool (evicted): withdraw it. */
    void evicted(String namespace, byte[] hash);

    /**
     * Returns once every advertisement queued before the call has reached the other hosts
     * (the flush barrier; called outside the store's lock). Throws on a timeout or when the
     * registry cannot be reached.
     */
    default void flush() throws Exception {}
}
