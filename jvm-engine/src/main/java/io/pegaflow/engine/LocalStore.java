package io.pegaflow.engine;

import io.pegaflow.engine.OpenCopy.OpenLoad;
import io.pegaflow.engine.OpenCopy.PlannedBlock;
import io.pegaflow.engine.OpenCopy.Reservation;
import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.metrics.CounterMetrics;
import io.pegaflow.engine.metrics.Gauge;
import io.pegaflow.engine.metrics.MetricsSink;
import io.pegaflow.engine.pool.OffsetAllocator;
import io.pegaflow.engine.ssd.SsdConfig;
import io.pegaflow.engine.ssd.SsdTier;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.security.SecureRandom;
import java.util.Arrays;
import java.util.EnumMap;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.LongSupplier;

/**
 * The control plane of the block store: instances and their topology, the block index, pool
 * offsets (not the memory), leases, eviction. It decides what is copied where; it never
 * touches KV bytes. {@link PegaEngine} pairs it with a pool mapping and a copy engine in one
 * process; pegaflow-server serves it to workers that map the shared pool and copy
 * themselves. See {@code package-info.java} for the model and its invariants.
 *
 * <p>A save is two calls: {@link #reserveSave} allocates pool space, claims the slots and
 * returns where each one goes; {@link #endCopy} seals what landed (or rolls back). A load
 * is {@link #beginLoad} (consumes the worker's lease share, pins the blocks, returns where
 * each slot is) and {@link #endCopy}. Every method may be called from any thread; each runs
 * under one lock and none waits for a copy.
 */
public final class LocalStore implements BlockStore {
    private final OffsetAllocator allocator;
    private final CounterMetrics counters = new CounterMetrics();
    private final MetricsSink extraSink;
    private final LongSupplier clock;
    private final long inflightTtlNanos;
    private final long copyTtlNanos;
    private final Quotas quotas;
    /**
     * What a plan promises ({@link CopyPlan#holdNanos}): its slots stay as they are this long
     * from its issue even if its instance is unregistered. 10 s, or the copy TTL if shorter: a
     * copy takes milliseconds to a second, and the pins of a client that really died are
     * released soon after its session.
     */
    static final long HOLD_NANOS = TimeUnit.SECONDS.toNanos(10);
    private final long holdNanos;
    private final ScheduledExecutorService sweeper;

    private final ReentrantLock lock = new ReentrantLock();
    // --- guarded by lock ---
    private final InstanceRegistry registry = new InstanceRegistry();
    private final LeaseTable leases;
    /** Loads still to refuse at their start (testing: pegaflow-server --inject-load-failures). */
    private final java.util.concurrent.atomic.AtomicInteger injectedLoadFailures = new java.util.concurrent.atomic.AtomicInteger();
    private final LruList lru = new LruList();
    private final Set<Block> inflight = new HashSet<>();
    private long residentBlocks;
    private long residentBytes;
    private boolean closed;
    /** Saves and loads between their plan and endCopy, by plan id. */
    private final Map<Token, OpenCopy> open = new HashMap<>();
    /** Open copies of unregistered instances: no longer endable, held until their hold ends ({@link #unregisterInstance}). */
    private final List<OpenCopy> orphans = new ArrayList<>();
    /** The store clock's time of the next scheduled orphan release (Long.MAX_VALUE: none). */
    private long orphanWakeAt = Long.MAX_VALUE;
    private final SecureRandom ids = new SecureRandom();
    /** Blocks being read back from SSD, over every request. */
    private int prefetchInFlight;
    /** Blocks waiting for a read slot (indexed, pinned, no pool space yet), oldest first. */
    private final java.util.ArrayDeque<Block> fetchQueue = new java.util.ArrayDeque<>();
    private long queuedFetchBytes;
    /** Reads back from SSD ever queued (an operator's warm counts what it started). */
    private long readsQueued;
    private boolean pumping;
    /** Blocks pinned for peers' reads, by pin id, with their deadlines. */
    private final Map<Token, PinnedForPeer> transfers = new HashMap<>();
    /** Blocks the operator pinned. */
    private final AdminPins adminPins;
    /** Blocks stored into and removed from the pool, for routers (pegaflow-server's /admin/events). */
    private final KvEventLog events;
    /** Distinct blocks asked for per window: the hit-rate ceiling (queries' final answers only). */
    private final io.pegaflow.engine.metrics.DistinctBlocks distinct;
    // --- end guarded ---
    /** The SSD tier and the pool bytes it reads from and writes into; set once, before use. */
    private volatile SsdTier ssd;
    private volatile MemorySegment poolMemory;
    /** Other hosts' pools (cross-node sharing); set once, before use. */
    private volatile RemoteTier remote;
    /** Sums sealed blocks ahead of peers' reads; set with {@link #remote}. */
    private volatile BlockChecksums checksums;

    private record PinnedForPeer(Block[] blocks, long deadlineNanos) {}

    /** A store handing out offsets in a pool of {@code capacityBytes}. */
    public LocalStore(EngineConfig config, long capacityBytes) {
        if (config == null) {
            throw new InvalidArgumentException("engine config is null; expected EngineConfig.builder()...build()");
        }
        this.clock = config.nanoClock();
        this.leases = new LeaseTable(config.leaseTtl().toNanos(), this::pinAll, this::unpinAll);
        this.inflightTtlNanos = config.inflightTtl().toNanos();
        this.copyTtlNanos = config.copyTtl().toNanos();
        this.quotas = config.quotas();
        this.holdNanos = Math.min(HOLD_NANOS, copyTtlNanos);
        this.extraSink = config.metrics();
        this.allocator = new OffsetAllocator(capacityBytes);
        this.adminPins = new AdminPins(capacityBytes);
        this.distinct = io.pegaflow.engine.metrics.DistinctBlocks.of(config.hitCeilingWindows());
        this.events = new KvEventLog(config.kvEventCapacity());
        if (extraSink != null) {
            registerGauges(extraSink);
        }
        if (config.sweepInterval().isZero()) {
            this.sweeper = null;
        } else {
            this.sweeper = Executors.newSingleThreadScheduledExecutor(r -> {
                Thread t = new Thread(r, "pegaflow-sweeper");
                t.setDaemon(true);
                return t;
            });
            long every = config.sweepInterval().toNanos();
            sweeper.scheduleWithFixedDelay(this::sweepQuietly, every, every, TimeUnit.NANOSECONDS);
        }
    }

