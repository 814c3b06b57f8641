package io.pegaflow.engine.store;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.BlockStore;
import io.pegaflow.engine.CopyPlan;
import io.pegaflow.engine.CopyResult;
import io.pegaflow.engine.EngineClosedException;
import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.EngineStats;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.PermissionDeniedException;
import io.pegaflow.engine.PoolExhaustedException;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.QuotaExceededException;
import io.pegaflow.engine.Token;
import io.pegaflow.engine.TopologyMismatchException;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.metrics.CounterMetrics;
import io.pegaflow.engine.metrics.Gauge;
import io.pegaflow.engine.metrics.Histogram;
import io.pegaflow.engine.metrics.MetricsSink;
import io.pegaflow.engine.ssd.SsdConfig;
import io.pegaflow.engine.ssd.SsdTier;
import io.pegaflow.engine.store.OpenCopy.OpenLoad;
import io.pegaflow.engine.store.OpenCopy.Reservation;
import java.lang.foreign.MemorySegment;
import java.util.EnumMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.function.LongSupplier;

/**
 * The control plane of the block store: instances and their topology, the block index, pool
 * offsets (not the memory), leases, eviction. It decides what is copied where; it never
 * touches KV bytes. {@link PegaEngine} pairs it with a pool mapping and a copy engine in one
 * process; pegaflow-server serves it to workers that map the shared pool and copy
 * themselves. See {@code io.pegaflow.engine}'s {@code package-info.java} for the model and
 * its invariants, and this package's for the parts of the store.
 *
 * <p>A save is two calls: {@link #reserveSave} allocates pool space, claims the slots and
 * returns where each one goes; {@link #endCopy} seals what landed (or rolls back). A load
 * is {@link #beginLoad} (consumes the worker's lease share, pins the blocks, returns where
 * each slot is) and {@link #endCopy}. Every method may be called from any thread; each runs
 * under one lock and none waits for a copy.
 *
 * <p>The store is the arena of that lock ({@link StoreLock}): it holds the instances
 * ({@link InstanceRegistry}) and the leases ({@link LeaseTable}), ends copies, sweeps, and
 * aggregates named collaborators that run under the same lock: {@link PoolSpace} (allocation,
 * eviction, sealing), {@link SavePath} and {@link LoadPath} (the write and read paths),
 * {@link OpenCopies} (copies between plan and end, and the orphans of unregistered instances),
 * {@link SsdReadBack} (the SSD tier), {@link PeerShare} (other hosts' pools) and
 * {@link OperatorOps} (the operator's calls).
 * <p>Size: the arena under its one lock; its parts have their own classes ({@code PoolSpace}, {@code SsdReadBack}, {@code PeerShare}, {@code OpenCopies}).
 */
public final class LocalStore implements BlockStore {
    private final CounterMetrics counters = new CounterMetrics();
    private final MetricsSink extraSink;
    private final LongSupplier clock;
    private final long inflightTtlNanos;
    private final Quotas quotas;
    private final ScheduledExecutorService sweeper;

    private final StoreLock lock = new StoreLock();
    // --- guarded by lock ---
    private final InstanceRegistry registry = new InstanceRegistry();
    private final PoolSpace pool;
    private final LeaseTable leases;
    private final OpenCopies copies;
    private final SavePath saves;
    private final LoadPath loads;
    private final SsdReadBack readBack;
    private final PeerShare peers;
    private final OperatorOps operator;
    /** Blocks stored into and removed from the pool, for routers (pegaflow-server's /admin/events). */
    private final KvEventLog events;
    /** Admission and eviction beyond "every block, LRU" (flags; both off by default). */
    private final CachePolicy policy;
    /** Distinct blocks asked for per window: the hit-rate ceiling (queries' final answers only). */
    private final io.pegaflow.engine.metrics.DistinctBlocks distinct;
    // --- end guarded ---

