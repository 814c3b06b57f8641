package io.pegaflow.server.cluster;

import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.Limits;
import java.nio.charset.StandardCharsets;

/**
 * The peer channel's frames (docs/cluster.md, "Wire"), big-endian. A connection opens with
 * {@code HELLO} = magic, u16 secret length, secret; the server answers one status byte and
 * closes on a wrong secret. Then requests, each answered in order:
 * <pre>
 * PIN     u8 1, u16 ns length, ns, u8 hash length, u32 count, hashes, u32 deadline ms
 *      -> u8 status; OK: 16-byte pin id, u32 blocks, u32 slots, slots x u64 slot bytes
 * READ    u8 2, pin id, u32 count, count x u8 (1: send block i)
 *      -> u8 status; OK: for each block sent: "PFBLK1", u32 index, u64 length, payload, u32 CRC32C
 * RELEASE u8 3, pin id -> u8 status
 * </pre>
 */
final class PeerWire {
    static final byte[] MAGIC = "PFPEER01".getBytes(StandardCharsets.US_ASCII);
    static final byte[] BLOCK = "PFBLK1".getBytes(StandardCharsets.US_ASCII);
    static final byte PIN = 1;
    static final byte READ = 2;
    static final byte RELEASE = 3;
    static final byte OK = 0;
    static final byte REFUSED = 1;
    static final byte NONE = 2;
    static final byte BAD_REQUEST = 3;
    static final byte UNKNOWN_PIN = 4;
    static final int ID_BYTES = 16;
    /** Blocks per gathering write or scattering read (16 x 64 KiB: 1 MiB a system call). */
    static final int BATCH = 16;
    /** Hashes one pin may ask for (a 2,048-block prefix is the design point; 32x that is plenty). */
    static final int MAX_PIN_HASHES = 65_536;
    static final int MAX_SECRET = 4096;
    static final int MAX_DEADLINE_MS = 600_000;
    static final int MAX_SLOTS = Limits.MAX_SLOTS_PER_BLOCK;

    private PeerWire() {}

    static void check(boolean ok, String what) {
        if (!ok) {
            throw new InvalidArgumentException("peer request: " + what);
        }
    }
}
