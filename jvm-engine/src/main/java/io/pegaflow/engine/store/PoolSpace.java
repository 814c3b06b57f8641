package io.pegaflow.engine.store;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.PoolExhaustedException;
import io.pegaflow.engine.Sizes;
import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.pool.OffsetAllocator;
import io.pegaflow.engine.store.OpenCopy.PlannedBlock;
import java.lang.foreign.MemorySegment;
import java.util.Arrays;
import java.util.Collection;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Set;
import java.util.function.ObjLongConsumer;

/**
 * The pool as the store sees it: offsets from the {@link OffsetAllocator} (not the memory),
 * the LRU of unreferenced sealed blocks, the blocks in flight and the resident counts. Every
 * allocation goes through {@link #claim} (allocate, evicting as needed, then claim the slots)
 * and every block becomes resident through {@link #seal}, whoever filled it: a save, a read back
 * from SSD, a fetch from a peer. Runs under {@link LocalStore}'s lock ({@link StoreLock}), on
 * whichever thread holds it: callers' threads, the sweeper, the SSD tier's threads; it never
 * takes the lock itself.
 */
final class PoolSpace {
    /** What a block becoming resident or leaving the pool tells the tiers (LocalStore wires SSD and peers). */
    interface Residency {
        /** {@code b} was just sealed; {@code saved}: by a save here, not read back from SSD or fetched from a peer. */
        void sealed(Block b, boolean saved);

        /** {@code b}, resident, just left the pool (evicted or cleared). */
        void dropped(Block b);
    }

    /** What one walk over the indexed blocks counted, for {@link #verifyTotals}. */
    record Tally(long bytes, int allocations, long sealed, long sealedBytes, long pinned) {}

    private final OffsetAllocator allocator;
    private final LruList lru = new LruList();
    private final Set<Block> inflight = new HashSet<>();
    private final ObjLongConsumer<Counter> count;
    private final Residency residency;
    /** Which unreferenced block eviction takes ({@link CachePolicy}: the oldest, or the least asked for of the oldest). */
    private final CachePolicy policy;
    private long residentBlocks;
    private long residentBytes;
    /** Resident bytes by owner (a tenant's saves: {@link Block#owner}); owners without bytes are absent. */
    private final java.util.Map<Integer, Long> owned = new java.util.HashMap<>();
    /** How far {@link #keepShare} looks along the eviction order for an owner's own blocks. */
    static final int SHARE_SCAN = 65_536;
    /** The pool's memory as this process maps it (the bytes offsets refer to); set once, by the first tier attached. */
    private volatile MemorySegment memory;

    PoolSpace(long capacityBytes, ObjLongConsumer<Counter> count, Residency residency, CachePolicy policy) {
        this.allocator = new OffsetAllocator(capacityBytes);
        this.count = count;
        this.residency = residency;
        this.policy = policy;
    }

    long capacityBytes() {
        return allocator.capacityBytes();
    }

    long usedBytes() {
        return allocator.usedBytes();
    }

    long freeBytes() {
        return allocator.freeBytes();
    }

    /** Free plus evictable bytes: what allocations may take without touching a referenced block. */
    long room() {
        return allocator.freeBytes() + lru.evictableBytes();
    }

    /** Pool bytes an allocation of {@code bytes} takes (whole allocator units). */
    long allocatedBytes(long bytes) {
        long unit = allocator.unitBytes();
        return (bytes + unit - 1) / unit * unit;
    }

    long residentBlocks() {
        return residentBlocks;
    }

    long residentBytes() {
        return residentBytes;
    }

    int inflightBlocks() {
        return inflight.size();
    }