    /** A store handing out offsets in a pool of {@code capacityBytes}. */
    public LocalStore(EngineConfig config, long capacityBytes) {
        if (config == null) {
            throw new InvalidArgumentException("engine config is null; expected EngineConfig.builder()...build()");
        }
        this.clock = config.nanoClock();
        this.distinct = io.pegaflow.engine.metrics.DistinctBlocks.of(config.hitCeilingWindows());
        this.events = new KvEventLog(config.kvEventCapacity());
        this.inflightTtlNanos = config.inflightTtl().toNanos();
        this.quotas = config.quotas();
        this.extraSink = config.metrics();
        this.policy = CachePolicy.of(config.admission(), config.eviction());
        this.pool = new PoolSpace(capacityBytes, this::count, new PoolSpace.Residency() {
            @Override
            public void sealed(Block b, boolean saved) {
                b.sealedNanos = clock.getAsLong();
                events.append(KvEventLog.Kind.STORED, KvEventLog.CPU, b.ns.namespace, b.key.bytes());
                if (saved) {
                    readBack.offer(b);
                }
                if (peers.advertise(b)) {
                    events.append(KvEventLog.Kind.STORED, KvEventLog.REMOTE, b.ns.namespace, b.key.bytes());
                }
            }

            @Override
            public void dropped(Block b) {
                observe(Histogram.BLOCK_RESIDENCE, clock.getAsLong() - b.sealedNanos);
                events.append(KvEventLog.Kind.REMOVED, KvEventLog.CPU, b.ns.namespace, b.key.bytes());
                if (peers.evicted(b)) {
                    events.append(KvEventLog.Kind.REMOVED, KvEventLog.REMOTE, b.ns.namespace, b.key.bytes());
                }
            }
        }, policy);
        this.leases = new LeaseTable(config.leaseTtl().toNanos(), pool::pinAll, pool::unpinAll);
        if (config.sweepInterval().isZero()) {
            this.sweeper = null;
        } else {
            this.sweeper = Executors.newSingleThreadScheduledExecutor(r -> {
                Thread t = new Thread(r, "pegaflow-sweeper");
                t.setDaemon(true);
                return t;
            });
        }
        this.copies = new OpenCopies(lock, pool, this::count, clock, config.copyTtl().toNanos(), sweeper);
        this.saves = new SavePath(lock, registry, pool, copies, quotas, policy, this::count, clock);
        this.readBack = new SsdReadBack(lock, pool, this::count, clock, events);
        this.peers = new PeerShare(lock, pool, registry, copies, this::count, clock);
        this.loads = new LoadPath(lock, registry, pool, leases, copies, readBack, peers, quotas, policy, this::count, clock,
                distinct);
        this.operator = new OperatorOps(lock, pool, registry, readBack, this::count, clock);
        if (extraSink != null) {
            registerGauges(extraSink);
        }
        if (sweeper != null) {
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
        if (config == null || pool == null || pool.byteSize() < this.pool.capacityBytes()) {
            throw new InvalidArgumentException("SSD tier " + config + " with pool memory " + pool
                    + "; expected both, the pool at least " + this.pool.capacityBytes() + " bytes");
        }
        return lock.locked(() -> {
            lock.checkOpen();
            return readBack.attach(config, pool);
        });
    }

    /**
     * Adds other hosts' pools ({@link RemoteTier}): every block that becomes resident or is
     * evicted from now on is reported to it, and a query that misses locally asks it.
     * {@code pool} is the pool's memory as this process maps it (fetched blocks land there).
     */
    public void attachRemote(RemoteTier tier, MemorySegment pool) {
        if (tier == null || pool == null || pool.byteSize() < this.pool.capacityBytes()) {
            throw new InvalidArgumentException("remote tier " + tier + " with pool memory " + pool
                    + "; expected both, the pool at least " + this.pool.capacityBytes() + " bytes");
        }
        lock.locked(() -> {
            lock.checkOpen();
            peers.attach(tier, pool);
        });
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
        return readBack.tier();
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
        lock.locked(() -> {
            lock.checkOpen();
            registry.register(spec);
        });
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
        WorkerSpec.check(instanceId, worker);
        lock.locked(() -> {
            lock.checkOpen();
            registry.addWorker(instanceId, worker);
        });
    }

    /** Counts the instance's saves against tenant {@code owner} (-1: none; {@link Quotas#tenantPoolBytes}). */
    public void assignOwner(String instanceId, int owner) {
        lock.locked(() -> {
            registry.get(instanceId).owner = Math.max(-1, owner);
        });
    }

    /** Resident pool bytes by owner ({@link #assignOwner}): what each tenant's saves hold. */
    public java.util.Map<Integer, Long> ownedPoolBytes() {
        return lock.locked(() -> pool.ownedBytes());
    }

    /** Whether every worker of the instance has registered. */
    @Override
    public boolean isSealed(String instanceId) {
        return lock.locked(() -> {
            lock.checkOpen();
            return registry.get(instanceId).sealed();
        });
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
        lock.locked(() -> {
            lock.checkOpen();
            Instance inst = registry.remove(instanceId);
            leases.removeAll(inst);
            copies.orphan(inst);
        });
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
        return saves.reserve(instanceId, workerRank, layerNames, blockIds, hashes);
    }

    // ---------------------------------------------------------------- query

    /** See {@link BlockStore#flush}: the remote tier's queue of advertisements, sent (not under the lock). */
    @Override
    public void flush() {
        peers.flush();
    }

    /**
     * Finds the longest prefix of {@code hashes} whose blocks are all resident (sealed) and
     * returns its length with a lease that pins those blocks until every worker loaded them,
     * the lease is released, or it expires. Refreshes the blocks' recency. Reads the packed
     * hashes in place: no per-hash arrays.
     */
    @Override
    public QueryResult query(String instanceId, BlockHashes hashes) {
        return loads.query(instanceId, hashes, -1);
    }

    @Override
    public QueryResult queryAndBegin(String instanceId, BlockHashes hashes, int workerRank) {
        BlockStore.checkBeginRank(workerRank);
        return loads.query(instanceId, hashes, workerRank);
    }

    /** Drops a lease and all its remaining shares. */
    @Override
    public void release(String instanceId, Token leaseId) {
        loads.release(instanceId, leaseId);
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
        loads.injectLoadFailures(n);
    }

    @Override
    public CopyPlan beginLoad(String instanceId, int workerRank, Token leaseId, long[] dstBlockIds, int planBlocks) {
        return loads.beginLoad(instanceId, workerRank, leaseId, dstBlockIds, planBlocks);
    }

    /**
     * The runs of an open load for its leased blocks {@code fromBlock .. toBlock - 1}: the rest
     * of a plan that {@link #beginLoad(String, int, Token, long[], int)} handed out in part, so
     * the copy of the first part overlaps planning the rest. Only the instance and worker the
     * load was issued to may ask; the load is still ended once, by {@link #endCopy}.
     */
    @Override
    public CopyPlan planRest(String instanceId, int workerRank, Token planId, int fromBlock, int toBlock) {
        return loads.planRest(instanceId, workerRank, planId, fromBlock, toBlock);
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
        return lock.locked(() -> {
            OpenCopy op = openCopy(instanceId, planId);
            copies.ended(planId, op);
            boolean save = op instanceof Reservation;
            int blocks;
            switch (op) {
                case Reservation r -> {
                    saves.commit(r.worker(), r.blocks(), ok);
                    blocks = r.blocks().size();
                }
                case OpenLoad l -> {
                    pool.unpinAll(l.blocks());
                    blocks = l.blocks().length;
                    if (l.byQuery()) {
                        count(Counter.LOAD_REQUESTS, 1); // a load a query began: counted once a copy took it
                    }
                }
            }
            if (ok) {
                count(save ? Counter.SAVE_BLOCKS : Counter.LOAD_BLOCKS, blocks);
                count(save ? Counter.SAVE_BYTES : Counter.LOAD_BYTES, bytes);
                count(save ? Counter.SAVE_NANOS : Counter.LOAD_NANOS, nanos);
                observe(save ? Histogram.SAVE_COPY : Histogram.LOAD_COPY, nanos);
            } else {
                count(save ? Counter.SAVE_FAILURES : Counter.LOAD_FAILURES, 1);
            }
            return new CopyResult(ok ? blocks : 0, 0, ok ? bytes : 0);
        });
    }

    /**
     * Rolls back a load that {@link #queryAndBegin} began and no copy took (its lease released
     * instead): its blocks are unpinned as a failed load's, and it counts as unused ({@link
     * Counter#LOADS_UNUSED}), not as a failure. Any other copy is refused, and nothing changes.
     */
    @Override
    public void dropBegun(String instanceId, Token planId) {
        if (planId == null) {
            throw new InvalidArgumentException("drop of a begun load: the copy id is null");
        }
        lock.locked(() -> {
            OpenCopy op = openCopy(instanceId, planId);
            if (!(op instanceof OpenLoad l) || !l.byQuery()) {
                throw new InvalidArgumentException("copy " + planId + " is not a load a query began; end it with endCopy");
            }
            copies.ended(planId, op);
            pool.unpinAll(l.blocks());
            count(Counter.LOADS_UNUSED, 1);
        });
    }

    /** Under lock: the open copy {@code planId}, issued to {@code instanceId}. */
    private OpenCopy openCopy(String instanceId, Token planId) {
        lock.checkOpen();
        OpenCopy op = copies.get(planId);
        if (op == null) {
            throw new InvalidArgumentException("copy " + planId
                    + " is unknown: already ended, rolled back, expired, or its instance was unregistered");
        }
        op.instance().checkOwner(instanceId, "copy " + planId);
        return op;
    }

    // ---------------------------------------------------------------- other hosts (cross-node sharing: PeerShare)

    /**
     * Peer side: pins the resident prefix of {@code hashes} in {@code namespace} for a peer to
     * read, until {@link #releaseTransfer} or {@code ttl}, whichever is first. Null when the
     * namespace is unknown here or its first block is not resident.
     */
    public TransferPin pinForTransfer(String namespace, BlockHashes hashes, java.time.Duration ttl) {
        return peers.pinForTransfer(namespace, hashes, ttl);
    }

    /** Peer side: ends a pin; false when it is unknown (already released or expired). */
    public boolean releaseTransfer(Token id) {
        return peers.releaseTransfer(id);
    }

    /**
     * Whether pin {@code id} still holds its blocks, before its deadline. An owner asks before
     * each batch it sends: a pin that expired mid-read (its blocks may be evicted and their space
     * reused) ends the read instead of sending what the space holds by then.
     */
    public boolean transferLive(Token id) {
        return peers.transferLive(id);
    }

    /** Pins held for peers' reads now. */
    public int transferPins() {
        return lock.locked(peers::pins);
    }

    /**
     * Fetching side: reserves pool space for a run of blocks a peer holds, in order, stopping
     * at the first one there is no unpinned space for (prefix and run capped at half the pool,
     * as a read back from SSD is). Reserved blocks are indexed as being fetched: queries for
     * them answer "not yet" until {@link #completeFetch}. Null when the namespace is unknown,
     * the peer's slot sizes differ from it, or nothing fits.
     */
    public FetchReservation reserveFetch(String namespace, BlockHashes run, int alreadyHit, long[] slotBytes) {
        return peers.reserveFetch(namespace, run, alreadyHit, slotBytes);
    }

    /**
     * Fetching side: seals the reserved blocks whose bytes arrived and were checked
     * ({@code ok[i]}), and drops the others' reservations. Sealed blocks are served like
     * local ones and advertised.
     */
    public void completeFetch(FetchReservation r, boolean[] ok) {
        peers.completeFetch(r, ok);
    }

    /**
     * Calls {@code each} with every resident block's namespace and hash (copied under the
     * lock, called outside it): a registry that lost its entries advertises them again.
     */
    public void forEachResident(java.util.function.BiConsumer<String, byte[]> each) {
        peers.forEachResident(each);
    }

    // ---------------------------------------------------------------- the operator's calls (pegaflow-server's /admin: OperatorOps)

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
        return operator.clear(namespace, dram, ssd);
    }