    /**
     * Adds the SSD tier below the pool: every block sealed from now on is offered to it, and
     * a query whose prefix continues on SSD reads those blocks back into the pool (answering
     * "not yet" meanwhile). {@code pool} is the pool's memory as this process maps it (the
     * bytes the store's offsets refer to). The store owns the tier and closes it.
     */
    public SsdTier attachSsd(SsdConfig config, MemorySegment pool) {
        if (config == null || pool == null || pool.byteSize() < allocator.capacityBytes()) {
            throw new InvalidArgumentException("SSD tier " + config + " with pool memory " + pool
                    + "; expected both, the pool at least " + allocator.capacityBytes() + " bytes");
        }
        lock.lock();
        try {
            checkOpen();
            if (ssd != null) {
                throw new InvalidArgumentException("an SSD tier is already attached");
            }
            poolMemory = pool;
            ssd = SsdTier.open(config, this::count); // rebuilds its index from the shard files
            return ssd;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Adds other hosts' pools ({@link RemoteTier}): every block that becomes resident or is
     * evicted from now on is reported to it, and a query that misses locally asks it.
     * {@code pool} is the pool's memory as this process maps it (fetched blocks land there).
     */
    public void attachRemote(RemoteTier tier, MemorySegment pool) {
        if (tier == null || pool == null || pool.byteSize() < allocator.capacityBytes()) {
            throw new InvalidArgumentException("remote tier " + tier + " with pool memory " + pool
                    + "; expected both, the pool at least " + allocator.capacityBytes() + " bytes");
        }
        lock.lock();
        try {
            checkOpen();
            if (remote != null) {
                throw new InvalidArgumentException("a remote tier is already attached");
            }
            if (poolMemory != null && poolMemory.address() != pool.address()) {
                throw new InvalidArgumentException("remote tier pool memory differs from the SSD tier's");
            }
            poolMemory = pool;
            checksums = new BlockChecksums(this::sumAhead);
            remote = tier;
        } finally {
            lock.unlock();
        }
    }

    /** The block events of this store (stored into and removed from the pool, in order). */
    public KvEventLog events() {
        return events;
    }

    /** The hit-rate ceiling's sketch, read on this store's clock ({@link #clockNanos}). */
    public io.pegaflow.engine.metrics.DistinctBlocks distinctBlocks() {
        return distinct;
    }

    /** This store's clock (nanoseconds; a test's fake clock where one is configured). */
    public long clockNanos() {
        return clock.getAsLong();
    }

    /** The attached SSD tier, or null. */
    public SsdTier ssd() {
        return ssd;
    }

    // ---------------------------------------------------------------- registration

    /**
     * Registers an instance. Registering the same spec again is a no-op; the same id with a
     * different spec is a {@link TopologyMismatchException}.
     */
    @Override
    public void registerInstance(InstanceSpec spec) {
        if (spec == null) {
            throw new InvalidArgumentException("instance spec is null");
        }
        spec.validate();
        lock.lock();
        try {
            checkOpen();
            registry.register(spec);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Registers one worker's KV regions. When the last of {@code worldSize} workers arrives,
     * the topology is sealed: layer ids are the ranks of the sorted layer names, every
     * (layer, TP rank) needs exactly one owner (several for MLA layers: replicas sharing one
     * stored copy) with the same geometry across ranks, and the
     * namespace must not already hold a different layout. A rejected worker is not kept.
     */
    @Override
    public void registerWorker(String instanceId, WorkerSpec worker) {
        InstanceRegistry.checkWorker(instanceId, worker);
        lock.lock();
        try {
            checkOpen();
            registry.addWorker(instanceId, worker);
        } finally {
            lock.unlock();
        }
    }

    /** Whether every worker of the instance has registered. */
    @Override
    public boolean isSealed(String instanceId) {
        lock.lock();
        try {
            checkOpen();
            return registry.get(instanceId).sealed();
        } finally {
            lock.unlock();
        }
    }

    /**
     * Removes an instance: its leases are released, and saves and loads it began but did not
     * end can no longer be ended (what the server does when a client's session is lost).
     * Their slots stay as they are until their plan's hold ends ({@link CopyPlan#holdNanos}:
     * 10 s from issue, or the copy TTL if shorter), then they are rolled back: a copier whose
     * session was lost may still be moving bytes, so no other save reuses a slot under a copy
     * that ends within the hold, and a load that finished within it read what it was promised
     * (a save still copying after it may write into reused slots, as it could before holds at
     * once). Cached blocks stay for other instances of the namespace.
     */
    @Override
    public void unregisterInstance(String instanceId) {
        lock.lock();
        try {
            checkOpen();
            Instance inst = registry.remove(instanceId);
            leases.removeAll(inst);
            long first = Long.MAX_VALUE;
            for (Iterator<OpenCopy> it = open.values().iterator(); it.hasNext(); ) {
                OpenCopy op = it.next();
                if (op.instance() == inst) {
                    it.remove();
                    inst.openCopies--;
                    orphans.add(op);
                    first = Math.min(first, heldUntil(op) - clock.getAsLong());
                }
            }
            if (first != Long.MAX_VALUE) {
                wakeForOrphans(first); // released when their hold ends, not at the next periodic sweep (up to 30 s later)
            }
        } finally {
            lock.unlock();
        }
    }

    /** When an open copy's hold ends: its issue plus {@link #holdNanos}. */
    private long heldUntil(OpenCopy op) {
        return op.deadlineNanos() - copyTtlNanos + holdNanos;
    }

    /**
     * Under lock: has the sweeper thread release orphans in {@code delay} ns, unless a wake-up
     * at that time or earlier is already due (one chain of wake-ups, whatever the unregisters).
     */
    private void wakeForOrphans(long delay) {
        long at = clock.getAsLong() + Math.max(0, delay);
        if (sweeper == null || (orphanWakeAt != Long.MAX_VALUE && orphanWakeAt - at <= 0)) {
            return; // no sweeper thread (sweep() releases them), or woken in time already
        }
        orphanWakeAt = at;
        try {
            sweeper.schedule(this::releaseOrphansQuietly, Math.max(0, delay) + 1, TimeUnit.NANOSECONDS);
        } catch (java.util.concurrent.RejectedExecutionException e) {
            // closing: close() drops them
        }
    }

    /** The scheduled release: rolls back what is due, and comes back for the next one. */
    private void releaseOrphansQuietly() {
        lock.lock();
        try {
            if (closed) {
                return;
            }
            orphanWakeAt = Long.MAX_VALUE;
            long next = releaseOrphans(clock.getAsLong());
            if (next != Long.MAX_VALUE) {
                wakeForOrphans(next);
            }
        } catch (RuntimeException e) {
            System.getLogger(LocalStore.class.getName()).log(System.Logger.Level.WARNING,
                    "releasing the open copies of unregistered instances failed", e);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Rolls back the open copies of unregistered instances whose hold has ended; the
     * nanoseconds until the next one's ends ({@code Long.MAX_VALUE}: none left).
     */
    private long releaseOrphans(long now) {
        long next = Long.MAX_VALUE;
        for (Iterator<OpenCopy> it = orphans.iterator(); it.hasNext(); ) {
            OpenCopy op = it.next();
            long left = heldUntil(op) - now;
            if (left <= 0) {
                it.remove();
                abort(op);
            } else {
                next = Math.min(next, left);
            }
        }
        return next;
    }

    // ---------------------------------------------------------------- save

    /**
     * Plans a save of the worker's slots of {@code blockIds[i]} under {@code hashes[i]} for the
     * named layers ({@code null}: all of the worker's layers). Blocks already resident, and
     * slots already saved or being saved, are skipped. Pool space is allocated now, evicting
     * least recently used unreferenced blocks if needed, and the claimed slots stay invisible
     * until {@link #endCopy}.
     *
     * @throws PoolExhaustedException when the pool cannot hold the new slots even after
     *     evicting every unreferenced block; nothing was allocated
     */
    @Override
    public CopyPlan reserveSave(String instanceId, int workerRank, List<String> layerNames, long[] blockIds,
            BlockHashes hashes) {
        if (blockIds == null || hashes == null) {
            throw new InvalidArgumentException("save: blockIds and hashes must not be null");
        }
        if (blockIds.length != hashes.count()) {
            throw new InvalidArgumentException("save: " + blockIds.length + " block ids but " + hashes.count()
                    + " hashes; expected equal counts");
        }
        List<PlannedBlock> planned = new ArrayList<>();
        lock.lock();
        try {
            checkOpen();
            Instance inst = registry.sealed(instanceId);
            Instance.Worker worker = InstanceRegistry.worker(inst, workerRank);
            int[] regionIdx = worker.selectRegions(inst.spec.instanceId(), layerNames);
            Limits.checkPlan("save", blockIds.length, regionIdx.length);
            checkBlockIds(worker, regionIdx, blockIds, "blockIds");
            quotas.checkCopy(inst, "a save", open.size());
            planSave(inst, worker, regionIdx, blockIds, hashes, planned);
            int skipped = hashes.count() - planned.size();
            count(Counter.SAVE_REQUESTS, 1);
            count(Counter.SAVE_SKIPPED_BLOCKS, skipped);
            if (planned.isEmpty()) {
                return CopyPlan.nothing(skipped);
            }
            Token id = newCopyId();
            Reservation reservation = new Reservation(inst, worker, planned, clock.getAsLong() + copyTtlNanos);
            opened(id, reservation);
            return reservation.plan(id, skipped, holdNanos);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Block ids against the smallest of the selected regions ({@code null}: all of the
     * worker's): one pass over the ids, whatever the layer count; the message names that region.
     */
    private static void checkBlockIds(Instance.Worker worker, int[] regionIdx, long[] ids, String what) {
        LayerRegion smallest = null;
        int n = regionIdx == null ? worker.regions.length : regionIdx.length;
        for (int k = 0; k < n; k++) {
            LayerRegion r = worker.regions[regionIdx == null ? k : regionIdx[k]];
            if (smallest == null || r.numBlocks() < smallest.numBlocks()) {
                smallest = r;
            }
        }
        if (smallest != null) {
            smallest.checkBlockIds(ids, what);
        }
    }

    /**
     * Under lock: decides what to write, checks capacity, then allocates and claims slots. The
     * per-region facts (slot, bytes) come from the worker (computed when it was sealed); a block none of whose
     * selected slots exist yet (the usual case) shares the call's region list; a hash repeated
     * in the call is planned once (its later copies count as skipped).
     */
    private void planSave(Instance inst, Instance.Worker worker, int[] regionIdx, long[] blockIds, BlockHashes hashes,
            List<PlannedBlock> plans) {
        NamespaceIndex ns = inst.ns;
        int[] slotOf = worker.slots;
        long[] slotBytesOf = worker.slotBytes;
        long allBytes = 0;
        for (int r : regionIdx) {
            allBytes += slotBytesOf[r];
        }
        Set<HashKey> seen = new HashSet<>();
        long needed = 0;
        byte[] packed = hashes.packed();
        int len = hashes.hashLen();
        for (int i = 0; i < hashes.count(); i++) {
            Block b = ns.blocks.get(packed, i * len, len);
            if (b != null && b.sealed) {
                continue;
            }
            HashKey key = b == null ? HashKey.of(hashes, i) : b.key;
            if (!seen.add(key)) {
                continue; // repeated in this call: its first copy is planned
            }
            int[] todo = regionIdx;
            long bytes = allBytes;
            if (b != null) {
                int[] some = new int[regionIdx.length];
                int n = 0;
                bytes = 0;
                for (int r : regionIdx) {
                    if (b.slotState[slotOf[r]] == Block.EMPTY) {
                        some[n++] = r;
                        bytes += slotBytesOf[r];
                    }
                }
                if (n == 0) {
                    continue;
                }
                todo = n == some.length ? regionIdx : Arrays.copyOf(some, n);
            }
            plans.add(new PlannedBlock(i, key, b, todo, bytes));
            needed += allocatedBytes(bytes);
        }
        if (needed > allocator.freeBytes() + lru.evictableBytes()) {
            count(Counter.POOL_ALLOC_FAILURES, 1);
            plans.clear();
            throw new PoolExhaustedException("host pool exhausted: saving needs " + Sizes.format(needed)
                    + " but the pool (" + Sizes.format(allocator.capacityBytes()) + ") has " + Sizes.format(allocator.freeBytes())
                    + " free and " + Sizes.format(lru.evictableBytes()) + " evictable; " + lru.pinnedBlocks()
                    + " blocks are pinned by leases or loads and " + inflight.size() + " blocks are being assembled");
        }
        long now = clock.getAsLong();
        for (int p = 0; p < plans.size(); p++) {
            PlannedBlock plan = plans.get(p);
            long handle;
            while ((handle = allocator.allocate(plan.bytes)) == OffsetAllocator.NO_SPACE) {
                if (!evictOne()) {
                    rollbackSave(worker, plans.subList(0, p));
                    count(Counter.POOL_ALLOC_FAILURES, 1);
                    plans.clear();
                    throw new PoolExhaustedException("host pool exhausted: no free range of " + Sizes.format(plan.bytes)
                            + " after evicting every unreferenced block (" + Sizes.format(allocator.freeBytes())
                            + " free in fragments)");
                }
            }
            plan.allocation = handle;
            Block b = plan.block;
            if (b == null) {
                // A hash repeated in this call was filtered above, so the key is still absent.
                b = new Block(ns, plan.key, now);
                ns.blocks.put(b);
                inflight.add(b);
                plan.block = b;
            }
            b.addAllocation(handle, allocator.sizeBytes(handle));
            long offset = allocator.offsetBytes(handle);
            byte[] state = b.slotState;
            long[] slotOffset = b.slotOffset;
            for (int r : plan.regions) {
                int slot = slotOf[r];
                state[slot] = Block.WRITING;
                slotOffset[slot] = offset;
                offset += slotBytesOf[r];
            }
            lru.pin(b);
        }
    }

    /** Under lock: undoes the allocations and slot claims of a save that did not happen. */
    private void rollbackSave(Instance.Worker worker, List<PlannedBlock> done) {
        for (PlannedBlock plan : done) {
            Block b = plan.block;
            for (int r : plan.regions) {
                int slot = worker.slots[r];
                b.slotState[slot] = Block.EMPTY;
                b.slotOffset[slot] = -1;
            }
            allocator.free(plan.allocation);
            b.removeAllocation(plan.allocation);
            unpin(b);
        }
    }

    /** Under lock: fills (ok) or releases the slots of a reservation. */
    private void commitLocked(Instance inst, Instance.Worker worker, List<PlannedBlock> plans, boolean ok) {
        if (!ok) {
            rollbackSave(worker, plans);
            return;
        }
        long now = clock.getAsLong();
        for (PlannedBlock plan : plans) {
            Block b = plan.block;
            for (int r : plan.regions) {
                b.slotState[worker.slots[r]] = Block.FILLED;
                b.filled++;
            }
            b.touchedNanos = now;
            if (b.complete() && !b.sealed) {
                b.sealed = true;
                inflight.remove(b);
                residentBlocks++;
                residentBytes += b.bytes;
                lru.addPinned(); // the save's own reference; unpin below may make it evictable
                count(Counter.BLOCKS_SEALED, 1);
                events.append(KvEventLog.Kind.STORED, KvEventLog.CPU, b.ns.namespace, b.key.bytes());
                offerToSsd(b);
                advertise(b);
            }
            unpin(b);
        }
    }

    // ---------------------------------------------------------------- query

    /** See {@link BlockStore#flush}: the remote tier's queue of advertisements, sent (not under the lock). */
    @Override
    public void flush() {
        RemoteTier r = remote;
        if (r == null) {
            return;
        }
        try {
            r.flush();
        } catch (java.util.concurrent.TimeoutException e) {
            throw new PegaflowException(ErrorCode.TIMEOUT, "flush: the cluster registry did not confirm in time: " + e.getMessage(), e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new PegaflowException(ErrorCode.UNAVAILABLE, "flush interrupted", e);
        } catch (PegaflowException e) {
            throw e;
        } catch (Exception e) {
            throw new PegaflowException(ErrorCode.UNAVAILABLE, "flush: the cluster registry is unavailable: " + e, e);
        }
    }

    /**
     * Finds the longest prefix of {@code hashes} whose blocks are all resident (sealed) and
     * returns its length with a lease that pins those blocks until every worker loaded them,
     * the lease is released, or it expires. Refreshes the blocks' recency. Reads the packed
     * hashes in place: no per-hash arrays.
     */
    @Override
    public QueryResult query(String instanceId, BlockHashes hashes) {
        if (hashes == null) {
            throw new InvalidArgumentException("query: hashes must not be null");
        }
        int count = hashes.count();
        Token leaseId = null;
        int hit;
        String answered = null; // the namespace of a final answer (not "not yet"), for the hit-rate ceiling
        lock.lock();
        try {
            checkOpen();
            Instance inst = registry.sealed(instanceId);
            long now = clock.getAsLong();
            expireLeases(now);
            if (count > 0) {
                quotas.checkLease(inst, count, leases.size(), leases.leasedBlocks()); // before anything is planned
            }
            Block[] found = new Block[count];
            hit = inst.ns.blocks.sealedPrefix(hashes.packed(), hashes.hashLen(), count, found);
            if ((ssd != null || remote != null) && hit < count) {
                // The resident prefix is pinned while reads are planned (they may evict), and
                // unpinning makes it the newest: the read-back evicts older blocks first.
                for (int i = 0; i < hit; i++) {
                    lru.pin(found[i]);
                }
                int pending;
                try {
                    pending = prefetch(inst.ns, hashes, hit, now);
                } finally {
                    for (int i = 0; i < hit; i++) {
                        lru.unpin(found[i]);
                    }
                }
                if (pending == 0 && remote != null
                        && inst.ns.blocks.get(hashes.packed(), hit * hashes.hashLen(), hashes.hashLen()) == null
                        && remote.missed(inst.ns.namespace, hashes, hit)) {
                    pending = count - hit; // a lookup or fetch is under way; its run is not known yet
                }
                if (pending > 0) {
                    count(Counter.QUERY_REQUESTS, 1);
                    count(Counter.SSD_PENDING_ANSWERS, 1);
                    return new QueryResult(hit, null, pending);
                }
            }
            int fromSsd = 0;
            int fromPeer = 0;
            for (int i = 0; i < hit; i++) {
                if (found[i].fromSsd) {
                    found[i].fromSsd = false;
                    fromSsd++;
                } else if (found[i].fromPeer) {
                    found[i].fromPeer = false;
                    fromPeer++;
                }
            }
            count(Counter.TIER_SSD_BLOCKS, fromSsd);
            count(Counter.TIER_PEER_BLOCKS, fromPeer);
            count(Counter.TIER_DRAM_BLOCKS, hit - fromSsd - fromPeer);
            count(Counter.TIER_MISS_BLOCKS, count - hit);
            if (hit > 0) {
                leaseId = leases.issue(inst, hit == found.length ? found : Arrays.copyOf(found, hit), now);
            }
            count(Counter.QUERY_REQUESTS, 1);
            count(Counter.HIT_BLOCKS, hit);
            count(Counter.MISS_BLOCKS, count - hit);
            if (hit > 0) {
                count(Counter.LEASES_CREATED, 1);
            }
            answered = inst.ns.namespace;
        } finally {
            lock.unlock();
        }
        if (answered != null) {
            distinct.observe(answered, hashes, clock.getAsLong()); // outside the store's lock: the sketch has its own
        }
        return new QueryResult(hit, leaseId);
    }

    /** Drops a lease and all its remaining shares. */
    @Override
    public void release(String instanceId, Token leaseId) {
        if (leaseId == null) {
            throw new InvalidArgumentException("release: lease is null");
        }
        lock.lock();
        try {
            checkOpen();
            expireLeases(clock.getAsLong());
            checkOwner(leases.get(leaseId).instance, instanceId, "lease " + leaseId);
            leases.remove(leaseId);
        } finally {
            lock.unlock();
        }
    }

    // ---------------------------------------------------------------- load

    /**
     * Consumes this worker's share of a lease, pins the leased blocks until {@link #endCopy},
     * and returns where each of the worker's slots is: triples (lease index = index into
     * {@code dstBlockIds}, region index, pool offset).
     */
    @Override
    public CopyPlan beginLoad(String instanceId, int workerRank, Token leaseId, long[] dstBlockIds) {
        return beginLoad(instanceId, workerRank, leaseId, dstBlockIds, Integer.MAX_VALUE);
    }

    /**
     * Testing: the next {@code n} loads fail at their start as a failed copy does (their blocks
     * reported to the caller, nothing else changed), so a client's recovery can be exercised
     * against a real store. 0 turns it off.
     */
    public void injectLoadFailures(int n) {
        if (n < 0) {
            throw new InvalidArgumentException("injected load failures " + n + "; expected >= 0");
        }
        injectedLoadFailures.set(n);
    }

    @Override
    public CopyPlan beginLoad(String instanceId, int workerRank, Token leaseId, long[] dstBlockIds, int planBlocks) {
        if (planBlocks < 1) {
            throw new InvalidArgumentException("load: plan_blocks " + planBlocks + "; expected >= 1 (or 0 on the wire: all)");
        }
        if (leaseId == null || dstBlockIds == null) {
            throw new InvalidArgumentException("load: lease and dstBlockIds must not be null");
        }
        if (injectedLoadFailures.getAndUpdate(n -> Math.max(0, n - 1)) > 0) {
            count(Counter.LOAD_FAULTS_INJECTED, 1);
            throw new TransferFailedException("load of lease " + leaseId + " refused: a fault injected for testing "
                    + "(--inject-load-failures)", dstBlockIds, null);
        }
        lock.lock();
        try {
            checkOpen();
            Instance inst = registry.sealed(instanceId);
            Instance.Worker worker = InstanceRegistry.worker(inst, workerRank);
            expireLeases(clock.getAsLong());
            Lease lease = leases.get(leaseId);
            checkOwner(lease.instance, instanceId, "lease " + leaseId);
            if (lease.consumedBy.get(workerRank)) {
                throw new InvalidArgumentException("worker " + workerRank + " already consumed its share of lease " + leaseId);
            }
            if (dstBlockIds.length != lease.blocks.length) {
                throw new InvalidArgumentException("load of lease " + leaseId + ": " + dstBlockIds.length
                        + " destination block ids for " + lease.blocks.length + " leased blocks; expected equal counts");
            }
            Limits.checkPlan("load", dstBlockIds.length, worker.regions.length);
            checkBlockIds(worker, null, dstBlockIds, "dstBlockIds");
            quotas.checkCopy(lease.instance, "a load", open.size());
            Block[] blocks = lease.blocks;
            lease.consumedBy.set(workerRank);
            pinAll(blocks);
            if (lease.fullyConsumed()) {
                leases.remove(leaseId);
            }
            count(Counter.LOAD_REQUESTS, 1);
            Token id = newCopyId();
            OpenLoad load = new OpenLoad(inst, worker, blocks, clock.getAsLong() + copyTtlNanos);
            opened(id, load);
            return load.plan(id, 0, Math.min(planBlocks, blocks.length), holdNanos);
        } finally {
            lock.unlock();
        }
    }

    /**
     * The runs of an open load for its leased blocks {@code fromBlock .. toBlock - 1}: the rest
     * of a plan that {@link #beginLoad(String, int, Token, long[], int)} handed out in part, so
     * the copy of the first part overlaps planning the rest. Only the instance and worker the
     * load was issued to may ask; the load is still ended once, by {@link #endCopy}.
     */
    @Override
    public CopyPlan planRest(String instanceId, int workerRank, Token planId, int fromBlock, int toBlock) {
        if (planId == null) {
            throw new InvalidArgumentException("plan rest: the copy id is null");
        }
        lock.lock();
        try {
            checkOpen();
            OpenCopy op = open.get(planId);
            if (!(op instanceof OpenLoad load)) {
                throw new InvalidArgumentException("copy " + planId + " is not an open load: already ended, rolled back,"
                        + " expired, a save, or its instance was unregistered");
            }
            checkOwner(op.instance(), instanceId, "copy " + planId);
            if (load.worker().spec.workerRank() != workerRank) {
                throw new PermissionDeniedException("load " + planId + " was begun by worker " + load.worker().spec.workerRank()
                        + ", not " + workerRank);
            }
            if (fromBlock < 0 || fromBlock > toBlock || toBlock > load.blocks().length) {
                throw new InvalidArgumentException("plan of load " + planId + " for blocks " + fromBlock + " .. " + toBlock
                        + "; expected 0 <= from <= to <= " + load.blocks().length);
            }
            return load.plan(planId, fromBlock, toBlock, Math.max(0, heldUntil(load) - clock.getAsLong()));
        } finally {
            lock.unlock();
        }
    }

    /**
     * Ends an open save or load. A save with {@code ok} fills its claimed slots, and blocks
     * whose last slot this was become visible; otherwise its slots are released and their
     * space freed. A load unpins its blocks. {@code bytes} and {@code nanos} describe the
     * copy, for metrics. Only the instance the plan was issued to may end it
     * ({@link PermissionDeniedException} otherwise, and nothing changes).
     */
    @Override
    public CopyResult endCopy(String instanceId, Token planId, boolean ok, long bytes, long nanos) {
        if (planId == null || bytes < 0 || nanos < 0) {
            throw new InvalidArgumentException("end of copy " + planId + ": bytes " + bytes + ", nanos " + nanos
                    + "; expected a copy id and bytes, nanos >= 0");
        }
        lock.lock();
        try {
            checkOpen();
            OpenCopy op = open.get(planId);
            if (op == null) {
                throw new InvalidArgumentException("copy " + planId
                        + " is unknown: already ended, rolled back, expired, or its instance was unregistered");
            }
            checkOwner(op.instance(), instanceId, "copy " + planId);
            open.remove(planId);
            op.instance().openCopies--;
            boolean save = op instanceof Reservation;
            int blocks;
            switch (op) {
                case Reservation r -> {
                    commitLocked(r.instance(), r.worker(), r.blocks(), ok);
                    blocks = r.blocks().size();
                }
                case OpenLoad l -> {
                    unpinAll(l.blocks());
                    blocks = l.blocks().length;
                }
            }
            if (ok) {
                count(save ? Counter.SAVE_BLOCKS : Counter.LOAD_BLOCKS, blocks);
                count(save ? Counter.SAVE_BYTES : Counter.LOAD_BYTES, bytes);
                count(save ? Counter.SAVE_NANOS : Counter.LOAD_NANOS, nanos);
            } else {
                count(save ? Counter.SAVE_FAILURES : Counter.LOAD_FAILURES, 1);
            }
            return new CopyResult(ok ? blocks : 0, 0, ok ? bytes : 0);
        } finally {
            lock.unlock();
        }
    }

    // ---------------------------------------------------------------- SSD tier (under lock unless said)

    /** Offers a block just sealed to the SSD tier (never blocks; the tier counts what it drops). */
    private void offerToSsd(Block b) {
        SsdTier tier = ssd;
        if (tier == null) {
            return;
        }
        NamespaceIndex ns = b.ns;
        tier.offer(ns.namespace, b.key.bytes(), ns.slotBytes, dst -> fillFromPool(b, dst));
    }

    /**
     * On an SSD writer thread: copies a sealed block's slots, in slot order, into {@code dst},
     * pinning the block for the copy. False when it was evicted before its turn came.
     */
    private boolean fillFromPool(Block b, MemorySegment dst) {
        long[] offsets;
        lock.lock();
        try {
            if (closed || b.removed || !b.sealed) {
                return false;
            }
            lru.pin(b);
            offsets = b.slotOffset.clone();
        } finally {
            lock.unlock();
        }
        try {
            long[] sizes = b.ns.slotBytes;
            long at = 0;
            for (int s = 0; s < sizes.length; s++) {
                MemorySegment.copy(poolMemory, offsets[s], dst, at, sizes[s]);
                at += sizes[s];
            }
            return true;
        } finally {
            lock.lock();
            try {
                if (!closed) {
                    unpin(b);
                }
            } finally {
                lock.unlock();
            }
        }
    }

    /**
     * The run of blocks after the resident prefix ({@code from}) that continues on SSD or is
     * being read back: queues reads for what is on SSD (while the pool has unpinned space
     * for them), starts as many as the prefetch budget allows, and returns the run's length
     * when any of it is still being read, else 0 (answer with the resident prefix). Prefix
     * and run together are capped at half the pool, so reading the run's end cannot evict
     * its start. A queued block is indexed as in flight, so later polls only walk the run.
     */
    private int prefetch(NamespaceIndex ns, BlockHashes hashes, int from, long now) {
        SsdTier tier = ssd;
        byte[] packed = hashes.packed();
        int len = hashes.hashLen();
        long cap = allocator.capacityBytes() / 2 / Math.max(1, ns.blockBytes) - from;
        long need = allocatedBytes(ns.blockBytes);
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
            if (tier == null) {
                break; // no SSD tier: only blocks fetched from peers are waited for
            }
            if (allocator.freeBytes() + lru.evictableBytes() - queuedFetchBytes < need) {
                count(Counter.SSD_PREFETCH_NO_SPACE, 1);
                break; // the rest would only evict what this answer needs
            }
            if (!tier.contains(ns.namespace, packed, i * len, len)) {
                break;
            }
            b = new Block(ns, HashKey.of(hashes, i), now);
            ns.blocks.put(b);
            inflight.add(b);
            lru.pin(b);
            b.prefetching = true;
            fetchQueue.add(b);
            readsQueued++;
            queuedFetchBytes += need;
            waiting = true;
            run++;
        }
        if (tier != null) {
            pumpFetches();
        }
        return waiting ? run : 0;
    }

    /** Starts queued reads while the prefetch budget allows. */
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
        SsdTier tier = ssd;
        int max = tier.config().maxPrefetchBlocks();
        while (prefetchInFlight < max && !fetchQueue.isEmpty()) {
            Block b = fetchQueue.poll();
            NamespaceIndex ns = b.ns;
            queuedFetchBytes -= allocatedBytes(ns.blockBytes);
            long bytes = ns.blockBytes;
            long handle;
            while ((handle = allocator.allocate(bytes)) == OffsetAllocator.NO_SPACE) {
                if (!evictOne()) {
                    break;
                }
            }
            if (handle == OffsetAllocator.NO_SPACE) {
                count(Counter.SSD_PREFETCH_NO_SPACE, 1);
                b.prefetching = false;
                unpin(b); // never allocated: unpin drops it from the index
                continue;
            }
            b.addAllocation(handle, allocator.sizeBytes(handle));
            long offset = allocator.offsetBytes(handle);
            long at = offset;
            for (int s = 0; s < ns.slotBytes.length; s++) {
                b.slotState[s] = Block.WRITING;
                b.slotOffset[s] = at;
                at += ns.slotBytes[s];
            }
            prefetchInFlight++;
            count(Counter.SSD_PREFETCH_BLOCKS, 1);
            final long h = handle;
            tier.read(ns.namespace, b.key.bytes(), ns.slotBytes, poolMemory.asSlice(offset, bytes),
                    outcome -> prefetchDone(b, h, outcome));
        }
    }

    /** On an SSD reader thread: seals a block read back and checked, or drops its reservation. */
    private void prefetchDone(Block b, long handle, SsdTier.ReadOutcome outcome) {
        lock.lock();
        try {
            if (closed) {
                return;
            }
            prefetchInFlight--;
            boolean ok = outcome == SsdTier.ReadOutcome.OK;
            if (!ok) {
                count(Counter.SSD_PREFETCH_FAILURES, 1);
            }
            b.fromSsd = ok;
            endRead(b, handle, ok, clock.getAsLong());
            pumpFetches();
        } finally {
            lock.unlock();
        }
    }

    // ---------------------------------------------------------------- other hosts (cross-node sharing)

    /**
     * Under lock: reports a block that just became resident to the remote tier, and queues it to
     * be summed ahead of peers' reads unless its checksum is known (checked on arrival).
     */
    private void advertise(Block b) {
        RemoteTier r = remote;
        if (r != null) {
            r.resident(b.ns.namespace, b.key.bytes());
            if (b.crc == BlockChecksum.UNKNOWN && !checksums.offer(b)) {
                count(Counter.BLOCK_CHECKSUMS_DEFERRED, 1);
            }
        }
    }

    /**
     * On the background thread of {@link BlockChecksums}: sums a sealed block's slots outside
     * the lock and keeps the sum with it, unless it left the pool meanwhile (evicted: its space
     * may hold other bytes by now). A sealed block's slots and bytes never change while it stays,
     * and a Block is never reused once removed, so "still there" is the whole check.
     */
    private void sumAhead(Block b) {
        lock.lock();
        try {
            if (closed || b.removed || !b.sealed || b.crc != BlockChecksum.UNKNOWN) {
                return;
            }
        } finally {
            lock.unlock();
        }
        int crc = BlockChecksum.of(poolMemory, b.slotOffset, b.ns.slotBytes);
        lock.lock();
        try {
            if (!closed && !b.removed) {
                b.crc = Integer.toUnsignedLong(crc);
                count(Counter.BLOCK_CHECKSUMS_AHEAD, 1);
            }
        } finally {
            lock.unlock();
        }
    }

    /**
     * Peer side: pins the resident prefix of {@code hashes} in {@code namespace} for a peer to
     * read, until {@link #releaseTransfer} or {@code ttl}, whichever is first. Null when the
     * namespace is unknown here or its first block is not resident.
     */
    public TransferPin pinForTransfer(String namespace, BlockHashes hashes, java.time.Duration ttl) {
        if (namespace == null || hashes == null || ttl == null || ttl.isNegative() || ttl.isZero()) {
            throw new InvalidArgumentException("pinForTransfer(" + namespace + ", " + hashes + ", " + ttl
                    + "); expected a namespace, hashes and a positive deadline");
        }
        lock.lock();
        try {
            checkOpen();
            NamespaceIndex ns = registry.namespace(namespace);
            if (ns == null) {
                return null;
            }
            Block[] found = new Block[hashes.count()];
            int hit = ns.blocks.sealedPrefix(hashes.packed(), hashes.hashLen(), hashes.count(), found);
            if (hit == 0) {
                return null;
            }
            Block[] pinned = Arrays.copyOf(found, hit);
            List<long[]> offsets = new ArrayList<>(hit);
            long[] sums = new long[hit];
            for (int i = 0; i < hit; i++) {
                Block b = pinned[i];
                lru.pin(b);
                offsets.add(b.slotOffset.clone());
                sums[i] = b.crc;
            }
            Token id;
            do {
                id = Token.random(ids);
            } while (transfers.containsKey(id) || open.containsKey(id));
            transfers.put(id, new PinnedForPeer(pinned, clock.getAsLong() + ttl.toNanos()));
            return new TransferPin(id, ns.slotBytes.clone(), offsets, sums);
        } finally {
            lock.unlock();
        }
    }

    /** Peer side: ends a pin; false when it is unknown (already released or expired). */
    public boolean releaseTransfer(Token id) {
        if (id == null) {
            return false;
        }
        lock.lock();
        try {
            if (closed) {
                return false;
            }
            PinnedForPeer p = transfers.remove(id);
            if (p == null) {
                return false;
            }
            unpinAll(p.blocks());
            return true;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Whether pin {@code id} still holds its blocks, before its deadline. An owner asks before
     * each batch it sends: a pin that expired mid-read (its blocks may be evicted and their space
     * reused) ends the read instead of sending what the space holds by then.
     */
    public boolean transferLive(Token id) {
        lock.lock();
        try {
            PinnedForPeer p = closed || id == null ? null : transfers.get(id);
            return p != null && p.deadlineNanos() - clock.getAsLong() > 0;
        } finally {
            lock.unlock();
        }
    }

    /** Pins held for peers' reads now. */
    public int transferPins() {
        lock.lock();
        try {
            return transfers.size();
        } finally {
            lock.unlock();
        }
    }

    /**
     * Fetching side: reserves pool space for a run of blocks a peer holds, in order, stopping
     * at the first one there is no unpinned space for (prefix and run capped at half the pool,
     * as a read back from SSD is). Reserved blocks are indexed as being fetched: queries for
     * them answer "not yet" until {@link #completeFetch}. Null when the namespace is unknown,
     * the peer's slot sizes differ from it, or nothing fits.
     */
    public FetchReservation reserveFetch(String namespace, BlockHashes run, int alreadyHit, long[] slotBytes) {
        if (namespace == null || run == null || slotBytes == null) {
            throw new InvalidArgumentException("reserveFetch(" + namespace + ", " + run + "); expected a namespace and hashes");
        }
        lock.lock();
        try {
            checkOpen();
            NamespaceIndex ns = registry.namespace(namespace);
            if (ns == null) {
                return null;
            }
            if (!Arrays.equals(ns.slotBytes, slotBytes)) {
                count(Counter.PEER_FETCH_GEOMETRY_MISMATCH, 1);
                return null;
            }
            long cap = Math.max(0, allocator.capacityBytes() / 2 / Math.max(1, ns.blockBytes) - alreadyHit);
            int n = (int) Math.min(run.count(), cap);
            Block[] blocks = new Block[n];
            long[] handles = new long[n];
            MemorySegment[] dst = new MemorySegment[n];
            long now = clock.getAsLong();
            byte[] packed = run.packed();
            int len = run.hashLen();
            int got = 0;
            for (int i = 0; i < n; i++, got++) {
                if (ns.blocks.get(packed, i * len, len) != null) {
                    continue; // resident, read back or being saved here: not fetched
                }
                long handle;
                while ((handle = allocator.allocate(ns.blockBytes)) == OffsetAllocator.NO_SPACE) {
                    if (!evictOne()) {
                        break;
                    }
                }
                if (handle == OffsetAllocator.NO_SPACE) {
                    break;
                }
                Block b = new Block(ns, HashKey.of(run, i), now);
                b.addAllocation(handle, allocator.sizeBytes(handle));
                long at = allocator.offsetBytes(handle);
                dst[i] = poolMemory.asSlice(at, ns.blockBytes);
                for (int sl = 0; sl < ns.slotBytes.length; sl++) {
                    b.slotState[sl] = Block.WRITING;
                    b.slotOffset[sl] = at;
                    at += ns.slotBytes[sl];
                }
                ns.blocks.put(b);
                inflight.add(b);
                lru.pin(b);
                b.prefetching = true;
                blocks[i] = b;
                handles[i] = handle;
            }
            if (got == 0) {
                return null;
            }
            return new FetchReservation(Arrays.copyOf(blocks, got), Arrays.copyOf(handles, got), Arrays.copyOf(dst, got));
        } finally {
            lock.unlock();
        }
    }

    /**
     * Fetching side: seals the reserved blocks whose bytes arrived and were checked
     * ({@code ok[i]}), and drops the others' reservations. Sealed blocks are served like
     * local ones and advertised.
     */
    public void completeFetch(FetchReservation r, boolean[] ok) {
        if (r == null || ok == null || ok.length != r.length()) {
            throw new InvalidArgumentException("completeFetch: " + (ok == null ? "null" : ok.length) + " outcomes for a reservation of "
                    + (r == null ? "null" : r.length()) + "; expected one per reserved block");
        }
        lock.lock();
        try {
            if (closed || r.completed) {
                return;
            }
            r.completed = true;
            long now = clock.getAsLong();
            for (int i = 0; i < r.length(); i++) {
                Block b = r.blocks[i];
                if (b == null) {
                    continue;
                }
                b.fromPeer = ok[i];
                if (ok[i]) {
                    b.crc = r.checksum(i); // checked on arrival: not summed again
                }
                endRead(b, r.handles[i], ok[i], now);
            }
        } finally {
            lock.unlock();
        }
    }

    /**
     * Under lock: ends a read back from SSD or a fetch from a peer into {@code b}'s reserved
     * allocation {@code handle}: seals the block (resident, advertised) when its bytes arrived
     * and were checked, else releases the allocation; then drops the read's pin (an empty
     * block leaves the index with it).
     */
    private void endRead(Block b, long handle, boolean ok, long now) {
        b.prefetching = false;
        if (ok) {
            Arrays.fill(b.slotState, Block.FILLED);
            b.filled = b.slotState.length;
            b.sealed = true;
            b.touchedNanos = now;
            inflight.remove(b);
            residentBlocks++;
            residentBytes += b.bytes;
            lru.addPinned();
            events.append(KvEventLog.Kind.STORED, KvEventLog.CPU, b.ns.namespace, b.key.bytes()); // read back into the pool
            advertise(b);
        } else {
            Arrays.fill(b.slotState, Block.EMPTY);
            Arrays.fill(b.slotOffset, -1L);
            allocator.free(handle);
            b.removeAllocation(handle);
        }
        unpin(b);
    }

    /**
     * Calls {@code each} with every resident block's namespace and hash (copied under the
     * lock, called outside it): a registry that lost its entries advertises them again.
     */
    public void forEachResident(java.util.function.BiConsumer<String, byte[]> each) {
        List<String> names = new ArrayList<>();
        List<byte[]> keys = new ArrayList<>();
        lock.lock();
        try {
            checkOpen();
            for (NamespaceIndex ns : registry.namespaces()) {
                for (Block b : ns.blocks.values()) {
                    if (b.sealed) {
                        names.add(ns.namespace);
                        keys.add(b.key.bytes());
                    }
                }
            }
        } finally {
            lock.unlock();
        }
        for (int i = 0; i < keys.size(); i++) {
            each.accept(names.get(i), keys.get(i));
        }
    }

    /** Under lock: releases pins whose reader neither released them nor finished in time. */
    private void expireTransfers(long now) {
        for (Iterator<PinnedForPeer> it = transfers.values().iterator(); it.hasNext(); ) {
            PinnedForPeer p = it.next();
            if (p.deadlineNanos() - now <= 0) {
                it.remove();
                unpinAll(p.blocks());
                count(Counter.TRANSFER_PINS_EXPIRED, p.blocks().length);
            }
        }
    }

    // ---------------------------------------------------------------- the operator's calls (pegaflow-server's /admin)

    /** What {@link #clear} did: resident blocks dropped and their bytes, blocks kept because a lease or copy holds them, pins released, SSD records forgotten. */
    public record Cleared(long blocks, long bytes, long referenced, long unpinned, long ssdRecords) {}

    /**
     * Drops the resident blocks of {@code namespace} (null: every namespace) that no lease,
     * load or save holds, releasing the operator's pins on them first ({@code dram}), and
     * forgets the namespace's SSD records ({@code ssd}; {@link SsdTier#forget}). Blocks in use
     * stay and are counted; blocks being saved or read back are not touched. Null when the
     * namespace is unknown: no sealed instance created it and the SSD tier holds none of it
     * (nothing changed).
     */
    public Cleared clear(String namespace, boolean dram, boolean ssd) {
        long blocks = 0;
        long bytes = 0;
        long referenced = 0;
        long unpinned = 0;
        boolean known;
        lock.lock();
        try {
            checkOpen();
            NamespaceIndex only = namespace == null ? null : registry.namespace(namespace);
            known = namespace == null || only != null;
            if (dram && known) {
                for (Block b : adminPins.of(only)) {
                    adminPins.unpin(b);
                    unpin(b);
                    unpinned++;
                }
                for (NamespaceIndex ns : only == null ? List.copyOf(registry.namespaces()) : List.of(only)) {
                    for (Block b : ns.blocks.values()) {
                        if (!b.sealed) {
                            continue;
                        }
                        if (b.refs > 0) {
                            referenced++;
                            continue;
                        }
                        lru.remove(b);
                        bytes += b.bytes;
                        blocks++;
                        dropResident(b);
                    }
                }
                count(Counter.ADMIN_CLEARED_BLOCKS, blocks);
            }
        } finally {
            lock.unlock();
        }
        // Outside the lock: it walks the whole disk index, and the tier is thread-safe.
        SsdTier tier = this.ssd;
        long records = ssd && tier != null ? tier.forget(namespace) : 0;
        count(Counter.ADMIN_CLEARED_SSD_BLOCKS, records);
        if (!known && records == 0 && (tier == null || !tier.holds(namespace))) { // nothing changed
            return null;
        }
        return new Cleared(blocks, bytes, referenced, unpinned, records);
    }

    /** See {@link BlockStore#resetCache}: {@link #clear} of the instance's namespace, both tiers (nothing when it has no blocks yet). */
    @Override
    public Cleared resetCache(String instanceId) {
        String namespace;
        lock.lock();
        try {
            checkOpen();
            namespace = registry.get(instanceId).spec.namespace();
        } finally {
            lock.unlock();
        }
        Cleared c = clear(namespace, true, true);
        return c != null ? c : new Cleared(0, 0, 0, 0, 0);
    }

    /** What {@link #pin} did with the hashes: newly pinned, pinned before, after the resident prefix. */
    public record Pinned(int pinned, int alreadyPinned, int notResident) {}

    /**
     * Pins the resident prefix of {@code hashes} in {@code namespace}: those blocks skip
     * eviction until {@link #unpin} or {@link #clear}. All pinned blocks together hold at most
     * half the pool ({@link AdminPins}); a pin past that is refused whole
     * ({@link QuotaExceededException}), nothing changed. Null when the namespace is unknown.
     */
    public Pinned pin(String namespace, BlockHashes hashes) {
        return onNamespace("pin", namespace, hashes, null, ns -> {
            Block[] found = new Block[hashes.count()];
            int hit = ns.blocks.sealedPrefix(hashes.packed(), hashes.hashLen(), hashes.count(), found);
            int pinned = adminPins.pinAll(found, hit, lru);
            return new Pinned(pinned, hit - pinned, hashes.count() - hit);
        });
    }

    /** Releases the operator's pins on any of {@code hashes} in {@code namespace}: how many were pinned; -1 when the namespace is unknown. */
    public int unpin(String namespace, BlockHashes hashes) {
        return onNamespace("unpin", namespace, hashes, -1, ns -> {
            byte[] packed = hashes.packed();
            int len = hashes.hashLen();
            int n = 0;
            for (int i = 0; i < hashes.count(); i++) {
                Block b = ns.blocks.get(packed, i * len, len);
                if (b != null && adminPins.unpin(b)) {
                    unpin(b);
                    n++;
                }
            }
            return n;
        });
    }

    /** What {@link #warm} found: the resident prefix, and the run after it being read back from SSD. */
    public record Warming(int resident, int reading) {}

    /**
     * Starts reading back from SSD the run of {@code hashes} that follows their resident prefix
     * in {@code namespace}, as a query would but without a lease, so that a later query finds
     * them resident. The run stops where a block is on neither tier or the pool has no
     * unpinned room, and prefix and run are capped at half the pool. Null when the namespace
     * is unknown (its layout comes from a sealed instance); without an SSD tier, an
     * {@link InvalidArgumentException}.
     */
    public Warming warm(String namespace, BlockHashes hashes) {
        return onNamespace("warm", namespace, hashes, null, ns -> {
            if (ssd == null) {
                throw new InvalidArgumentException("warm: this store has no SSD tier (pegaflow-server --ssd-cache-path)");
            }
            Block[] found = new Block[hashes.count()];
            int hit = ns.blocks.sealedPrefix(hashes.packed(), hashes.hashLen(), hashes.count(), found);
            for (int i = 0; i < hit; i++) {
                lru.pin(found[i]); // as a query does: the read-back must not evict the prefix it continues
            }
            try {
                long before = readsQueued;
                int reading = hit < hashes.count() ? prefetch(ns, hashes, hit, clock.getAsLong()) : 0;
                count(Counter.ADMIN_WARMED_BLOCKS, readsQueued - before);
                return new Warming(hit, reading);
            } finally {
                for (int i = 0; i < hit; i++) {
                    unpin(found[i]);
                }
            }
        });
    }

    /** An operator's call on {@code namespace} under the lock; {@code unknown} when no sealed instance created it. */
    private <T> T onNamespace(String what, String namespace, BlockHashes hashes, T unknown,
            java.util.function.Function<NamespaceIndex, T> call) {
        if (hashes == null) {
            throw new InvalidArgumentException(what + ": hashes must not be null");
        }
        lock.lock();
        try {
            checkOpen();
            NamespaceIndex ns = namespace == null ? null : registry.namespace(namespace);
            return ns == null ? unknown : call.apply(ns);
        } finally {
            lock.unlock();
        }
    }

    /** One namespace as the operator sees it: blocks indexed (resident, being saved or read back) and pinned. */
    public record NamespaceSummary(String namespace, int blocks, int pinnedBlocks, long pinnedBytes) {}

    /** Every namespace a sealed instance created, by name (pegaflow-server's {@code GET /admin/status}). */
    public List<NamespaceSummary> namespaces() {
        lock.lock();
        try {
            List<NamespaceSummary> out = new ArrayList<>();
            for (NamespaceIndex ns : registry.namespaces()) {
                int pinned = 0;
                long pinnedBytes = 0;
                for (Block b : adminPins.of(ns)) {
                    pinned++;
                    pinnedBytes += b.bytes;
                }
                out.add(new NamespaceSummary(ns.namespace, ns.blocks.size(), pinned, pinnedBytes));
            }
            out.sort(java.util.Comparator.comparing(NamespaceSummary::namespace));
            return out;
        } finally {
            lock.unlock();
        }
    }

    /** The most bytes the operator's pins may hold together (half the pool). */
    public long maxPinnedBytes() {
        return adminPins.maxBytes();
    }

    // ---------------------------------------------------------------- sweeping, stats, close

    /**
     * Expires leases past their TTL, rolls back saves and loads open longer than the copy TTL
     * (their copier died without a session to say so) and those of unregistered instances
     * whose hold ended, and drops partially saved blocks past the in-flight TTL.
     */
    public void sweep() {
        lock.lock();
        try {
            checkOpen();
            long now = clock.getAsLong();
            expireLeases(now);
            expireTransfers(now);
            expireCopies(now); // before the in-flight blocks: a rolled-back save may leave them unreferenced
            for (Iterator<Block> it = inflight.iterator(); it.hasNext(); ) {
                Block b = it.next();
                if (b.refs == 0 && now - b.touchedNanos > inflightTtlNanos) {
                    it.remove();
                    b.ns.blocks.remove(b);
                    freeAllocations(b);
                    count(Counter.INFLIGHT_GC, 1);
                }
            }
        } finally {
            lock.unlock();
        }
    }

    private void sweepQuietly() {
        try {
            sweep();
        } catch (EngineClosedException ignored) {
            // close() is stopping the sweeper
        }
    }

    /** Gauges read consistently under the lock, plus every counter. */
    @Override
    public EngineStats stats() {
        Map<Gauge, Long> g = new EnumMap<>(Gauge.class);
        lock.lock();
        try {
            for (Gauge gauge : Gauge.values()) {
                g.put(gauge, gaugeValue(gauge));
            }
        } finally {
            lock.unlock();
        }
        return new EngineStats(g, counters.counters());
    }

    /**
     * Checks the engine's internal invariants (for tests and stress runs): slot states,
     * LRU membership, reference counts, and exact pool accounting. Throws
     * {@link IllegalStateException} describing the first violation.
     */
    public void verifyInvariants() {
        lock.lock();
        try {
            long bytes = 0;
            long sealed = 0;
            long sealedBytes = 0;
            long pinned = 0;
            int allocations = 0;
            Set<Block> inLru = lru.members();
            for (NamespaceIndex ns : registry.namespaces()) {
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
                        require(inLru.contains(b) == (b.refs == 0), "block " + b.key + " refs " + b.refs + " but inLru=" + inLru.contains(b));
                    } else {
                        require(inflight.contains(b), "unsealed block " + b.key + " not tracked in flight");
                    }
                }
            }
            leases.verify();
            java.util.Map<Instance, Integer> opened = new java.util.IdentityHashMap<>();
            for (OpenCopy op : open.values()) {
                opened.merge(op.instance(), 1, Integer::sum);
            }
            for (String id : registry.ids()) {
                Instance inst = registry.get(id);
                int n = opened.getOrDefault(inst, 0);
                require(inst.openCopies == n, "instance '" + id + "' has " + n + " open copies but counts " + inst.openCopies);
                leases.verifyCounts(inst);
            }
            require(bytes == allocator.usedBytes(), "blocks hold " + bytes + " bytes but the allocator has " + allocator.usedBytes() + " in use");
            require(allocations == allocator.liveAllocations(), "blocks hold " + allocations + " allocations, allocator " + allocator.liveAllocations());
            require(sealed == residentBlocks && sealedBytes == residentBytes, "resident " + residentBlocks + "/" + residentBytes
                    + " but counted " + sealed + "/" + sealedBytes);
            lru.verify(pinned);
            adminPins.verify();
        } finally {
            lock.unlock();
        }
    }

    /** Throws {@link IllegalStateException} unless {@code ok}; also used by the collaborators' checks. */
    static void require(boolean ok, String message) {
        if (!ok) {
            throw new IllegalStateException("engine invariant violated: " + message);
        }
    }

    /** Whether {@code instanceId} is registered (sealed or not). */
    public boolean isRegistered(String instanceId) {
        lock.lock();
        try {
            return registry.contains(instanceId);
        } finally {
            lock.unlock();
        }
    }

    /** Registered instance ids, sorted. */
    public List<String> instanceIds() {
        lock.lock();
        try {
            return registry.ids();
        } finally {
            lock.unlock();
        }
    }

    /** Open reservations and loads (copies the caller has started but not finished). */
    public int openOperations() {
        lock.lock();
        try {
            return open.size();
        } finally {
            lock.unlock();
        }
    }

    /**
     * Drops every lease, open operation and block. Callers stop their copies first. Fails with
     * {@link IllegalStateException} if pool accounting does not return to zero.
     */
    @Override
    public void close() {
        SsdTier tier = ssd;
        if (tier != null) {
            tier.close(); // first, unlocked: its threads finish their copies (they take this lock)
        }
        BlockChecksums sums = checksums;
        if (sums != null) {
            sums.close(); // likewise: its thread reads the pool and takes this lock
        }
        lock.lock();
        try {
            if (closed) {
                return;
            }
            closed = true;
            if (sweeper != null) {
                sweeper.shutdownNow();
            }
            leases.clear();
            open.clear();
            orphans.clear();
            transfers.clear();
            adminPins.clear();
            fetchQueue.clear();
            for (NamespaceIndex ns : registry.namespaces()) {
                for (Block b : ns.blocks.values()) {
                    freeAllocations(b);
                }
                ns.blocks.clear();
            }
            inflight.clear();
            lru.clear();
            residentBlocks = residentBytes = 0;
            if (allocator.usedBytes() != 0 || allocator.liveAllocations() != 0) {
                throw new IllegalStateException("host pool accounting leak at close: " + allocator.usedBytes()
                        + " bytes in " + allocator.liveAllocations() + " allocations not returned");
            }
        } finally {
            lock.unlock();
        }
    }

    // ---------------------------------------------------------------- internals (under lock)

    private void checkOpen() {
        if (closed) {
            throw new EngineClosedException("engine is closed");
        }
    }

    private Token newCopyId() {
        Token id;
        do {
            id = Token.random(ids);
        } while (open.containsKey(id));
        return id;
    }

    /**
     * Ids are unguessable, and bound too: a lease or copy acts only for the instance it was
     * issued to, so one tenant holding another's id still cannot end, load or release it.
     */
    private static void checkOwner(Instance owner, String instanceId, String what) {
        if (!owner.spec.instanceId().equals(instanceId)) {
            throw new PermissionDeniedException(what + " was not issued to instance '" + instanceId + "'; refused");
        }
    }

    /** What an instance holds now, against its {@link Quotas}. */
    public record Usage(int leases, long leasedBlocks, int openCopies) {}

    /** Every registered instance's {@link Usage} (one snapshot under the lock; /metrics). */
    public Map<String, Usage> usage() {
        lock.lock();
        try {
            Map<String, Usage> out = new java.util.TreeMap<>();
            for (String id : registry.ids()) {
                Instance inst = registry.get(id);
                out.put(id, new Usage(inst.leases, inst.leasedBlocks, inst.openCopies));
            }
            return out;
        } finally {
            lock.unlock();
        }
    }

    /** Under lock: {@code op} is open under {@code id}, counted for its instance ({@link Quotas}). */
    private void opened(Token id, OpenCopy op) {
        open.put(id, op);
        op.instance().openCopies++;
    }

    /** Rolls back saves and loads whose copier never ended them (its process died without a session). */
    private void expireCopies(long now) {
        for (Iterator<OpenCopy> it = open.values().iterator(); it.hasNext(); ) {
            OpenCopy op = it.next();
            if (op.deadlineNanos() - now <= 0) {
                it.remove();
                op.instance().openCopies--;
                abort(op);
                count(Counter.COPIES_EXPIRED, 1);
            }
        }
        releaseOrphans(now);
    }

    /** Undoes an open save or load that will never end normally. */
    private void abort(OpenCopy op) {
        switch (op) {
            case Reservation r -> {
                rollbackSave(r.worker(), r.blocks());
                count(Counter.SAVE_FAILURES, 1);
            }
            case OpenLoad l -> {
                unpinAll(l.blocks());
                count(Counter.LOAD_FAILURES, 1);
            }
        }
    }

    private void expireLeases(long now) {
        count(Counter.LEASES_EXPIRED, leases.expireUntil(now));
    }

    private void pinAll(Block[] blocks) {
        for (Block b : blocks) {
            lru.pin(b);
        }
    }

    private void unpin(Block b) {
        if (lru.unpin(b) && b.filled == 0 && b.allocationCount == 0) {
            // A failed save left an empty in-flight block behind.
            inflight.remove(b);
            b.ns.blocks.remove(b);
            b.removed = true;
        }
    }

    private void unpinAll(Block[] blocks) {
        for (Block b : blocks) {
            unpin(b);
        }
    }

    /** Pool bytes an allocation of {@code bytes} takes (whole allocator units). */
    private long allocatedBytes(long bytes) {
        long unit = allocator.unitBytes();
        return (bytes + unit - 1) / unit * unit;
    }

    /** Evicts the least recently used unreferenced block; false when there is none. */
    private boolean evictOne() {
        Block b = lru.pollOldest();
        if (b == null) {
            return false;
        }
        count(Counter.EVICTIONS, 1);
        count(Counter.EVICTED_BYTES, b.bytes);
        dropResident(b);
        return true;
    }

    /** Under lock: a sealed block already off the LRU list leaves the index, the other hosts' view and the pool. */
    private void dropResident(Block b) {
        residentBlocks--;
        residentBytes -= b.bytes;
        events.append(KvEventLog.Kind.REMOVED, KvEventLog.CPU, b.ns.namespace, b.key.bytes());
        b.ns.blocks.remove(b);
        RemoteTier r = remote;
        if (r != null) {
            r.evicted(b.ns.namespace, b.key.bytes());
        }
        freeAllocations(b);
    }

    private void freeAllocations(Block b) {
        for (int i = 0; i < b.allocationCount; i++) {
            allocator.free(b.allocations[i]);
        }
        b.allocationCount = 0;
        b.bytes = 0;
        b.removed = true;
    }

    private long gaugeValue(Gauge gauge) {
        return switch (gauge) {
            case POOL_CAPACITY_BYTES -> allocator.capacityBytes();
            case POOL_USED_BYTES -> allocator.usedBytes();
            case RESIDENT_BLOCKS -> residentBlocks;
            case RESIDENT_BYTES -> residentBytes;
            case INFLIGHT_BLOCKS -> inflight.size();
            case PINNED_BLOCKS -> lru.pinnedBlocks();
            case ACTIVE_LEASES -> leases.size();
            case SSD_BLOCKS -> ssd == null ? 0 : ssd.blocks();
            case SSD_BYTES -> ssd == null ? 0 : ssd.bytes();
            case SSD_PREFETCH_INFLIGHT -> prefetchInFlight;
            case ADMIN_PINNED_BLOCKS -> adminPins.blocks();
            case ADMIN_PINNED_BYTES -> adminPins.bytes();
        };
    }

    private void registerGauges(MetricsSink sink) {
        for (Gauge gauge : Gauge.values()) {
            sink.gauge(gauge, () -> {
                lock.lock();
                try {
                    return gaugeValue(gauge);
                } finally {
                    lock.unlock();
                }
            });
        }
    }

    private void count(Counter c, long delta) {
        if (delta == 0) {
            return;
        }
        counters.add(c, delta);
        if (extraSink != null) {
            extraSink.add(c, delta);
        }
    }
}
