package io.pegaflow.engine.store;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.pool.OffsetAllocator;
import io.pegaflow.engine.ssd.SsdConfig;
import io.pegaflow.engine.ssd.SsdTier;
import java.lang.foreign.MemorySegment;
import java.util.ArrayDeque;
import java.util.function.LongSupplier;
import java.util.function.ObjLongConsumer;

/**
 * The SSD tier below the pool: every block a save seals is offered to it ({@link #offer}), and
 * the run of a query's prefix that continues on it is read back into the pool
 * ({@link #prefetch}), within the prefetch budget. Runs under {@link LocalStore}'s lock: the
 * store calls it from callers' threads (a query, an operator's warm) with the lock held; the
 * tier's writer threads ({@link #fillFromPool}) and reader threads ({@link #prefetchDone}) take it.
 */
final class SsdReadBack {
    private final StoreLock lock;
    private final PoolSpace pool;
    private final ObjLongConsumer<Counter> count;
    private final LongSupplier clock;
    /** The tier; set once, before use. */
    private volatile SsdTier tier;
    // --- guarded by lock ---
    /** Blocks being read back from SSD, over every request. */
    private int prefetchInFlight;
    /** Blocks waiting for a read slot (indexed, pinned, no pool space yet), oldest first. */
    private final ArrayDeque<Block> fetchQueue = new ArrayDeque<>();
    private long queuedFetchBytes;
    /** Reads back from SSD ever queued (an operator's warm counts what it started). */
    private long readsQueued;
    private boolean pumping;
    /** The store's block events: the tier's records written and dropped go there. */
    private final KvEventLog events;

    SsdReadBack(StoreLock lock, PoolSpace pool, ObjLongConsumer<Counter> count, LongSupplier clock, KvEventLog events) {
        this.lock = lock;
        this.pool = pool;
        this.count = count;
        this.clock = clock;
        this.events = events;
    }

    /** The attached tier, or null. */
    SsdTier tier() {
        return tier;
    }

    /** Under lock: opens the tier ({@link LocalStore#attachSsd}); it reads from and writes into {@code memory}. */
    SsdTier attach(SsdConfig config, MemorySegment memory) {
        if (tier != null) {
            throw new InvalidArgumentException("an SSD tier is already attached");
        }
        pool.map(memory);
        tier = SsdTier.open(config, count::accept); // rebuilds its index from the shard files
        tier.listen(new SsdTier.Listener() {
            @Override
            public void stored(String namespace, byte[] hash) {
                events.append(KvEventLog.Kind.STORED, KvEventLog.SSD, namespace, hash);
            }

            @Override
            public void removed(String namespace, byte[] hash) {
                events.append(KvEventLog.Kind.REMOVED, KvEventLog.SSD, namespace, hash);
            }
        });
        return tier;
    }

    /** Under lock: blocks being read back now. */
    int inFlight() {
        return prefetchInFlight;
    }

    /** Under lock: reads back ever queued. */
    long readsQueued() {
        return readsQueued;
    }

    /** Under lock: forgets the queued reads (at close). */
    void clear() {
        fetchQueue.clear();
    }

    /** Under lock: offers a block just sealed to the SSD tier (never blocks; the tier counts what it drops). */
    void offer(Block b) {
        SsdTier t = tier;
        if (t == null) {
            return;
        }
        NamespaceIndex ns = b.ns;
        t.offer(ns.namespace, b.key.bytes(), ns.slotBytes, dst -> fillFromPool(b, dst));
    }

    /**
     * On an SSD writer thread: copies a sealed block's slots, in slot order, into {@code dst},
     * pinning the block for the copy. False when it was evicted before its turn came.
     */
    private boolean fillFromPool(Block b, MemorySegment dst) {
        long[] offsets;
        lock.lock();
        try {
            if (lock.closed() || b.removed || !b.sealed) {
                return false;
            }
            pool.pin(b);
            offsets = b.slotOffset.clone();
        } finally {
            lock.unlock();
        }
        try {
            MemorySegment memory = pool.memory();
            long[] sizes = b.ns.slotBytes;
            long at = 0;
            for (int s = 0; s < sizes.length; s++) {
                MemorySegment.copy(memory, offsets[s], dst, at, sizes[s]);
                at += sizes[s];
            }
            return true;
        } finally {
            lock.locked(() -> {
                if (!lock.closed()) {
                    pool.unpin(b);
                }
            });
        }
    }