    /** See {@link BlockStore#resetCache}: {@link #clear} of the instance's namespace, both tiers (nothing when it has no blocks yet). */
    @Override
    public Cleared resetCache(String instanceId) {
        return operator.resetCache(instanceId);
    }

    /** See {@link BlockStore#kvEvents}. */
    @Override
    public KvEventLog.Batch kvEvents(String instanceId, long after, int max) {
        return events.after(after, max, operator.namespaceOf(instanceId));
    }

    /** See {@link BlockStore#demote}. */
    @Override
    public int demote(String instanceId, BlockHashes hashes) {
        if (hashes == null) {
            throw new InvalidArgumentException("demote: hashes must not be null");
        }
        return lock.locked(() -> {
            lock.checkOpen();
            return pool.demote(registry.sealed(instanceId).ns, hashes);
        });
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
        return operator.pin(namespace, hashes);
    }

    /** Releases the operator's pins on any of {@code hashes} in {@code namespace}: how many were pinned; -1 when the namespace is unknown. */
    public int unpin(String namespace, BlockHashes hashes) {
        return operator.unpin(namespace, hashes);
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
        return operator.warm(namespace, hashes);
    }

    /** One namespace as the operator sees it: blocks indexed (resident, being saved or read back) and pinned. */
    public record NamespaceSummary(String namespace, int blocks, int pinnedBlocks, long pinnedBytes) {}

