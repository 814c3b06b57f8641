package io.pegaflow.engine;

import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.metrics.CounterMetrics;
import io.pegaflow.engine.metrics.Gauge;
import io.pegaflow.engine.metrics.MetricsSink;
import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.pool.OffsetAllocator;
import io.pegaflow.engine.transfer.CopyBatch;
import io.pegaflow.engine.transfer.TransferEngine;
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
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.LongSupplier;

/**
 * The KV block store: instances register their KV regions, workers save blocks into the
 * host pool, the scheduler queries the longest resident prefix and gets a lease, workers
 * load leased blocks back into (other) block ids. See {@code package-info.java} for the
 * model and its invariants.
 *
 * <p>Threading: every public method may be called from any thread. Metadata changes run
 * under one engine lock and never wait for a copy; copies run on the transfer engine's
 * threads and commit under the lock when they finish. {@link #save} and {@link #load}
 * return as soon as the copy is submitted.
 */
public final class PegaEngine implements AutoCloseable {
    private final HostPool pool;
    private final OffsetAllocator allocator;
    private final TransferEngine transfer;
    private final CounterMetrics counters = new CounterMetrics();
    private final MetricsSink extraSink;
    private final LongSupplier clock;
    private final long leaseTtlNanos;
    private final long inflightTtlNanos;
    private final ScheduledExecutorService sweeper;
    private final long prefaultNanos;

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
    // --- end guarded ---

    /** Every copy in flight, so close() can wait for them. */
    private final Set<CompletableFuture<?>> pending = ConcurrentHashMap.newKeySet();

