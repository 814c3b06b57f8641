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
 *      -> u8 status; OK: the blocks asked for, in order, BATCH at a time:
 *         "PFBAT2", u16 m, u64 block length, m x (u32 index, u32 CRC32), the m payloads back to back
 * RELEASE u8 3, pin id -> u8 status
 * </pre>
 */
final class PeerWire {
    static final byte[] MAGIC = "PFPEER03".getBytes(StandardCharsets.US_ASCII);
    static final byte[] BATCH_MARK = "PFBAT2".getBytes(StandardCharsets.US_ASCII);
    static final byte PIN = 1;
    static final byte READ = 2;
    static final byte RELEASE = 3;
    static final byte OK = 0;
    static final byte REFUSED = 1;
    static final byte NONE = 2;
    static final byte BAD_REQUEST = 3;
    static final byte UNKNOWN_PIN = 4;
    static final int ID_BYTES = 16;
    /**
     * A batch's header before its entries. The checksums lead the payloads so that an owner can
     * hand the payloads to the kernel straight from its pool file (sendfile) after one header write.
     */
    static final int BATCH_HEAD_BYTES = 6 + 2 + 8;
    /** One block's entry in a batch header: u32 index, u32 {@link io.pegaflow.engine.BlockChecksum} (CRC32). */
    static final int ENTRY_BYTES = 8;
    /** Blocks per batch: one header write and one scattering read (16 x 64 KiB: 1 MiB a system call). */
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
