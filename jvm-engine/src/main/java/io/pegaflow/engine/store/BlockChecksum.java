package io.pegaflow.engine.store;

import java.lang.foreign.MemorySegment;
import java.util.zip.CRC32;

/**
 * The one checksum form of a block's bytes on the peer wire (docs/cluster.md): CRC32 (IEEE,
 * {@link CRC32}) over its slots in slot order. {@link LocalStore} sums a sealed block once, in
 * the background, when other hosts may read it; the peer channel sums at send time only the
 * blocks not yet summed, and checks every block it receives. CRC32 rather than CRC32C: the JDK
 * folds CRC32 with carry-less multiplies (PCLMULQDQ, VPCLMULQDQ where there is AVX-512), so it
 * runs faster than CRC32C both in cache and from memory, which cut the checks' share of a peer
 * fetch's CPU (docs/cluster.md, "Where a fetch's CPU goes"; bench/probe/ChecksumProbe.java).
 * Either detects every burst of up to 32 flipped bits and any odd number of flips.
 */
public final class BlockChecksum {
    /** {@link Block#crc} of a block not summed yet. */
    static final long UNKNOWN = -1;

    private BlockChecksum() {}

    /** The checksum of {@code slotBytes[s]} bytes at {@code slotOffsets[s]} of {@code pool}, s in order. */
    public static int of(MemorySegment pool, long[] slotOffsets, long[] slotBytes) {
        java.util.zip.Checksum crc = running();
        for (int s = 0; s < slotOffsets.length; s++) {
            crc.update(pool.asSlice(slotOffsets[s], slotBytes[s]).asByteBuffer());
        }
        return (int) crc.getValue();
    }

    /**
     * A running checksum of this form, for bytes that arrive in pieces: {@code (int) getValue()}
     * after the block's bytes in slot order equals {@link #of}.
     */
    public static java.util.zip.Checksum running() {
        return new CRC32();
    }
}