    /** Every namespace a sealed instance created, by name (pegaflow-server's {@code GET /admin/status}). */
    public List<NamespaceSummary> namespaces() {
        return operator.namespaces();
    }

    /** The most bytes the operator's pins may hold together (half the pool). */
    public long maxPinnedBytes() {
        return operator.pins().maxBytes();
    }

    // ---------------------------------------------------------------- sweeping, stats, close

    /**
     * Expires leases past their TTL, rolls back saves and loads open longer than the copy TTL
     * (their copier died without a session to say so) and those of unregistered instances
     * whose hold ended, and drops partially saved blocks past the in-flight TTL.
     */
    public void sweep() {
        lock.locked(() -> {
            lock.checkOpen();
            long now = clock.getAsLong();
            loads.expireLeases(now);
            peers.expireTransfers(now);
            copies.expire(now); // before the in-flight blocks: a rolled-back save may leave them unreferenced
            pool.expireInflight(now, inflightTtlNanos);
        });
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
        lock.locked(() -> {
            for (Gauge gauge : Gauge.values()) {
                g.put(gauge, gaugeValue(gauge));
            }
        });
        return new EngineStats(g, counters.counters());
    }

    /**
     * Checks the engine's internal invariants (for tests and stress runs): slot states,
     * LRU membership, reference counts, and exact pool accounting. Throws
     * {@link IllegalStateException} describing the first violation.
     */
    public void verifyInvariants() {
        lock.locked(() -> {
            PoolSpace.Tally tally = pool.verifyBlocks(registry.namespaces());
            leases.verify();
            Map<Instance, Integer> opened = copies.perInstance();
            for (String id : registry.ids()) {
                Instance inst = registry.get(id);
                int n = opened.getOrDefault(inst, 0);
                require(inst.openCopies == n, "instance '" + id + "' has " + n + " open copies but counts " + inst.openCopies);
                leases.verifyCounts(inst);
            }
            pool.verifyTotals(tally);
            operator.pins().verify();
        });
    }

