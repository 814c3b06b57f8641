package io.pegaflow.server.cluster;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.store.FetchReservation;
import java.io.IOException;
import java.time.Duration;

/**
 * Reads blocks out of another host's pool, in the shape of a one-sided read
 * (docs/cluster.md, "Transport"): {@link #pin} asks the peer to pin the blocks under a transfer
 * lock with a deadline and returns what a reader needs; {@link #read} moves the bytes into this
 * host's pool and checks each block's CRC32 ({@link io.pegaflow.engine.store.BlockChecksum}); {@link #release} ends the lock. An RDMA
 * transport would return remote addresses and keys from {@code pin} and post READs in
 * {@code read}; only TCP ({@link TcpPeerTransport}) is implemented.
 */
public interface PeerTransport extends AutoCloseable {
    /** Blocks a peer pinned for this host: how many, and their slots' sizes in slot order. */
    interface RemotePin {
        int blocks();

        long[] slotBytes();

        /** Bytes of one block: its slots together. */
        default long blockBytes() {
            long sum = 0;
            for (long s : slotBytes()) {
                sum += s;
            }
            return sum;
        }
    }

    /** Pins the resident prefix of {@code hashes} on {@code peer}; null when it holds none of it. */
    RemotePin pin(BlockRegistry.Node peer, String namespace, BlockHashes hashes, Duration deadline) throws IOException;

    /**
     * Reads pinned block {@code i} into {@code into.dst(i)} for every non-null destination,
     * setting {@code ok[i]} when its bytes arrived and their checksum matched. Throws when the
     * peer or the link failed (blocks not yet read stay not ok).
     */
    void read(RemotePin pin, FetchReservation into, boolean[] ok) throws IOException;

    /** Ends the pin (best effort: the peer's deadline ends it anyway). */
    void release(RemotePin pin);

    /** Blocks that arrived with a checksum that did not match (never served). */
    long checksumFailures();

    @Override
    void close();
}
