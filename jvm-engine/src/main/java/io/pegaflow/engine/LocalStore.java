package io.pegaflow.engine;

import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.metrics.CounterMetrics;
import io.pegaflow.engine.metrics.Gauge;
import io.pegaflow.engine.metrics.MetricsSink;
import io.pegaflow.engine.pool.OffsetAllocator;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.EnumMap;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ThreadLocalRandom;
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
 * returns where each one goes; {@link #commitSave} seals what landed (or rolls back). A load
 * is {@link #beginLoad} (consumes the worker's lease share, pins the blocks, returns where
 * each slot is) and {@link #endLoad}. Every method may be called from any thread; each runs
 * under one lock and none waits for a copy.
 */
public final class LocalStore implements BlockStore {
    private final OffsetAllocator allocator;
    private final CounterMetrics counters = new CounterMetrics();
    private final MetricsSink extraSink;
    private final LongSupplier clock;
    private final long leaseTtlNanos;
    private final long inflightTtlNanos;
    private final ScheduledExecutorService sweeper;

    private final ReentrantLock lock = new ReentrantLock();
    // --- guarded by lock ---
    private final Map<String, Instance> instances = new HashMap<>();
    private final Map<String, NamespaceIndex> namespaces = new HashMap<>();
    /** Insertion order is expiry order (one TTL for all leases). */
    private final LinkedHashMap<LeaseId, Lease> leases = new LinkedHashMap<>();
    private final Set<Block> inflight = new HashSet<>();
    private Block lruHead;
    private Block lruTail;
    private long residentBlocks;
    private long residentBytes;
    private long pinnedBlocks;
    private long evictableBytes;
    private boolean closed;
    /** Saves and loads between their plan and endCopy, by plan id. */
    private final Map<Long, OpenCopy> open = new HashMap<>();
    private long nextId = 1;
    // --- end guarded ---

    /** A store handing out offsets in a pool of {@code capacityBytes}. */
    public LocalStore(EngineConfig config, long capacityBytes) {
        if (config == null) {
            throw new InvalidArgumentException("engine config is null; expected EngineConfig.builder()...build()");
        }
        this.clock = config.nanoClock();
        this.leaseTtlNanos = config.leaseTtl().toNanos();
        this.inflightTtlNanos = config.inflightTtl().toNanos();
        this.extraSink = config.metrics();
        this.allocator = new OffsetAllocator(capacityBytes);
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
            Instance existing = instances.get(spec.instanceId());
            if (existing != null) {
                if (existing.spec.equals(spec)) {
                    return;
                }
                throw new TopologyMismatchException("instance '" + spec.instanceId() + "' is registered as " + existing.spec
                        + "; re-registration asked for " + spec);
            }
            instances.put(spec.instanceId(), new Instance(spec));
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
        if (worker == null) {
            throw new InvalidArgumentException("worker spec for instance '" + instanceId + "' is null");
        }
        if (worker.layers() == null || worker.layers().isEmpty()) {
            throw new InvalidArgumentException("worker " + worker.workerRank() + " of instance '" + instanceId
                    + "' registers no layers; expected at least one LayerRegion");
        }
        Set<String> names = new HashSet<>();
        List<LayerRegion> regions = worker.layers();
        for (LayerRegion r : regions) {
            if (r == null) {
                throw new InvalidArgumentException("worker " + worker.workerRank() + " of instance '" + instanceId
                        + "' has a null layer region");
            }
            r.validate();
            if (!names.add(r.layerName())) {
                throw new InvalidArgumentException("layer '" + r.layerName() + "' appears twice in worker "
                        + worker.workerRank() + " of instance '" + instanceId + "'");
            }
        }
        int[] overlap = LayerOverlaps.find(regions);
        if (overlap != null) {
            throw new InvalidArgumentException("layers '" + regions.get(overlap[0]).layerName() + "' and '"
                    + regions.get(overlap[1]).layerName() + "' of worker " + worker.workerRank()
                    + " overlap in memory; expected disjoint regions");
        }
        lock.lock();
        try {
            checkOpen();
            Instance inst = instance(instanceId);
            if (inst.sealed()) {
                throw new InvalidArgumentException("instance '" + instanceId + "' is already sealed: all "
                        + inst.spec.worldSize() + " workers registered");
            }
            int rank = worker.workerRank();
            if (rank < 0 || rank >= inst.spec.worldSize()) {
                throw new InvalidArgumentException("worker rank " + rank + " out of range [0, " + inst.spec.worldSize()
                        + ") for instance '" + instanceId + "'");
            }
            if (worker.tpRank() < 0 || worker.tpRank() >= inst.spec.tpSize()) {
                throw new InvalidArgumentException("tp rank " + worker.tpRank() + " out of range [0, "
                        + inst.spec.tpSize() + ") for instance '" + instanceId + "'");
            }
            if (inst.workers[rank] != null) {
                throw new InvalidArgumentException("worker rank " + rank + " of instance '" + instanceId
                        + "' is already registered");
            }
            inst.workers[rank] = new Instance.Worker(worker);
            inst.registeredWorkers++;
            if (inst.registeredWorkers == inst.spec.worldSize()) {
                try {
                    seal(inst);
                } catch (RuntimeException e) {
                    inst.workers[rank] = null;
                    inst.registeredWorkers--;
                    throw e;
                }
            }
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
            return instance(instanceId).sealed();
        } finally {
            lock.unlock();
        }
    }

    private void seal(Instance inst) {
        int tp = inst.spec.tpSize();
        TreeMap<String, NamespaceLayout.LayerGeometry> geometry = new TreeMap<>();
        Map<String, int[]> owners = new HashMap<>();
        for (Instance.Worker w : inst.workers) {
            for (LayerRegion r : w.regions) {
                NamespaceLayout.LayerGeometry g =
                        new NamespaceLayout.LayerGeometry(r.layerName(), r.layout(), r.segmentBytes());
                NamespaceLayout.LayerGeometry prev = geometry.putIfAbsent(r.layerName(), g);
                if (prev != null && !prev.equals(g)) {
                    throw new TopologyMismatchException("layer '" + r.layerName() + "' of instance '" + inst.spec.instanceId()
                            + "' is " + prev.layout() + " with segmentBytes " + prev.segmentBytes() + " on one rank but "
                            + g.layout() + " with segmentBytes " + g.segmentBytes() + " on worker " + w.spec.workerRank()
                            + "; expected the same geometry on every rank");
                }
                int[] byTp = owners.computeIfAbsent(r.layerName(), k -> {
                    int[] a = new int[tp];
                    Arrays.fill(a, -1);
                    return a;
                });
                int tpRank = w.spec.tpRank();
                // MLA latents are identical on every TP rank: workers registering the same
                // (layer, tp rank) are replicas that share one stored copy (the first save
                // to claim a slot writes it, the others skip it).
                if (byTp[tpRank] >= 0 && r.layout() != KvLayout.MLA) {
                    throw new TopologyMismatchException("layer '" + r.layerName() + "' tp rank " + tpRank + " of instance '"
                            + inst.spec.instanceId() + "' is registered by workers " + byTp[tpRank] + " and "
                            + w.spec.workerRank() + "; expected exactly one owner");
                }
                byTp[tpRank] = w.spec.workerRank();
            }
        }
        for (Map.Entry<String, int[]> e : owners.entrySet()) {
            for (int t = 0; t < tp; t++) {
                if (e.getValue()[t] < 0) {
                    throw new TopologyMismatchException("layer '" + e.getKey() + "' of instance '" + inst.spec.instanceId()
                            + "' has no worker for tp rank " + t + "; expected every layer on every tp rank");
                }
            }
        }
        NamespaceLayout layout = new NamespaceLayout(tp, List.copyOf(geometry.values()));
        NamespaceIndex ns = namespaces.get(inst.spec.namespace());
        if (ns != null && !ns.layout.equals(layout)) {
            throw new TopologyMismatchException("namespace '" + inst.spec.namespace() + "' is shared by incompatible KV layouts: "
                    + "it holds " + ns.layout + " but instance '" + inst.spec.instanceId() + "' registers " + layout);
        }
        Map<String, Integer> ids = new HashMap<>();
        int id = 0;
        for (String name : geometry.keySet()) {
            ids.put(name, id++);
        }
        for (Instance.Worker w : inst.workers) {
            w.layerIds = new int[w.regions.length];
            for (int i = 0; i < w.regions.length; i++) {
                w.layerIds[i] = ids.get(w.regions[i].layerName());
            }
        }
        if (ns == null) {
            ns = new NamespaceIndex(inst.spec.namespace(), layout);
            namespaces.put(ns.namespace, ns);
        }
        inst.layerIds = ids;
        inst.ns = ns;
    }

    /**
     * Removes an instance: its leases are released, and saves and loads it began but did not
     * finish are rolled back (what the server does when a client dies). Cached blocks stay
     * for other instances of the namespace. Callers must have stopped the instance's copies.
     */
    @Override
    public void unregisterInstance(String instanceId) {
        lock.lock();
        try {
            checkOpen();
            Instance inst = instance(instanceId);
            instances.remove(instanceId);
            inst.removed = true;
            for (Iterator<Lease> it = leases.values().iterator(); it.hasNext(); ) {
                Lease l = it.next();
                if (l.instance == inst) {
                    it.remove();
                    unpinAll(l.blocks);
                }
            }
            for (Iterator<OpenCopy> it = open.values().iterator(); it.hasNext(); ) {
                OpenCopy op = it.next();
                if (op.instance() == inst) {
                    it.remove();
                    switch (op) {
                        case Reservation r -> {
                            rollbackSave(r.worker, inst.ns.layout, r.blocks);
                            count(Counter.SAVE_FAILURES, 1);
                        }
                        case OpenLoad l -> {
                            unpinAll(l.blocks);
                            count(Counter.LOAD_FAILURES, 1);
                        }
                    }
                }
            }
        } finally {
            lock.unlock();
        }
    }

    // ---------------------------------------------------------------- save

    /**
     * Plans a save of the worker's slots of {@code blockIds[i]} under {@code hashes[i]} for the
     * named layers ({@code null}: all of the worker's layers). Blocks already resident, and
     * slots already saved or being saved, are skipped. Pool space is allocated now, evicting
     * least recently used unreferenced blocks if needed, and the claimed slots stay invisible
     * until {@link #commitSave}.
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
            Instance inst = sealedInstance(instanceId);
            Instance.Worker worker = worker(inst, workerRank);
            int[] regionIdx = selectRegions(inst, worker, layerNames);
            Limits.checkPlan("save", blockIds.length, regionIdx.length);
            for (int r : regionIdx) {
                checkBlockIds(blockIds, "blockIds", worker.regions[r]);
            }
            planSave(inst, worker, regionIdx, blockIds, hashes, planned);
            int skipped = hashes.count() - planned.size();
            count(Counter.SAVE_REQUESTS, 1);
            count(Counter.SAVE_SKIPPED_BLOCKS, skipped);
            if (planned.isEmpty()) {
                return CopyPlan.nothing(skipped);
            }
            long id = nextId++;
            open.put(id, new Reservation(inst, worker, planned));
            return toPlan(id, skipped, inst.ns.layout, worker, planned);
        } finally {
            lock.unlock();
        }
    }

    /** Where each claimed slot goes: triples (request index, region index, pool offset). */
    private static CopyPlan toPlan(long id, int skipped, NamespaceLayout layout, Instance.Worker worker,
            List<PlannedBlock> planned) {
        int n = 0;
        for (PlannedBlock p : planned) {
            n += p.regions.length;
        }
        int[] blockIndex = new int[n];
        int[] regionIndex = new int[n];
        long[] hostOffset = new long[n];
        int k = 0;
        int tpRank = worker.spec.tpRank();
        for (PlannedBlock p : planned) {
            for (int r : p.regions) {
                blockIndex[k] = p.requestIndex;
                regionIndex[k] = r;
                hostOffset[k] = p.block.slotOffset[layout.slot(worker.layerIds[r], tpRank)];
                k++;
            }
        }
        return new CopyPlan(id, CopyPlan.Direction.SAVE, planned.size(), skipped, blockIndex, regionIndex, hostOffset);
    }

    /** A save or load between its plan and {@link #endCopy}. */
    private sealed interface OpenCopy permits Reservation, OpenLoad {
        Instance instance();
    }

    /** An open save: the instance, the worker and the blocks it claimed. */
    private record Reservation(Instance instance, Instance.Worker worker, List<PlannedBlock> blocks) implements OpenCopy {}

    /** An open load: the blocks it pinned. */
    private record OpenLoad(Instance instance, Block[] blocks) implements OpenCopy {}

    /** One block of a save: which of the worker's regions it writes and the allocation backing them. */
    private static final class PlannedBlock {
        final int requestIndex;
        final HashKey key;
        Block block;
        final int[] regions;
        final long bytes;
        long allocation;

        PlannedBlock(int requestIndex, HashKey key, Block block, int[] regions, long bytes) {
            this.requestIndex = requestIndex;
            this.key = key;
            this.block = block;
            this.regions = regions;
            this.bytes = bytes;
        }
    }

    /** Under lock: decides what to write, checks capacity, then allocates and claims slots. */
    private void planSave(Instance inst, Instance.Worker worker, int[] regionIdx, long[] blockIds, BlockHashes hashes,
            List<PlannedBlock> plans) {
        NamespaceIndex ns = inst.ns;
        NamespaceLayout layout = ns.layout;
        int tpRank = worker.spec.tpRank();
        Set<HashKey> seen = new HashSet<>();
        long unit = allocator.unitBytes();
        long needed = 0;
        byte[] packed = hashes.packed();
        int len = hashes.hashLen();
        for (int i = 0; i < hashes.count(); i++) {
            Block b = ns.blocks.get(packed, i * len, len);
            if (b != null && b.sealed) {
                continue;
            }
            HashKey key = b != null ? b.key : HashKey.of(hashes, i);
            int[] todo = new int[regionIdx.length];
            int n = 0;
            long bytes = 0;
            for (int r : regionIdx) {
                int slot = layout.slot(worker.layerIds[r], tpRank);
                if (b == null || b.slotState[slot] == Block.EMPTY) {
                    todo[n++] = r;
                    bytes += worker.regions[r].slotBytes();
                }
            }
            if (n == 0) {
                continue;
            }
            plans.add(new PlannedBlock(i, key, b, Arrays.copyOf(todo, n), bytes));
            needed += (bytes + unit - 1) / unit * unit;
        }
        if (needed > allocator.freeBytes() + evictableBytes) {
            count(Counter.POOL_ALLOC_FAILURES, 1);
            plans.clear();
            throw new PoolExhaustedException("host pool exhausted: saving needs " + Sizes.format(needed)
                    + " but the pool (" + Sizes.format(allocator.capacityBytes()) + ") has " + Sizes.format(allocator.freeBytes())
                    + " free and " + Sizes.format(evictableBytes) + " evictable; " + pinnedBlocks
                    + " blocks are pinned by leases or loads and " + inflight.size() + " blocks are being assembled");
        }
        long now = clock.getAsLong();
        for (int p = 0; p < plans.size(); p++) {
            PlannedBlock plan = plans.get(p);
            long handle;
            while ((handle = allocator.allocate(plan.bytes)) == OffsetAllocator.NO_SPACE) {
                if (!evictOne()) {
                    rollbackSave(worker, layout, plans.subList(0, p));
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
            for (int r : plan.regions) {
                int slot = layout.slot(worker.layerIds[r], tpRank);
                b.slotState[slot] = Block.WRITING;
                b.slotOffset[slot] = offset;
                offset += worker.regions[r].slotBytes();
            }
            pin(b);
        }
    }

    /** Under lock: undoes the allocations and slot claims of a save that did not happen. */
    private void rollbackSave(Instance.Worker worker, NamespaceLayout layout, List<PlannedBlock> done) {
        int tpRank = worker.spec.tpRank();
        for (PlannedBlock plan : done) {
            Block b = plan.block;
            for (int r : plan.regions) {
                int slot = layout.slot(worker.layerIds[r], tpRank);
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
        NamespaceLayout layout = inst.ns.layout;
        int tpRank = worker.spec.tpRank();
        if (!ok) {
            rollbackSave(worker, layout, plans);
            return;
        }
        long now = clock.getAsLong();
        for (PlannedBlock plan : plans) {
            Block b = plan.block;
            for (int r : plan.regions) {
                b.slotState[layout.slot(worker.layerIds[r], tpRank)] = Block.FILLED;
                b.filled++;
            }
            b.touchedNanos = now;
            if (b.complete() && !b.sealed) {
                b.sealed = true;
                inflight.remove(b);
                residentBlocks++;
                residentBytes += b.bytes;
                pinnedBlocks++; // the save's own reference; unpin below may make it evictable
                count(Counter.BLOCKS_SEALED, 1);
            }
            unpin(b);
        }
    }

    // ---------------------------------------------------------------- query

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
        LeaseId leaseId = null;
        int hit;
        lock.lock();
        try {
            checkOpen();
            Instance inst = sealedInstance(instanceId);
            long now = clock.getAsLong();
            expireLeases(now);
            Block[] found = new Block[count];
            hit = inst.ns.blocks.sealedPrefix(hashes.packed(), hashes.hashLen(), count, found);
            if (hit > 0) {
                Block[] pinned = hit == found.length ? found : Arrays.copyOf(found, hit);
                do {
                    ThreadLocalRandom rnd = ThreadLocalRandom.current();
                    leaseId = new LeaseId(rnd.nextLong(), rnd.nextLong());
                } while (leases.containsKey(leaseId));
                leases.put(leaseId, new Lease(leaseId, inst, pinned, now + leaseTtlNanos));
                for (Block b : pinned) {
                    pin(b);
                }
            }
            count(Counter.QUERY_REQUESTS, 1);
            count(Counter.HIT_BLOCKS, hit);
            count(Counter.MISS_BLOCKS, count - hit);
            if (hit > 0) {
                count(Counter.LEASES_CREATED, 1);
            }
        } finally {
            lock.unlock();
        }
        return new QueryResult(hit, leaseId);
    }

    /** Drops a lease and all its remaining shares. */
    @Override
    public void release(LeaseId leaseId) {
        if (leaseId == null) {
            throw new InvalidArgumentException("release: lease is null");
        }
        lock.lock();
        try {
            checkOpen();
            expireLeases(clock.getAsLong());
            Lease lease = leases.remove(leaseId);
            if (lease == null) {
                throw unknownLease(leaseId);
            }
            unpinAll(lease.blocks);
        } finally {
            lock.unlock();
        }
    }

    // ---------------------------------------------------------------- load

    /**
     * Consumes this worker's share of a lease, pins the leased blocks until {@link #endLoad},
     * and returns where each of the worker's slots is: triples (lease index = index into
     * {@code dstBlockIds}, region index, pool offset).
     */
    @Override
    public CopyPlan beginLoad(String instanceId, int workerRank, LeaseId leaseId, long[] dstBlockIds) {
        if (leaseId == null || dstBlockIds == null) {
            throw new InvalidArgumentException("load: lease and dstBlockIds must not be null");
        }
        lock.lock();
        try {
            checkOpen();
            Instance inst = sealedInstance(instanceId);
            Instance.Worker worker = worker(inst, workerRank);
            expireLeases(clock.getAsLong());
            Lease lease = leases.get(leaseId);
            if (lease == null) {
                throw unknownLease(leaseId);
            }
            if (lease.instance != inst) {
                throw new UnknownLeaseException("lease " + leaseId + " belongs to instance '"
                        + lease.instance.spec.instanceId() + "', not '" + instanceId + "'");
            }
            if (lease.consumedBy.get(workerRank)) {
                throw new InvalidArgumentException("worker " + workerRank + " already consumed its share of lease " + leaseId);
            }
            if (dstBlockIds.length != lease.blocks.length) {
                throw new InvalidArgumentException("load of lease " + leaseId + ": " + dstBlockIds.length
                        + " destination block ids for " + lease.blocks.length + " leased blocks; expected equal counts");
            }
            Limits.checkPlan("load", dstBlockIds.length, worker.regions.length);
            for (LayerRegion r : worker.regions) {
                checkBlockIds(dstBlockIds, "dstBlockIds", r);
            }
            Block[] blocks = lease.blocks;
            lease.consumedBy.set(workerRank);
            for (Block b : blocks) {
                pin(b);
            }
            if (lease.fullyConsumed()) {
                leases.remove(leaseId);
                unpinAll(blocks);
            }
            count(Counter.LOAD_REQUESTS, 1);
            NamespaceLayout layout = inst.ns.layout;
            int tpRank = worker.spec.tpRank();
            int regions = worker.regions.length;
            int n = blocks.length * regions;
            int[] blockIndex = new int[n];
            int[] regionIndex = new int[n];
            long[] hostOffset = new long[n];
            int k = 0;
            for (int i = 0; i < blocks.length; i++) {
                for (int r = 0; r < regions; r++) {
                    blockIndex[k] = i;
                    regionIndex[k] = r;
                    hostOffset[k] = blocks[i].slotOffset[layout.slot(worker.layerIds[r], tpRank)];
                    k++;
                }
            }
            long id = nextId++;
            open.put(id, new OpenLoad(inst, blocks));
            return new CopyPlan(id, CopyPlan.Direction.LOAD, blocks.length, 0, blockIndex, regionIndex, hostOffset);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Ends an open save or load. A save with {@code ok} fills its claimed slots, and blocks
     * whose last slot this was become visible; otherwise its slots are released and their
     * space freed. A load unpins its blocks. {@code bytes} and {@code nanos} describe the
     * copy, for metrics.
     */
    @Override
    public CopyResult endCopy(long planId, boolean ok, long bytes, long nanos) {
        if (bytes < 0 || nanos < 0) {
            throw new InvalidArgumentException("end of copy " + planId + ": bytes " + bytes + ", nanos " + nanos
                    + "; expected >= 0");
        }
        lock.lock();
        try {
            checkOpen();
            OpenCopy op = open.remove(planId);
            if (op == null) {
                throw new InvalidArgumentException("copy " + planId
                        + " is unknown: already ended, rolled back, or its instance was unregistered");
            }
            boolean save = op instanceof Reservation;
            int blocks;
            switch (op) {
                case Reservation r -> {
                    commitLocked(r.instance, r.worker, r.blocks, ok);
                    blocks = r.blocks.size();
                }
                case OpenLoad l -> {
                    unpinAll(l.blocks);
                    blocks = l.blocks.length;
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

    // ---------------------------------------------------------------- sweeping, stats, close

    /** Expires leases past their TTL and drops partially saved blocks past the in-flight TTL. */
    public void sweep() {
        lock.lock();
        try {
            checkOpen();
            long now = clock.getAsLong();
            expireLeases(now);
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
            Set<Block> inLru = new HashSet<>();
            long lruBytes = 0;
            for (Block b = lruHead; b != null; b = b.lruNext) {
                inLru.add(b);
                lruBytes += b.bytes;
            }
            for (NamespaceIndex ns : namespaces.values()) {
                for (Block b : ns.blocks.values()) {
                    bytes += b.bytes;
                    allocations += b.allocationCount;
                    int filled = 0;
                    for (byte s : b.slotState) {
                        if (s == Block.FILLED) {
                            filled++;
                        }
                    }
                    require(filled == b.filled, "block " + b.key + " counts " + b.filled + " filled slots, has " + filled);
                    require(b.refs >= 0, "block " + b.key + " has refs " + b.refs);
                    require(b.sealed == b.complete(), "block " + b.key + " sealed=" + b.sealed + " but complete=" + b.complete());
                    require(!b.removed, "removed block " + b.key + " still indexed");
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
            for (Lease l : leases.values()) {
                for (Block b : l.blocks) {
                    require(b.sealed && !b.removed && b.refs > 0, "lease " + l.id + " holds block " + b.key
                            + " sealed=" + b.sealed + " removed=" + b.removed + " refs=" + b.refs);
                }
            }
            require(bytes == allocator.usedBytes(), "blocks hold " + bytes + " bytes but the allocator has " + allocator.usedBytes() + " in use");
            require(allocations == allocator.liveAllocations(), "blocks hold " + allocations + " allocations, allocator " + allocator.liveAllocations());
            require(sealed == residentBlocks && sealedBytes == residentBytes, "resident " + residentBlocks + "/" + residentBytes
                    + " but counted " + sealed + "/" + sealedBytes);
            require(pinned == pinnedBlocks, "pinned " + pinnedBlocks + " but counted " + pinned);
            require(lruBytes == evictableBytes, "evictable " + evictableBytes + " but LRU holds " + lruBytes);
        } finally {
            lock.unlock();
        }
    }

    private static void require(boolean ok, String message) {
        if (!ok) {
            throw new IllegalStateException("engine invariant violated: " + message);
        }
    }

    /** Registered instance ids, sorted. */
    public List<String> instanceIds() {
        lock.lock();
        try {
            List<String> ids = new ArrayList<>(instances.keySet());
            ids.sort(null);
            return ids;
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
            for (NamespaceIndex ns : namespaces.values()) {
                for (Block b : ns.blocks.values()) {
                    freeAllocations(b);
                }
                ns.blocks.clear();
            }
            inflight.clear();
            lruHead = lruTail = null;
            residentBlocks = residentBytes = pinnedBlocks = evictableBytes = 0;
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

    private Instance instance(String instanceId) {
        Instance inst = instances.get(instanceId);
        if (inst == null) {
            throw new UnknownInstanceException("instance '" + instanceId + "' is not registered (registered: "
                    + abbreviate(instances.keySet()) + ")");
        }
        return inst;
    }

    private Instance sealedInstance(String instanceId) {
        Instance inst = instance(instanceId);
        if (!inst.sealed()) {
            throw new RegistrationIncompleteException("instance '" + instanceId + "' has " + inst.registeredWorkers
                    + " of " + inst.spec.worldSize() + " workers registered; expected all before save, query or load");
        }
        return inst;
    }

    private static Instance.Worker worker(Instance inst, int workerRank) {
        if (workerRank < 0 || workerRank >= inst.workers.length || inst.workers[workerRank] == null) {
            throw new UnknownInstanceException("worker rank " + workerRank + " is not registered in instance '"
                    + inst.spec.instanceId() + "' (world size " + inst.spec.worldSize() + ")");
        }
        return inst.workers[workerRank];
    }

    private static int[] selectRegions(Instance inst, Instance.Worker worker, List<String> layerNames) {
        if (layerNames == null) {
            int[] all = new int[worker.regions.length];
            Arrays.setAll(all, i -> i);
            return all;
        }
        int[] idx = new int[layerNames.size()];
        Set<String> seen = new HashSet<>();
        for (int i = 0; i < idx.length; i++) {
            String name = layerNames.get(i);
            if (!seen.add(name)) {
                throw new InvalidArgumentException("layer '" + name + "' listed twice in one save");
            }
            idx[i] = -1;
            for (int r = 0; r < worker.regions.length; r++) {
                if (worker.regions[r].layerName().equals(name)) {
                    idx[i] = r;
                }
            }
            if (idx[i] < 0) {
                throw new InvalidArgumentException("layer '" + name + "' is not registered by worker "
                        + worker.spec.workerRank() + " of instance '" + inst.spec.instanceId() + "'");
            }
        }
        return idx;
    }

    private static void checkBlockIds(long[] ids, String what, LayerRegion region) {
        for (int i = 0; i < ids.length; i++) {
            if (ids[i] < 0 || ids[i] >= region.numBlocks()) {
                throw new InvalidArgumentException(what + "[" + i + "] = " + ids[i] + " out of range [0, "
                        + region.numBlocks() + ") for layer '" + region.layerName() + "'");
            }
        }
    }

    private UnknownLeaseException unknownLease(LeaseId id) {
        return new UnknownLeaseException("lease " + id + " is unknown: never issued, released, consumed by every worker, or expired");
    }

    private void expireLeases(long now) {
        for (Iterator<Lease> it = leases.values().iterator(); it.hasNext(); ) {
            Lease l = it.next();
            if (l.expiresAtNanos - now > 0) {
                break;
            }
            it.remove();
            unpinAll(l.blocks);
            count(Counter.LEASES_EXPIRED, 1);
        }
    }

    private void pin(Block b) {
        if (b.refs++ == 0 && b.sealed) {
            lruUnlink(b);
            evictableBytes -= b.bytes;
            pinnedBlocks++;
        }
    }

    private void unpin(Block b) {
        if (--b.refs > 0) {
            return;
        }
        if (b.sealed) {
            pinnedBlocks--;
            lruAppend(b);
            evictableBytes += b.bytes;
        } else if (b.filled == 0 && b.allocationCount == 0) {
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

    /** Evicts the least recently used unreferenced block; false when there is none. */
    private boolean evictOne() {
        Block b = lruHead;
        if (b == null) {
            return false;
        }
        lruUnlink(b);
        evictableBytes -= b.bytes;
        residentBlocks--;
        residentBytes -= b.bytes;
        b.ns.blocks.remove(b);
        count(Counter.EVICTIONS, 1);
        count(Counter.EVICTED_BYTES, b.bytes);
        freeAllocations(b);
        return true;
    }

    private void freeAllocations(Block b) {
        for (int i = 0; i < b.allocationCount; i++) {
            allocator.free(b.allocations[i]);
        }
        b.allocationCount = 0;
        b.bytes = 0;
        b.removed = true;
    }

    private void lruAppend(Block b) {
        b.lruPrev = lruTail;
        b.lruNext = null;
        if (lruTail != null) {
            lruTail.lruNext = b;
        } else {
            lruHead = b;
        }
        lruTail = b;
    }

    private void lruUnlink(Block b) {
        if (b.lruPrev != null) {
            b.lruPrev.lruNext = b.lruNext;
        } else {
            lruHead = b.lruNext;
        }
        if (b.lruNext != null) {
            b.lruNext.lruPrev = b.lruPrev;
        } else {
            lruTail = b.lruPrev;
        }
        b.lruPrev = b.lruNext = null;
    }

    private long gaugeValue(Gauge gauge) {
        return switch (gauge) {
            case POOL_CAPACITY_BYTES -> allocator.capacityBytes();
            case POOL_USED_BYTES -> allocator.usedBytes();
            case RESIDENT_BLOCKS -> residentBlocks;
            case RESIDENT_BYTES -> residentBytes;
            case INFLIGHT_BLOCKS -> inflight.size();
            case PINNED_BLOCKS -> pinnedBlocks;
            case ACTIVE_LEASES -> leases.size();
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

    private static String abbreviate(Set<String> ids) {
        List<String> sorted = new ArrayList<>(ids);
        sorted.sort(null);
        return sorted.size() <= 8 ? sorted.toString() : sorted.subList(0, 8) + " and " + (sorted.size() - 8) + " more";
    }
}
