package io.pegaflow.engine;

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
    boolean completed;

    FetchReservation(Block[] blocks, long[] handles, MemorySegment[] dst) {
        this.blocks = blocks;
        this.handles = handles;
        this.dst = dst;
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
