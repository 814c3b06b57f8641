package io.pegaflow.engine.store;

import java.lang.foreign.MemorySegment;

/**
 * Pool space reserved for blocks fetched from a peer ({@link LocalStore#reserveFetch}):
 * {@code dst[i]} is where block {@code i} of the asked run goes, slots in slot order, or null
 * where that block is already here (nothing to fetch). Its length is the run the pool had
 * room for. Hand it back exactly once to {@link LocalStore#completeFetch}.
 */
public final class FetchReservation {
    final Block[] blocks;
    final long[] handles;
    private final MemorySegment[] dst;
    private final long[] checksums;
    boolean completed;

    FetchReservation(Block[] blocks, long[] handles, MemorySegment[] dst) {
        this.blocks = blocks;
        this.handles = handles;
        this.dst = dst;
        this.checksums = new long[dst.length];
        java.util.Arrays.fill(checksums, BlockChecksum.UNKNOWN);
    }

    /**
     * Records block {@code i}'s {@link BlockChecksum}, which its bytes matched on arrival: kept
     * with the block once sealed, so serving it on to another host does not sum it again.
     */
    public void verified(int i, int checksum) {
        checksums[i] = Integer.toUnsignedLong(checksum);
    }

    long checksum(int i) {
        return checksums[i];
    }

    public int length() {
        return dst.length;
    }

    /** Where block {@code i} goes, or null when it is already resident or being saved. */
    public MemorySegment dst(int i) {
        return dst[i];
    }

    /** Blocks to fetch (non-null destinations). */
    public int toFetch() {
        int n = 0;
        for (MemorySegment d : dst) {
            if (d != null) {
                n++;
            }
        }
        return n;
    }
}
