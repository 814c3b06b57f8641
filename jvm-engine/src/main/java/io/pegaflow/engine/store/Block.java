package io.pegaflow.engine.store;

import java.util.Arrays;

/**
 * One cached block: a slot per (layer, TP rank), each at an offset in the host pool. Slots
 * arrive from several saves (one per worker, or per layer); the block is <em>sealed</em>
 * (visible to queries) once every slot is {@link #FILLED}. All fields are guarded by the
 * engine lock.
 *
 * <p>{@code refs} counts leases, loads in progress and saves in progress that use the block;
 * a block is on the LRU list (evictable) exactly when it is sealed and {@code refs == 0}.
 */
final class Block {
    static final byte EMPTY = 0;
    static final byte WRITING = 1;
    static final byte FILLED = 2;

    final NamespaceIndex ns;
    final HashKey key;
    final long[] slotOffset;
    final byte[] slotState;
    int filled;

    /** Pool allocations backing the slots (usually one per saving worker). */
    long[] allocations = new long[2];
    long[] allocationBytes = new long[2];
    int allocationCount;
    long bytes;

    int refs;
    boolean sealed;
    boolean removed;
    /** Being read back from SSD (pool space reserved, not visible yet). */
    boolean prefetching;
    /** Read back from SSD and not yet served by a query (tier attribution). */
    boolean fromSsd;
    /** Fetched from a peer and not yet served (tier attribution). */
    boolean fromPeer;
    /** Pinned by the operator ({@link AdminPins}): one reference held until unpinned or cleared. */
    boolean adminPinned;
    long touchedNanos;
    /**
     * A request asked for it to go first under pressure (retention "low", {@link LocalStore#demote}):
     * it joins the eviction order at its oldest end until a query hits it again.
     */
    boolean evictFirst;
    /** The tenant whose save made it (LocalStore.assignOwner; -1: none): its pool share counts it. */
    int owner = -1;
    /** When the block was sealed (the store's clock): its residence time when it leaves. */
    long sealedNanos;
    /**
     * {@link BlockChecksum} of the sealed block's bytes once known (summed in the background,
     * or checked on arrival from a peer); {@link BlockChecksum#UNKNOWN} before. Written under
     * the store's lock; read by peer pins under it.
     */
    long crc = BlockChecksum.UNKNOWN;

    Block lruPrev;
    Block lruNext;

    Block(NamespaceIndex ns, HashKey key, long now) {
        this.ns = ns;
        this.key = key;
        int slots = ns.layout.slotCount();
        this.slotOffset = new long[slots];
        this.slotState = new byte[slots];
        Arrays.fill(slotOffset, -1L);
        this.touchedNanos = now;
    }

    boolean complete() {
        return filled == slotState.length;
    }

    /** Checks the block's own counts and flags, as an indexed block (see {@link LocalStore#verifyInvariants}). */
    void verify() {
        int count = 0;
        for (byte s : slotState) {
            if (s == FILLED) {
                count++;
            }
        }
        LocalStore.require(count == filled, "block " + key + " counts " + filled + " filled slots, has " + count);
        LocalStore.require(refs >= 0, "block " + key + " has refs " + refs);
        LocalStore.require(sealed == complete(), "block " + key + " sealed=" + sealed + " but complete=" + complete());
        LocalStore.require(!removed, "removed block " + key + " still indexed");
    }

    void addAllocation(long handle, long size) {
        if (allocationCount == allocations.length) {
            allocations = Arrays.copyOf(allocations, allocationCount * 2);
            allocationBytes = Arrays.copyOf(allocationBytes, allocationCount * 2);
        }
        allocations[allocationCount] = handle;
        allocationBytes[allocationCount] = size;
        allocationCount++;
        bytes += size;
    }

    /** Forgets one allocation (after a failed save freed it). */
    void removeAllocation(long handle) {
        for (int i = 0; i < allocationCount; i++) {
            if (allocations[i] == handle) {
                bytes -= allocationBytes[i];
                allocationCount--;
                allocations[i] = allocations[allocationCount];
                allocationBytes[i] = allocationBytes[allocationCount];
                return;
            }
        }
        throw new IllegalStateException("block " + key + " has no allocation 0x" + Long.toHexString(handle));
    }
}