    /**
     * Under lock: marks the blocks of {@code hashes} that {@code ns} holds (sealed or in flight)
     * to go first; an unreferenced sealed one moves to the oldest end of the eviction order now,
     * the others when their last reference goes. The number marked.
     */
    int demote(NamespaceIndex ns, BlockHashes hashes) {
        int marked = 0;
        int len = hashes.hashLen();
        for (int i = 0; i < hashes.count(); i++) {
            Block b = ns.blocks.get(hashes.packed(), i * len, len);
            if (b == null || b.removed) {
                continue;
            }
            b.evictFirst = true;
            marked++;
            if (b.sealed && b.refs == 0) {
                lru.moveToOldest(b);
            }
        }
        return marked;
    }

    /** The eviction order, for the operator's pins ({@link AdminPins#pinAll}). */
    LruList lru() {
        return lru;
    }

    /** The pool's memory, or null while no tier that reads or writes it is attached. */
    MemorySegment memory() {
        return memory;
    }

    void map(MemorySegment pool) {
        memory = pool;
    }

    /** Where allocation {@code handle} lies in the pool's memory, its first {@code bytes}. */
    MemorySegment slice(long handle, long bytes) {
        return memory.asSlice(allocator.offsetBytes(handle), bytes);
    }

    /**
     * The refusal of a save needing {@code needed} pool bytes that even evicting every
     * unreferenced block cannot free (counted; nothing changed): callers check {@link #room} first.
     */
    PoolExhaustedException exhausted(long needed) {
        count.accept(Counter.POOL_ALLOC_FAILURES, 1);
        return new PoolExhaustedException("host pool exhausted: saving needs " + Sizes.format(needed)
                + " but the pool (" + Sizes.format(allocator.capacityBytes()) + ") has " + Sizes.format(allocator.freeBytes())
                + " free and " + Sizes.format(lru.evictableBytes()) + " evictable; " + lru.pinnedBlocks()
                + " blocks are pinned by leases or loads and " + inflight.size() + " blocks are being assembled");
    }

    /**
     * Allocates {@code bytes}, evicting the least recently used unreferenced blocks while no
     * free range fits, then claims slots of {@code b} in the allocation, back to back: the
     * worker's {@code regions} (slot {@code worker.slots[r]}, {@code worker.slotBytes[r]} bytes
     * each) or, with a null worker, every slot in slot order ({@code b.ns.slotBytes}). The
     * claimed slots are {@link Block#WRITING} at their offsets and the allocation is the
     * block's. The handle, or {@link OffsetAllocator#NO_SPACE} when evicting every unreferenced
     * block left no range that fits: the block is untouched (what was evicted stays evicted),
     * and the caller decides what that failure means.
     */
    long claim(Block b, long bytes, Instance.Worker worker, int[] regions) {
        long handle;
        while ((handle = allocator.allocate(bytes)) == OffsetAllocator.NO_SPACE) {
            if (!evictOne()) {
                return OffsetAllocator.NO_SPACE;
            }
        }
        b.addAllocation(handle, allocator.sizeBytes(handle));
        long at = allocator.offsetBytes(handle);
        if (worker == null) {
            long[] sizes = b.ns.slotBytes;
            for (int s = 0; s < sizes.length; s++) {
                b.slotState[s] = Block.WRITING;
                b.slotOffset[s] = at;
                at += sizes[s];
            }
        } else {
            for (int r : regions) {
                int slot = worker.slots[r];
                b.slotState[slot] = Block.WRITING;
                b.slotOffset[slot] = at;
                at += worker.slotBytes[r];
            }
        }
        return handle;
    }

    /** Resident bytes of blocks {@code owner}'s saves made. */
    long ownedBytes(int owner) {
        return owned.getOrDefault(owner, 0L);
    }

    /** Resident bytes by owner, a copy (metrics). */
    java.util.Map<Integer, Long> ownedBytes() {
        return java.util.Map.copyOf(owned);
    }

    /**
     * Before {@code owner}'s save claims {@code bytes} more (plus {@code planned}, claimed by the
     * same save already but not resident yet): evicts the owner's own least recently used
     * unreferenced blocks while it would pass {@code share}; false when its own evictable
     * blocks ran out first (the save must be refused: other tenants' blocks are not taken for it).
     */
    boolean keepShare(int owner, long bytes, long planned, long share) {
        while (ownedBytes(owner) + planned + bytes > share) {
            if (!evict(lru.pollOldestOwnedBy(owner, SHARE_SCAN))) {
                return false;
            }
        }
        return true;
    }

