package io.pegaflow.server.cluster;

import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.Limits;
import java.nio.charset.StandardCharsets;

/**
 * The peer channel's frames (docs/cluster.md, "Wire"), big-endian. A connection opens with a
 * mutual challenge-response over the cluster secret, which never crosses the wire (whoever Redis
 * names as a peer learns nothing it could replay):
 * <pre>
 * HELLO   magic, 32-byte client nonce
 *      -> u8 status (OK), 32-byte server nonce, 32-byte server proof
 * PROOF   32-byte client proof   (sent only once the server's proof checked out)
 *      -> u8 status (OK, or REFUSED and the connection closes)
 * </pre>
 * A proof is HMAC-SHA256 over the secret of a role label and both nonces ({@link #proof}).
 * Then requests, each answered in order:
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
    static final byte[] MAGIC = "PFPEER04".getBytes(StandardCharsets.US_ASCII);
    static final int NONCE_BYTES = 32;
    static final int PROOF_BYTES = 32;
    private static final java.security.SecureRandom NONCES = new java.security.SecureRandom();
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
    /** One block's entry in a batch header: u32 index, u32 {@link io.pegaflow.engine.store.BlockChecksum} (CRC32). */
    static final int ENTRY_BYTES = 8;
    /** Blocks per batch: one header write and one scattering read (16 x 64 KiB: 1 MiB a system call). */
    static final int BATCH = 16;
    /** Hashes one pin may ask for (a 2,048-block prefix is the design point; 32x that is plenty). */
    static final int MAX_PIN_HASHES = 65_536;
    static final int MAX_DEADLINE_MS = 600_000;
    static final int MAX_SLOTS = Limits.MAX_SLOTS_PER_BLOCK;

    private PeerWire() {}

    static byte[] nonce() {
        byte[] n = new byte[NONCE_BYTES];
        NONCES.nextBytes(n);
        return n;
    }

    /**
     * HMAC-SHA256 keyed by the cluster secret over {@code role} ("server" or "client"), then the
     * client's and the server's nonces: each side proves it holds the secret for this connection
     * alone, and a proof of one role is never valid for the other.
     */
    static byte[] proof(byte[] secret, String role, byte[] clientNonce, byte[] serverNonce) {
        try {
            javax.crypto.Mac mac = javax.crypto.Mac.getInstance("HmacSHA256");
            mac.init(new javax.crypto.spec.SecretKeySpec(secret, "HmacSHA256"));
            mac.update(role.getBytes(StandardCharsets.US_ASCII));
            mac.update(clientNonce);
            mac.update(serverNonce);
            return mac.doFinal();
        } catch (java.security.GeneralSecurityException e) {
            throw new IllegalStateException("HmacSHA256 is part of every Java runtime", e);
        }
    }

    static void check(boolean ok, String what) {
        if (!ok) {
            throw new InvalidArgumentException("peer request: " + what);
        }
    }
}