    private PegaEngine(EngineConfig config) {
        this.clock = config.nanoClock();
        this.leaseTtlNanos = config.leaseTtl().toNanos();
        this.inflightTtlNanos = config.inflightTtl().toNanos();
        this.extraSink = config.metrics();
        this.pool = HostPool.anonymous(config.poolBytes());
        try {
            this.prefaultNanos = config.prefault() ? pool.prefault(config.copyThreads()) : 0;
            this.allocator = new OffsetAllocator(pool.size());
            this.transfer = config.transfer().apply(pool);
        } catch (RuntimeException | Error e) {
            pool.close();
            throw e;
        }
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

    /** Creates an engine with its own host pool and copy engine. */
    public static PegaEngine create(EngineConfig config) {
        if (config == null) {
            throw new InvalidArgumentException("engine config is null; expected EngineConfig.builder()...build()");
        }
        return new PegaEngine(config);
    }

    // ---------------------------------------------------------------- registration

    /**
     * Registers an instance. Registering the same spec again is a no-op; the same id with a
     * different spec is a {@link TopologyMismatchException}.
     */
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
     * (layer, TP rank) needs exactly one owner with the same geometry across ranks, and the
     * namespace must not already hold a different layout. A rejected worker is not kept.
     */
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
        for (int i = 0; i < regions.size(); i++) {
            for (int j = i + 1; j < regions.size(); j++) {
                if (regions.get(i).overlaps(regions.get(j))) {
                    throw new InvalidArgumentException("layers '" + regions.get(i).layerName() + "' and '"
                            + regions.get(j).layerName() + "' of worker " + worker.workerRank()
                            + " overlap in memory; expected disjoint regions");
                }
            }
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
                if (byTp[tpRank] >= 0) {
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
     * Removes an instance: its leases are released and its copies in flight are awaited
     * (its regions may be freed once this returns). Cached blocks stay for other instances.
     */
    public void unregisterInstance(String instanceId) {
        List<CompletableFuture<?>> waitFor;
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
            waitFor = new ArrayList<>(inst.pending);
        } finally {
            lock.unlock();
        }
        awaitQuietly(waitFor);
    }

    // ---------------------------------------------------------------- save

    /** Saves every layer of the worker for the given blocks. See {@link #save(String, int, List, long[], byte[][])}. */
    public CompletableFuture<SaveResult> save(String instanceId, int workerRank, long[] blockIds, byte[][] hashes) {
        return save(instanceId, workerRank, null, blockIds, hashes);
    }

    /**
     * Copies the worker's slots of {@code blockIds[i]} into the pool under {@code hashes[i]}
     * for the named layers ({@code null}: all of the worker's layers). Blocks already resident,
     * and slots already saved or being saved, are skipped. Host memory is allocated now,
     * evicting least recently used unreferenced blocks if needed; the copy runs
     * asynchronously and a block becomes visible when its last slot lands.
     *
     * @throws PoolExhaustedException when the pool cannot hold the new slots even after
     *     evicting every unreferenced block; nothing was allocated
     */
    public CompletableFuture<SaveResult> save(
            String instanceId, int workerRank, List<String> layerNames, long[] blockIds, byte[][] hashes) {
        return save(instanceId, workerRank, layerNames, blockIds, hashes, 0);
    }

    /**
     * As above, ordered after the work queued so far on CUDA stream {@code waitStream} (a
     * {@code CUstream}; 0 = none): the copy does not read the blocks before the caller's
     * kernels that write them have run. Host copy engines have nothing to order against.
     */
    public CompletableFuture<SaveResult> save(String instanceId, int workerRank, List<String> layerNames,
            long[] blockIds, byte[][] hashes, long waitStream) {
        if (blockIds == null || hashes == null) {
            throw new InvalidArgumentException("save: blockIds and hashes must not be null");
        }
        if (blockIds.length != hashes.length) {
            throw new InvalidArgumentException("save: " + blockIds.length + " block ids but " + hashes.length
                    + " hashes; expected equal lengths");
        }
        for (int i = 0; i < hashes.length; i++) {
            HashKey.validate(hashes[i], i, "hashes");
        }
        Instance inst;
        List<SavePlan> plans = new ArrayList<>();
        int[] regionIdx;
        Instance.Worker worker;
        CompletableFuture<SaveResult> result = new CompletableFuture<>();
        lock.lock();
        try {
            checkOpen();
            inst = sealedInstance(instanceId);
            worker = worker(inst, workerRank);
            regionIdx = selectRegions(inst, worker, layerNames);
            for (int r : regionIdx) {
                checkBlockIds(blockIds, "blockIds", worker.regions[r]);
            }
            planSave(inst, worker, regionIdx, blockIds, hashes, plans);
            if (!plans.isEmpty()) {
                track(inst, result);
            }
        } finally {
            lock.unlock();
        }
        int skipped = hashes.length - plans.size();
        count(Counter.SAVE_REQUESTS, 1);
        count(Counter.SAVE_SKIPPED_BLOCKS, skipped);
        if (plans.isEmpty()) {
            result.complete(new SaveResult(0, skipped, 0));
            return result;
        }
        long[] ids = plans.stream().mapToLong(p -> p.blockId).toArray();
        try {
            CopyBatch batch = new CopyBatch(CopyBatch.Direction.TO_HOST, plans.size() * regionIdx.length * 2).waitFor(waitStream);
            int tpRank = worker.spec.tpRank();
            NamespaceLayout layout = inst.ns.layout;
            for (SavePlan p : plans) {
                for (int r : p.regions) {
                    LayerRegion region = worker.regions[r];
                    long host = p.block.slotOffset[layout.slot(worker.layerIds[r], tpRank)];
                    for (int s = 0; s < region.segments(); s++) {
                        batch.add(region.pieceAddress(p.blockId, s), host + s * region.segmentBytes(), region.segmentBytes());
                    }
                }
            }
            long start = clock.getAsLong();
            transfer.submit(batch).whenComplete((ok, err) -> {
                try {
                    long nanos = clock.getAsLong() - start;
                    commitSave(inst, worker, plans, err == null);
                    if (err != null) {
                        count(Counter.SAVE_FAILURES, 1);
                        result.completeExceptionally(new TransferFailedException("save copy for instance '" + instanceId
                                + "' worker " + workerRank + " failed: " + err, ids, err));
                        return;
                    }
                    count(Counter.SAVE_BLOCKS, plans.size());
                    count(Counter.SAVE_BYTES, batch.totalBytes());
                    count(Counter.SAVE_NANOS, nanos);
                    result.complete(new SaveResult(plans.size(), skipped, batch.totalBytes()));
                } catch (Throwable t) {
                    result.completeExceptionally(t);
                }
            });
        } catch (Throwable t) {
            commitSave(inst, worker, plans, false);
            count(Counter.SAVE_FAILURES, 1);
            result.completeExceptionally(new TransferFailedException("save copy for instance '" + instanceId
                    + "' worker " + workerRank + " could not start: " + t, ids, t));
        }
        return result;
    }

    /** One block of a save: which of the worker's regions it writes and the allocation backing them. */
    private static final class SavePlan {
        final long blockId;
        final HashKey key;
        Block block;
        final int[] regions;
        final long bytes;
        long allocation;

        SavePlan(long blockId, HashKey key, Block block, int[] regions, long bytes) {
            this.blockId = blockId;
            this.key = key;
            this.block = block;
            this.regions = regions;
            this.bytes = bytes;
        }
    }

    /** Under lock: decides what to write, checks capacity, then allocates and claims slots. */
    private void planSave(Instance inst, Instance.Worker worker, int[] regionIdx, long[] blockIds, byte[][] hashes,
            List<SavePlan> plans) {
        NamespaceIndex ns = inst.ns;
        NamespaceLayout layout = ns.layout;
        int tpRank = worker.spec.tpRank();
        Set<HashKey> seen = new HashSet<>();
        long unit = allocator.unitBytes();
        long needed = 0;
        for (int i = 0; i < hashes.length; i++) {
            HashKey key = HashKey.of(hashes[i]);
            if (!seen.add(key)) {
                continue;
            }
            Block b = ns.blocks.get(hashes[i]);
            if (b != null && b.sealed) {
                continue;
            }
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
            plans.add(new SavePlan(blockIds[i], key, b, Arrays.copyOf(todo, n), bytes));
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
            SavePlan plan = plans.get(p);
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
    private void rollbackSave(Instance.Worker worker, NamespaceLayout layout, List<SavePlan> done) {
        int tpRank = worker.spec.tpRank();
        for (SavePlan plan : done) {
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

    private void commitSave(Instance inst, Instance.Worker worker, List<SavePlan> plans, boolean ok) {
        NamespaceLayout layout = inst.ns.layout;
        int tpRank = worker.spec.tpRank();
        lock.lock();
        try {
            if (!ok) {
                rollbackSave(worker, layout, plans);
                return;
            }
            long now = clock.getAsLong();
            for (SavePlan plan : plans) {
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
        } finally {
            lock.unlock();
        }
    }

    // ---------------------------------------------------------------- query

    /**
     * Finds the longest prefix of {@code hashes} whose blocks are all resident (sealed) and
     * returns its length with a lease that pins those blocks until every worker loaded them,
     * the lease is released, or it expires. Refreshes the blocks' recency.
     */
    public QueryResult query(String instanceId, byte[][] hashes) {
        if (hashes == null) {
            throw new InvalidArgumentException("query: hashes must not be null");
        }
        for (int i = 0; i < hashes.length; i++) {
            HashKey.validate(hashes[i], i, "hashes");
        }
        LeaseId leaseId = null;
        int hit = 0;
        lock.lock();
        try {
            checkOpen();
            Instance inst = sealedInstance(instanceId);
            long now = clock.getAsLong();
            expireLeases(now);
            Block[] found = new Block[hashes.length];
            hit = inst.ns.blocks.sealedPrefix(hashes, found);
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
        } finally {
            lock.unlock();
        }
        count(Counter.QUERY_REQUESTS, 1);
        count(Counter.HIT_BLOCKS, hit);
        count(Counter.MISS_BLOCKS, hashes.length - hit);
        if (hit > 0) {
            count(Counter.LEASES_CREATED, 1);
        }
        return new QueryResult(hit, leaseId);
    }

    /** Drops a lease and all its remaining shares. */
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
     * Consumes this worker's share of a lease and copies the leased blocks' slots for the
     * worker's layers into {@code dstBlockIds} (one per leased block, in order). The blocks
     * stay pinned until the copy finishes. The future fails with a
     * {@link TransferFailedException} naming the destination block ids if the copy fails.
     */
    public CompletableFuture<LoadResult> load(String instanceId, int workerRank, LeaseId leaseId, long[] dstBlockIds) {
        if (leaseId == null || dstBlockIds == null) {
            throw new InvalidArgumentException("load: lease and dstBlockIds must not be null");
        }
        Instance inst;
        Instance.Worker worker;
        Block[] blocks;
        CompletableFuture<LoadResult> result = new CompletableFuture<>();
        lock.lock();
        try {
            checkOpen();
            inst = sealedInstance(instanceId);
            worker = worker(inst, workerRank);
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
            for (LayerRegion r : worker.regions) {
                checkBlockIds(dstBlockIds, "dstBlockIds", r);
            }
            blocks = lease.blocks;
            lease.consumedBy.set(workerRank);
            for (Block b : blocks) {
                pin(b);
            }
            if (lease.fullyConsumed()) {
                leases.remove(leaseId);
                unpinAll(blocks);
            }
            track(inst, result);
        } finally {
            lock.unlock();
        }
        count(Counter.LOAD_REQUESTS, 1);
        long[] dst = dstBlockIds.clone();
        try {
            NamespaceLayout layout = inst.ns.layout;
            int tpRank = worker.spec.tpRank();
            CopyBatch batch = new CopyBatch(CopyBatch.Direction.TO_DEVICE, blocks.length * worker.regions.length * 2);
            for (int i = 0; i < blocks.length; i++) {
                for (int r = 0; r < worker.regions.length; r++) {
                    LayerRegion region = worker.regions[r];
                    long host = blocks[i].slotOffset[layout.slot(worker.layerIds[r], tpRank)];
                    for (int s = 0; s < region.segments(); s++) {
                        batch.add(region.pieceAddress(dst[i], s), host + s * region.segmentBytes(), region.segmentBytes());
                    }
                }
            }
            long start = clock.getAsLong();
            transfer.submit(batch).whenComplete((ok, err) -> {
                try {
                    long nanos = clock.getAsLong() - start;
                    unpinLocked(blocks);
                    if (err != null) {
                        count(Counter.LOAD_FAILURES, 1);
                        result.completeExceptionally(new TransferFailedException("load copy for instance '" + instanceId
                                + "' worker " + workerRank + " failed: " + err, dst, err));
                        return;
                    }
                    count(Counter.LOAD_BLOCKS, blocks.length);
                    count(Counter.LOAD_BYTES, batch.totalBytes());
                    count(Counter.LOAD_NANOS, nanos);
                    result.complete(new LoadResult(blocks.length, batch.totalBytes()));
                } catch (Throwable t) {
                    result.completeExceptionally(t);
                }
            });
        } catch (Throwable t) {
            unpinLocked(blocks);
            count(Counter.LOAD_FAILURES, 1);
            result.completeExceptionally(new TransferFailedException("load copy for instance '" + instanceId
                    + "' worker " + workerRank + " could not start: " + t, dst, t));
        }
        return result;
    }

    private void unpinLocked(Block[] blocks) {
        lock.lock();
        try {
            unpinAll(blocks);
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

    /** Time spent committing pool pages at start (0 unless {@link EngineConfig#prefault()}). */
    public long prefaultNanos() {
        return prefaultNanos;
    }

    /** Name of the copy engine in use ({@code host}, later {@code cuda}). */
    public String transferName() {
        return transfer.name();
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

    /**
     * Waits for copies in flight, drops every lease and block, and unmaps the pool. Fails
     * with {@link IllegalStateException} if pool accounting does not return to zero.
     */
    @Override
    public void close() {
        lock.lock();
        try {
            if (closed) {
                return;
            }
            closed = true;
        } finally {
            lock.unlock();
        }
        if (sweeper != null) {
            sweeper.shutdownNow();
        }
        awaitQuietly(new ArrayList<>(pending));
        try {
            lock.lock();
            try {
                leases.clear();
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
        } finally {
            transfer.close();
            pool.close();
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

    private <T> void track(Instance inst, CompletableFuture<T> f) {
        pending.add(f);
        inst.pending.add(f);
        f.whenComplete((r, e) -> {
            pending.remove(f);
            inst.pending.remove(f);
        });
    }

    private static void awaitQuietly(List<CompletableFuture<?>> futures) {
        for (CompletableFuture<?> f : futures) {
            try {
                f.join();
            } catch (RuntimeException ignored) {
                // the caller of save/load sees the failure through its own future
            }
        }
    }

    private static String abbreviate(Set<String> ids) {
        List<String> sorted = new ArrayList<>(ids);
        sorted.sort(null);
        return sorted.size() <= 8 ? sorted.toString() : sorted.subList(0, 8) + " and " + (sorted.size() - 8) + " more";
    }
}
