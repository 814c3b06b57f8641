package io.pegaflow.server.cluster;

import io.pegaflow.engine.BlockHashes;
import java.util.List;

/**
 * Which host holds which block (docs/cluster.md): the shared state of cross-node sharing.
 * {@link #advertise} and {@link #withdraw} only queue (they run under the store's lock) and
 * are batched, netted and sent in the background; {@link #lookup} asks the registry.
 * Implemented on Redis ({@link RedisBlockRegistry}); another store fits behind these methods.
 */
public interface BlockRegistry extends AutoCloseable {
    /** A live host other than this one: its registry index, id and peer address. */
    record Node(int index, String id, String peerAddr, long heartbeatMillis) {}

    /** The longest run of the asked hashes held by one live host: {@code blocks == 0}, none. */
    record Owner(Node node, int blocks) {
        static final Owner NONE = new Owner(null, 0);
    }

    /** Queues "this host holds it"; never blocks (a full queue drops and counts). */
    void advertise(String namespace, byte[] hash);

    /** Queues "this host no longer holds it"; never blocks. */
    void withdraw(String namespace, byte[] hash);

    /** Queues the removal of another host's claim found wrong (it answered that it lacks the block). */
    void forget(String namespace, byte[] hash, Node node);

    /**
     * The longest run of {@code hashes} (from the first) that one live host other than this one
     * advertises, skipping {@code excluded} hosts. Throws when the registry cannot be asked.
     */
    Owner lookup(String namespace, BlockHashes hashes, List<String> excluded) throws Exception;

    /** Live hosts other than this one, as last seen. */
    List<Node> liveNodes();

    /** Whether the registry answered the last heartbeat. */
    boolean connected();

    /** Blocks advertised, withdrawals and dropped updates, for metrics. */
    RegistryStats stats();

    /** Sends what is queued now and waits until it was applied (tests and benchmarks). */
    void flush() throws Exception;

    @Override
    void close();

    record RegistryStats(long advertised, long withdrawn, long dropped, long errors, long lookups, long resyncs) {}
}