    /** Undoes {@link #claim} (same worker and regions): the slots are empty again and the allocation freed. */
    void unclaim(Block b, long handle, Instance.Worker worker, int[] regions) {
        if (worker == null) {
            Arrays.fill(b.slotState, Block.EMPTY);
            Arrays.fill(b.slotOffset, -1L);
        } else {
            for (int r : regions) {
                int slot = worker.slots[r];
                b.slotState[slot] = Block.EMPTY;
                b.slotOffset[slot] = -1;
            }
        }
        allocator.free(handle);
        b.removeAllocation(handle);
    }

    /** Undoes the allocations and slot claims of a save that did not happen, and drops its pins. */
    void rollBack(Instance.Worker worker, List<PlannedBlock> done) {
        for (PlannedBlock plan : done) {
            unclaim(plan.block, plan.allocation, worker, plan.regions);
            unpin(plan.block);
        }
    }

    /** Indexes a new block as in flight, pinned by its filler until it is sealed or dropped. */
    void admit(Block b) {
        b.ns.blocks.put(b);
        inflight.add(b);
        lru.pin(b);
    }

    /**
     * Makes a block whose every slot is {@link Block#FILLED} resident: sealed, out of flight,
     * counted, and still pinned by its filler (whose unpin may make it evictable); then tells the
     * tiers ({@link Residency#sealed}). {@code saved}: a save filled it here (counted, offered to
     * SSD), not a read back from SSD or a fetch from a peer.
     */
    void seal(Block b, boolean saved) {
        b.sealed = true;
        inflight.remove(b);
        residentBlocks++;
        residentBytes += b.bytes;
        if (b.owner >= 0) {
            owned.merge(b.owner, b.bytes, Long::sum);
        }
        lru.addPinned(); // the filler's own reference; its unpin may make it evictable
        if (saved) {
            count.accept(Counter.BLOCKS_SEALED, 1);
        }
        residency.sealed(b, saved);
    }

    /**
     * Ends a read back from SSD or a fetch from a peer into {@code b}'s reserved allocation
     * {@code handle}: seals the block (resident, advertised) when its bytes arrived and were
     * checked, else releases the allocation; then drops the read's pin (an empty block leaves
     * the index with it).
     */
    void endRead(Block b, long handle, boolean ok, long now) {
        b.prefetching = false;
        if (ok) {
            Arrays.fill(b.slotState, Block.FILLED);
            b.filled = b.slotState.length;
            b.touchedNanos = now;
            seal(b, false);
        } else {
            unclaim(b, handle, null, null);
        }
        unpin(b);
    }

    void pin(Block b) {
        lru.pin(b);
    }

    void pinAll(Block[] blocks) {
        for (Block b : blocks) {
            lru.pin(b);
        }
    }

    void unpin(Block b) {
        if (lru.unpin(b) && b.filled == 0 && b.allocationCount == 0) {
            // A failed save left an empty in-flight block behind.
            inflight.remove(b);
            b.ns.blocks.remove(b);
            b.removed = true;
        }
    }

    void unpinAll(Block[] blocks) {
        for (Block b : blocks) {
            unpin(b);
        }
    }

    /**
     * Evicts an unreferenced block, the least recently used one (or, with {@code lfu}, the least
     * asked for of the least recently used); false when there is none.
     */
    private boolean evictOne() {
        return evict(policy.lfu ? lru.pollLeastFrequent(policy::frequency, CachePolicy.SAMPLE) : lru.pollOldest());
    }

    /** Evicts {@code b}, already taken off the LRU list (counted); false when there is none. */
    private boolean evict(Block b) {
        if (b == null) {
            return false;
        }
        count.accept(Counter.EVICTIONS, 1);
        count.accept(Counter.EVICTED_BYTES, b.bytes);
        dropResident(b);
        return true;
    }