    /**
     * Under lock: the run of blocks after the resident prefix ({@code from}) that continues on
     * SSD or is being read back: queues reads for what is on SSD (while the pool has unpinned
     * space for them), starts as many as the prefetch budget allows, and returns the run's
     * length when any of it is still being read, else 0 (answer with the resident prefix).
     * Prefix and run together are capped at half the pool, so reading the run's end cannot
     * evict its start. A queued block is indexed as in flight, so later polls only walk the run.
     */
    int prefetch(NamespaceIndex ns, BlockHashes hashes, int from, long now) {
        SsdTier t = tier;
        byte[] packed = hashes.packed();
        int len = hashes.hashLen();
        long cap = pool.capacityBytes() / 2 / Math.max(1, ns.blockBytes) - from;
        long need = pool.allocatedBytes(ns.blockBytes);
        int run = 0;
        boolean waiting = false;
        for (int i = from; i < hashes.count() && run < cap; i++) {
            Block b = ns.blocks.get(packed, i * len, len);
            if (b != null) {
                if (!b.sealed && !b.prefetching) {
                    break; // being saved
                }
                waiting |= b.prefetching;
                run++;
                continue;
            }
            if (t == null) {
                break; // no SSD tier: only blocks fetched from peers are waited for
            }
            if (pool.room() - queuedFetchBytes < need) {
                count.accept(Counter.SSD_PREFETCH_NO_SPACE, 1);
                break; // the rest would only evict what this answer needs
            }
            if (!t.contains(ns.namespace, packed, i * len, len)) {
                break;
            }
            b = new Block(ns, HashKey.of(hashes, i), now);
            pool.admit(b);
            b.prefetching = true;
            fetchQueue.add(b);
            readsQueued++;
            queuedFetchBytes += need;
            waiting = true;
            run++;
        }
        if (t != null) {
            pumpFetches();
        }
        return waiting ? run : 0;
    }

    /** Under lock: starts queued reads while the prefetch budget allows. */
    private void pumpFetches() {
        if (pumping) {
            return; // a read that completed at once (the tier is closing) called back into this loop
        }
        pumping = true;
        try {
            pumpFetchesOnce();
        } finally {
            pumping = false;
        }
    }

    private void pumpFetchesOnce() {
        SsdTier t = tier;
        int max = t.config().maxPrefetchBlocks();
        while (prefetchInFlight < max && !fetchQueue.isEmpty()) {
            Block b = fetchQueue.poll();
            NamespaceIndex ns = b.ns;
            queuedFetchBytes -= pool.allocatedBytes(ns.blockBytes);
            long bytes = ns.blockBytes;
            long handle = pool.claim(b, bytes, null, null);
            if (handle == OffsetAllocator.NO_SPACE) {
                count.accept(Counter.SSD_PREFETCH_NO_SPACE, 1);
                b.prefetching = false;
                pool.unpin(b); // never allocated: unpin drops it from the index
                continue;
            }
            prefetchInFlight++;
            count.accept(Counter.SSD_PREFETCH_BLOCKS, 1);
            t.read(ns.namespace, b.key.bytes(), ns.slotBytes, pool.slice(handle, bytes),
                    outcome -> prefetchDone(b, handle, outcome));
        }
    }

    /** On an SSD reader thread: seals a block read back and checked, or drops its reservation. */
    private void prefetchDone(Block b, long handle, SsdTier.ReadOutcome outcome) {
        lock.locked(() -> {
            if (lock.closed()) {
                return;
            }
            prefetchInFlight--;
            boolean ok = outcome == SsdTier.ReadOutcome.OK;
            if (!ok) {
                count.accept(Counter.SSD_PREFETCH_FAILURES, 1);
            }
            b.fromSsd = ok;
            pool.endRead(b, handle, ok, clock.getAsLong());
            pumpFetches();
        });
    }
}