    /** Throws {@link IllegalStateException} unless {@code ok}; also used by the collaborators' checks. */
    static void require(boolean ok, String message) {
        if (!ok) {
            throw new IllegalStateException("engine invariant violated: " + message);
        }
    }

    /** Whether {@code instanceId} is registered (sealed or not). */
    public boolean isRegistered(String instanceId) {
        return lock.locked(() -> registry.contains(instanceId));
    }

    /** Registered instance ids, sorted. */
    public List<String> instanceIds() {
        return lock.locked(registry::ids);
    }

    /** Open reservations and loads (copies the caller has started but not finished). */
    public int openOperations() {
        return lock.locked(copies::size);
    }

    /**
     * Drops every lease, open operation and block. Callers stop their copies first. Fails with
     * {@link IllegalStateException} if pool accounting does not return to zero.
     */
    @Override
    public void close() {
        SsdTier tier = readBack.tier();
        if (tier != null) {
            tier.close(); // first, unlocked: its threads finish their copies (they take this lock)
        }
        peers.closeChecksums(); // likewise: its thread reads the pool and takes this lock
        lock.locked(() -> {
            if (!lock.markClosed()) {
                return;
            }
            if (sweeper != null) {
                sweeper.shutdownNow();
            }
            leases.clear();
            copies.clear();
            peers.clear();
            operator.pins().clear();
            readBack.clear();
            for (NamespaceIndex ns : registry.namespaces()) {
                for (Block b : ns.blocks.values()) {
                    pool.freeAllocations(b);
                }
                ns.blocks.clear();
            }
            pool.clear();
        });
    }

    // ---------------------------------------------------------------- usage, gauges, counters

    /** What an instance holds now, against its {@link Quotas}. */
    public record Usage(int leases, long leasedBlocks, int openCopies) {}

    /** Every registered instance's {@link Usage} (one snapshot under the lock; /metrics). */
    public Map<String, Usage> usage() {
        return lock.locked(() -> {
            Map<String, Usage> out = new java.util.TreeMap<>();
            for (String id : registry.ids()) {
                Instance inst = registry.get(id);
                out.put(id, new Usage(inst.leases, inst.leasedBlocks, inst.openCopies));
            }
            return out;
        });
    }

    private long gaugeValue(Gauge gauge) {
        SsdTier ssd = readBack.tier();
        return switch (gauge) {
            case POOL_CAPACITY_BYTES -> pool.capacityBytes();
            case POOL_USED_BYTES -> pool.usedBytes();
            case RESIDENT_BLOCKS -> pool.residentBlocks();
            case RESIDENT_BYTES -> pool.residentBytes();
            case INFLIGHT_BLOCKS -> pool.inflightBlocks();
            case PINNED_BLOCKS -> pool.lru().pinnedBlocks();
            case ACTIVE_LEASES -> leases.size();
            case SSD_BLOCKS -> ssd == null ? 0 : ssd.blocks();
            case SSD_BYTES -> ssd == null ? 0 : ssd.bytes();
            case SSD_PREFETCH_INFLIGHT -> readBack.inFlight();
            case ADMIN_PINNED_BLOCKS -> operator.pins().blocks();
            case ADMIN_PINNED_BYTES -> operator.pins().bytes();
        };
    }

    private void registerGauges(MetricsSink sink) {
        for (Gauge gauge : Gauge.values()) {
            sink.gauge(gauge, () -> lock.locked(() -> gaugeValue(gauge)));
        }
    }

    private void observe(Histogram h, long nanos) {
        if (extraSink != null) {
            extraSink.observe(h, Math.max(0, nanos));
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