    /** Drops an unreferenced sealed block now (an operator's clear), as eviction would but uncounted. */
    void drop(Block b) {
        lru.remove(b);
        dropResident(b);
    }

    /** A sealed block already off the LRU list leaves the index, the other hosts' view and the pool. */
    private void dropResident(Block b) {
        residentBlocks--;
        residentBytes -= b.bytes;
        if (b.owner >= 0) {
            owned.computeIfPresent(b.owner, (k, v) -> v - b.bytes == 0 ? null : v - b.bytes);
        }
        b.ns.blocks.remove(b);
        residency.dropped(b);
        freeAllocations(b);
    }

    void freeAllocations(Block b) {
        for (int i = 0; i < b.allocationCount; i++) {
            allocator.free(b.allocations[i]);
        }
        b.allocationCount = 0;
        b.bytes = 0;
        b.removed = true;
    }

    /** Drops unreferenced blocks still in flight {@code ttlNanos} after they were last touched. */
    void expireInflight(long now, long ttlNanos) {
        for (Iterator<Block> it = inflight.iterator(); it.hasNext(); ) {
            Block b = it.next();
            if (b.refs == 0 && now - b.touchedNanos > ttlNanos) {
                it.remove();
                b.ns.blocks.remove(b);
                freeAllocations(b);
                count.accept(Counter.INFLIGHT_GC, 1);
            }
        }
    }

    /**
     * Checks every indexed block (its own counts, LRU membership when sealed, tracked in flight
     * when not) and tallies them for {@link #verifyTotals}.
     */
    Tally verifyBlocks(Collection<NamespaceIndex> namespaces) {
        long bytes = 0;
        long sealed = 0;
        long sealedBytes = 0;
        long pinned = 0;
        int allocations = 0;
        Set<Block> inLru = lru.members();
        for (NamespaceIndex ns : namespaces) {
            for (Block b : ns.blocks.values()) {
                bytes += b.bytes;
                allocations += b.allocationCount;
                b.verify();
                if (b.sealed) {
                    sealed++;
                    sealedBytes += b.bytes;
                    if (b.refs > 0) {
                        pinned++;
                    }
                    LocalStore.require(inLru.contains(b) == (b.refs == 0), "block " + b.key + " refs " + b.refs + " but inLru=" + inLru.contains(b));
                } else {
                    LocalStore.require(inflight.contains(b), "unsealed block " + b.key + " not tracked in flight");
                }
            }
        }
        return new Tally(bytes, allocations, sealed, sealedBytes, pinned);
    }

    /** Checks exact pool accounting: the blocks' bytes and allocations, the resident counts and the LRU's. */
    void verifyTotals(Tally t) {
        LocalStore.require(t.bytes() == allocator.usedBytes(), "blocks hold " + t.bytes() + " bytes but the allocator has "
                + allocator.usedBytes() + " in use");
        LocalStore.require(t.allocations() == allocator.liveAllocations(), "blocks hold " + t.allocations() + " allocations, allocator "
                + allocator.liveAllocations());
        LocalStore.require(t.sealed() == residentBlocks && t.sealedBytes() == residentBytes, "resident " + residentBlocks + "/"
                + residentBytes + " but counted " + t.sealed() + "/" + t.sealedBytes());
        lru.verify(t.pinned());
    }

    /**
     * At close, once every block's allocations were freed ({@link #freeAllocations}): forgets
     * the blocks in flight and the LRU, and fails with {@link IllegalStateException} if pool
     * accounting does not return to zero.
     */
    void clear() {
        inflight.clear();
        lru.clear();
        residentBlocks = residentBytes = 0;
        if (allocator.usedBytes() != 0 || allocator.liveAllocations() != 0) {
            throw new IllegalStateException("host pool accounting leak at close: " + allocator.usedBytes()
                    + " bytes in " + allocator.liveAllocations() + " allocations not returned");
        }
    }
}
