package io.pegaflow.engine;

import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.store.KvEventLog;
import io.pegaflow.engine.store.LocalStore;
import io.pegaflow.engine.transfer.TransferEngine;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.locks.ReentrantReadWriteLock;
import java.util.function.Function;
import java.util.function.LongSupplier;

/**
 * The KV block store as a worker process uses it: a control plane ({@link BlockStore}) that
 * decides which pool offsets each save writes and each load reads, this process's mapping
 * of the pool, a copy engine, and the registered regions the bytes come from and go to.
 *
 * <ul>
 *   <li><b>Embedded</b> ({@link #create}): the control plane is a {@link LocalStore} in this
 *       process and the pool is private memory.</li>
 *   <li><b>Attached</b> ({@link #attach}): the control plane is pegaflow-server, the pool is
 *       the server's shared memory mapped here; this process still does its own copies.</li>
 * </ul>
 *
 * <p>Threading: every method may be called from any thread. {@link #save} and {@link #load}
 * return once the copy is submitted. A save's future completes when its bytes have landed
 * and its seal is told to the control plane beside it, as the original PegaFlow inserts a
 * save into its cache after answering; a load's the same way when its plan promised to hold
 * its pins for longer than the copy took ({@link CopyPlan#holdNanos}), otherwise after the
 * control plane has been told (its end succeeding then proves its slots stayed pinned); a
 * failed copy's after it is rolled back ({@link CopyEnds} holds these rules in one table, and
 * {@link CopyBatches} turns plans into the copy engine's batches). This engine's own {@link #query}, {@link #stats} and
 * {@link #flush} wait for those seals, so they see every save whose future completed;
 * another process sees it a round trip later (or after this engine's {@link #flush}, the
 * visibility barrier). {@link #close()}
 * and {@link #unregisterInstance} wait for copies in flight and their ends, so the caller
 * may free its regions afterwards.
 *
 * <p>Size: one method per call of the engine's public API (registration, save, query, load,
 * release, the operator's calls, stats, close), each a few lines around the one rule of
 * tracking calls in flight ({@code startOp}/{@code endOp}); the rules of a copy's end are in
 * {@code CopyEnds}, its batches in {@code CopyBatches}, the control plane in {@code LocalStore}.
 */
public final class PegaEngine implements AutoCloseable {
    private final BlockStore store;
    private final LocalStore local;
    private final HostPool pool;
    private final TransferEngine transfer;
    private final LongSupplier clock;
    private final long prefaultNanos;
    private final Map<String, Map<Integer, LayerRegion[]>> regions = new ConcurrentHashMap<>();
    private static final System.Logger LOG = System.getLogger(PegaEngine.class.getName());
    private final Map<String, Set<CompletableFuture<?>>> pending = new ConcurrentHashMap<>();
    /** When each copy ends, and the ends told beside their futures. */
    private final CopyEnds ends;
    /** Loads a query began for a worker of this process, until the load takes its plan. */
    private final BegunLoads begun;
    /** The world size of each instance registered through this engine (a lease has a share per worker). */
    private final Map<String, Integer> worldSizes = new ConcurrentHashMap<>();
    /** Operations hold the read lock while they start; close takes the write lock to stop new ones. */
    private final ReentrantReadWriteLock gate = new ReentrantReadWriteLock();
    private boolean closed;

    private PegaEngine(BlockStore store, LocalStore local, HostPool pool, Function<HostPool, TransferEngine> transfer,
            LongSupplier clock, boolean prefault, int threads) {
        this.store = store;
        this.local = local;
        this.pool = pool;
        this.clock = clock;
        this.ends = new CopyEnds(store, clock);
        this.begun = new BegunLoads(clock);
        try {
            this.prefaultNanos = prefault ? pool.prefault(threads) : 0;
            this.transfer = transfer.apply(pool);
        } catch (RuntimeException | Error e) {
            store.close();
            pool.close();
            throw e;
        }
    }

    /** An embedded engine: its own control plane, private pool and copy engine. */
    public static PegaEngine create(EngineConfig config) {
        if (config == null) {
            throw new InvalidArgumentException("engine config is null; expected EngineConfig.builder()...build()");
        }
        HostPool pool = HostPool.anonymous(config.poolBytes());
        LocalStore store;
        try {
            store = new LocalStore(config, pool.size());
        } catch (RuntimeException | Error e) {
            pool.close();
            throw e;
        }
        if (config.ssd() != null) {
            try {
                store.attachSsd(config.ssd(), pool.segment());
            } catch (RuntimeException | Error e) {
                store.close();
                pool.close();
                throw e;
            }
        }
        return new PegaEngine(store, store, pool, config.transfer(), config.nanoClock(), config.prefault(), config.copyThreads());
    }

    /**
     * An engine whose control plane is elsewhere (pegaflow-server) and whose pool is
     * {@code pool}, the same bytes the control plane's offsets refer to. Takes ownership of
     * both: {@link #close()} closes them.
     */
    public static PegaEngine attach(BlockStore store, HostPool pool, Function<HostPool, TransferEngine> transfer) {
        return new PegaEngine(store, null, pool, transfer, System::nanoTime, false, 1);
    }

    /**
     * The control plane of an embedded engine, or null (attached: the server owns it); it has
     * been told the end of every copy whose future completed before the call.
     */
    public LocalStore localStore() {
        ends.awaitEnds(true);
        return local;
    }

    /** The pool's memory as this process maps it. */
    public java.lang.foreign.MemorySegment poolMemory() {
        return pool.segment();
    }

    /**
     * The SSD tier of an embedded engine, or null (none, or attached: the server owns it);
     * every save whose future completed before the call has been offered to it.
     */
    public io.pegaflow.engine.ssd.SsdTier ssd() {
        ends.awaitEnds(false);
        return local == null ? null : local.ssd();
    }

    // ---------------------------------------------------------------- registration

    /** See {@link LocalStore#registerInstance}. */
    public void registerInstance(InstanceSpec spec) {
        startOp();
        try {
            store.registerInstance(spec);
            worldSizes.put(spec.instanceId(), spec.worldSize());
        } finally {
            endOp();
        }
    }

    /**
     * Registers the worker's regions with the control plane and keeps them for its copies.
     * Each region is first checked by the copy engine ({@link TransferEngine#checkRegions}: a
     * GPU region against its CUDA allocation); a refused region registers nothing.
     */
    public void registerWorker(String instanceId, WorkerSpec worker) {
        startOp();
        try {
            WorkerSpec.check(instanceId, worker);
            transfer.checkRegions(worker.layers());
            store.registerWorker(instanceId, worker);
            regions.computeIfAbsent(instanceId, k -> new ConcurrentHashMap<>())
                    .put(worker.workerRank(), worker.layers().toArray(new LayerRegion[0]));
        } finally {
            endOp();
        }
    }

    public boolean isSealed(String instanceId) {
        startOp();
        try {
            return store.isSealed(instanceId);
        } finally {
            endOp();
        }
    }

    /**
     * Waits for the instance's copies in flight, then removes it: its leases are released.
     * Cached blocks stay for other instances; the regions may be freed once this returns.
     */
    public void unregisterInstance(String instanceId) {
        startOp();
        try {
            Set<CompletableFuture<?>> running = pending.get(instanceId);
            List<CompletableFuture<?>> waited = running == null ? List.of() : new ArrayList<>(running);
            awaitQuietly(waited);
            rollBack(begun.dropAll(instanceId));
            store.unregisterInstance(instanceId);
            worldSizes.remove(instanceId);
            regions.remove(instanceId);
            if (running != null) {
                running.removeAll(waited); // a copy started meanwhile stays tracked for close() and flush()
                pending.remove(instanceId, Set.of());
            }
        } finally {
            endOp();
        }
    }

    // ---------------------------------------------------------------- save, query, release, load

    /** Saves every layer of the worker for the given blocks. See {@link #save(String, int, List, long[], BlockHashes, long)}. */
    public CompletableFuture<CopyResult> save(String instanceId, int workerRank, long[] blockIds, BlockHashes hashes) {
        return save(instanceId, workerRank, null, blockIds, hashes, 0);
    }

    /**
     * Copies the worker's slots of {@code blockIds[i]} into the pool under hash {@code i}
     * for the named layers ({@code null}: all of the worker's layers). Blocks already resident,
     * and slots already saved or being saved, are skipped; pool space is claimed at once
     * (evicting if needed) and a block becomes visible when its last slot lands. The copy is
     * ordered after the work queued so far on CUDA stream {@code waitStream} (0: none).
     *
     * <p>A save of 64 blocks or more is planned in parts, a head of 32-256 blocks and parts
     * growing from it, so each part's copy overlaps the planning of the next ({@link #saveParts});
     * when a later part cannot be planned (pool exhausted) the parts before it are still saved,
     * those after it are not tried, and the future fails with the reason.
     *
     * @throws PoolExhaustedException when the pool cannot hold the new slots (of the head, for
     *     a save in parts) even after evicting every unreferenced block; nothing was allocated
     */
    public CompletableFuture<CopyResult> save(String instanceId, int workerRank, List<String> layerNames,
            long[] blockIds, BlockHashes hashes, long waitStream) {
        startOp();
        try {
            boolean oneCall = blockIds == null || hashes == null || blockIds.length != hashes.count();
            int[] cuts = oneCall ? new int[0] : saveParts(blockIds.length); // refused by the store as one call, with its message
            if (cuts.length <= 2) {
                return savePart(instanceId, workerRank, layerNames, blockIds, hashes, waitStream);
            }
            // Each part's copy starts while the next is planned: a large save planned in one
            // piece waits for its whole plan before any byte moves (docs/gpu.md, "Saves in parts
            // growing threefold").
            List<CompletableFuture<CopyResult>> parts = new ArrayList<>();
            parts.add(savePart(instanceId, workerRank, layerNames, Arrays.copyOfRange(blockIds, 0, cuts[1]),
                    hashes.slice(0, cuts[1]), waitStream));
            for (int k = 1; k < cuts.length - 1; k++) {
                try {
                    parts.add(savePart(instanceId, workerRank, layerNames, Arrays.copyOfRange(blockIds, cuts[k], cuts[k + 1]),
                            hashes.slice(cuts[k], cuts[k + 1]), waitStream));
                } catch (RuntimeException e) {
                    // the parts before it are copying (the future waits for them); those after are not planned
                    parts.add(CompletableFuture.failedFuture(e));
                    break;
                }
            }
            // Completes only when every part has: a part still copying reads GPU blocks that
            // vLLM may reuse once the save is reported done, failed or not.
            CompletableFuture<CopyResult> both = CompletableFuture.allOf(parts.toArray(CompletableFuture[]::new))
                    .handle((x, e) -> {
                        if (e != null) {
                            throw e instanceof java.util.concurrent.CompletionException c ? c
                                    : new java.util.concurrent.CompletionException(e);
                        }
                        int blocks = 0;
                        int skipped = 0;
                        long bytes = 0;
                        for (CompletableFuture<CopyResult> part : parts) {
                            CopyResult r = part.join();
                            blocks += r.blocks();
                            skipped += r.skippedBlocks();
                            bytes += r.bytes();
                        }
                        return new CopyResult(blocks, skipped, bytes);
                    });
            track(instanceId, both); // flush returns only once the caller's future is done too
            return both;
        } finally {
            endOp();
        }
    }

    /**
     * How many blocks of a save or load of {@code blocks} go first on their own (0: it is one
     * part): about a sixteenth, 16 to 128 blocks, for 64 blocks or more.
     */
    public static int headBlocks(int blocks) {
        return blocks < 64 ? 0 : Math.max(16, Math.min(128, blocks / 16));
    }

    /**
     * Where a save of {@code blocks} is cut into parts, as boundaries from 0 to {@code blocks}
     * ({@code {0, blocks}}: one part). From 64 blocks a head of about an eighth (32 to 256
     * blocks), then parts of up to three times what is planned before them: 2,048 blocks go
     * as 256, 768 and 1,024. A save's plan is slower than a load's (slots allocated, hashes
     * claimed) and its batch is then built. In two parts (an eighth, then the rest), the rest's
     * plan could outlast the head's copy and leave the copy engine idle. A part of three times
     * the blocks before it plans in well under their copy time, so each part is submitted
     * before the copy ahead of it ends (docs/gpu.md, "Saves in parts growing threefold").
     */
    static int[] saveParts(int blocks) {
        if (blocks < 64) {
            return new int[] {0, blocks};
        }
        List<Integer> cuts = new ArrayList<>(List.of(0));
        int planned = Math.max(32, Math.min(256, blocks / 8));
        cuts.add(planned);
        while (planned < blocks) {
            planned += Math.min(blocks - planned, 3 * planned);
            cuts.add(planned);
        }
        return cuts.stream().mapToInt(Integer::intValue).toArray();
    }

    private CompletableFuture<CopyResult> savePart(String instanceId, int workerRank, List<String> layerNames,
            long[] blockIds, BlockHashes hashes, long waitStream) {
        CopyPlan plan;
        try {
            plan = store.reserveSave(instanceId, workerRank, layerNames, blockIds, hashes);
        } catch (PoolExhaustedException e) {
            if (ends.idle()) {
                throw e;
            }
            // blocks of saves still being sealed, and of loads still being unpinned, beside
            // their futures are not evictable yet
            ends.awaitEnds(true);
            plan = store.reserveSave(instanceId, workerRank, layerNames, blockIds, hashes);
        }
        if (plan.isEmpty()) {
            return CompletableFuture.completedFuture(new CopyResult(0, plan.skippedBlocks(), 0));
        }
        return submit(instanceId, workerRank, plan, null, blockIds, waitStream, 0, null);
    }

    /** See {@link LocalStore#query}. */
    public QueryResult query(String instanceId, BlockHashes hashes) {
        startOp();
        try {
            ends.awaitEnds(false); // its own saves; a held load's unpin does not change what it finds
            return store.query(instanceId, hashes);
        } finally {
            endOp();
        }
    }

    /**
     * {@link #query} that, on a final hit, also begins the load of worker {@code workerRank}
     * of this process ({@link BlockStore#queryAndBegin}): that worker's {@link #load} or {@link
     * #loadLayered} of the lease then copies at once, without asking the store for a plan (in
     * server mode, a round trip fewer in the step that loads). Releasing the lease instead rolls
     * the begun load back. The worker's regions must be registered here; otherwise this is a
     * plain query.
     */
    public QueryResult queryAndBegin(String instanceId, BlockHashes hashes, int workerRank) {
        BlockStore.checkBeginRank(workerRank);
        startOp();
        try {
            ends.awaitEnds(false);
            Map<Integer, LayerRegion[]> byRank = regions.get(instanceId);
            if (byRank == null || !byRank.containsKey(workerRank)) {
                return store.query(instanceId, hashes); // its copies run in another process: it asks there
            }
            long asked = clock.getAsLong(); // before the store issued the plan: its hold runs from later
            QueryResult q = store.queryAndBegin(instanceId, hashes, workerRank);
            if (q.begun() != null && q.lease() != null) {
                io.pegaflow.engine.transfer.StagedLoad staged = stage(q.begun(), byRank.get(workerRank));
                rollBack(begun.put(new BegunLoads.Begun(q.lease(), instanceId, workerRank, q.begun(), asked, staged)));
            }
            return q;
        } finally {
            endOp();
        }
    }

    /**
     * Whether a lookup of this process staged the pool side of the load it began with {@code
     * lease} ({@link io.pegaflow.engine.transfer.Stager}), not yet taken by a load: such a load
     * reads the staging only through {@link #loadLayered} (a plain {@link #load} lets it go), so a
     * caller that does not wait layer by layer loads that lease so too and waits for the result
     * alone; every other load keeps its own path.
     */
    public boolean staged(Token lease) {
        return lease != null && begun.staged(lease);
    }

    /**
     * The staging's counters since start ({@link io.pegaflow.engine.transfer.Stager}): loads
     * staged at their lookup, and lookups that began a load but staged nothing because another
     * load occupied the buffer, because the load was larger than it, whose staging failed, or
     * because the buffer could not be had; then how soon stagings started ({@link
     * io.pegaflow.engine.transfer.Stager#startTimes}: those whose first group was queued, and
     * their nanoseconds from the lookup to the staging thread's start, in making the layout, and
     * to that group queued, then those whose first group the staging thread saw land and their
     * nanoseconds from the lookup to then, then the groups queued while paced after the thread
     * saw the one before land and its nanoseconds from seeing that to queueing them); all zero
     * where the copy engine has no staging buffer. In that order.
     */
    public long[] stagingCounts() {
        io.pegaflow.engine.transfer.Stager s = transfer.stager();
        if (s == null) {
            return new long[13];
        }
        long[] t = s.startTimes();
        return new long[] {s.stagedLoads(), s.busyRefusals(), s.tooLargeRefusals(), s.failedStagings(),
                s.unavailableRefusals(), t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]};
    }

    /**
     * Starts copying a begun load's pool side into the copy engine's staging buffer where it
     * has one and the load fits ({@link io.pegaflow.engine.transfer.Stager}): from here on, not
     * from vLLM's allocation of its blocks. The layout is made on the staging thread; only the
     * size is counted here, on the caller's (vLLM's scheduling) thread. Null: not staged.
     */
    private io.pegaflow.engine.transfer.StagedLoad stage(CopyPlan plan, LayerRegion[] worker) {
        io.pegaflow.engine.transfer.Stager stager = transfer.stager();
        if (stager == null || plan.direction() != CopyPlan.Direction.LOAD) {
            return null;
        }
        long groupBytes = transfer.layerSplit().groupBytes();
        try {
            return stager.stage(CopyBatches.stageBytes(plan, worker), () -> CopyBatches.stageLayout(plan, worker, groupBytes));
        } catch (RuntimeException refused) {
            // staging is optional: the load reads the pool, the lookup and its lease stand (a plan
            // outside the worker's regions is refused by its load, naming the run: checkRun)
            return null;
        }
    }

    /**
     * Drops a lease of {@code instanceId} and all its remaining shares; a load a query began
     * with it ({@link #queryAndBegin}) is rolled back (its blocks unpinned).
     */
    public void release(String instanceId, Token leaseId) {
        startOp();
        try {
            BegunLoads.Begun b = leaseId == null ? null : begun.drop(leaseId, instanceId);
            if (b == null) {
                store.release(instanceId, leaseId);
                return;
            }
            rollBack(List.of(b));
            if (worldSizes.getOrDefault(instanceId, 0) == 1) {
                return; // the begun load held the lease's only share: the store dropped the lease then
            }
            try {
                store.release(instanceId, leaseId); // the other workers' shares
            } catch (UnknownLeaseException consumed) {
                // every share was consumed: nothing else is pinned by it
            }
        } finally {
            endOp();
        }
    }

    /** Drops begun loads that no copy will take, as unused (their pins dropped); a store that already dropped them is fine. */
    private void rollBack(List<BegunLoads.Begun> loads) {
        for (BegunLoads.Begun b : loads) {
            if (b.staged() != null) {
                b.staged().release();
            }
            try {
                store.dropBegun(b.instanceId(), b.plan().id());
            } catch (RuntimeException gone) {
                // expired (the copy TTL rolled it back), unregistered, or the server is gone
            }
        }
    }

    /**
     * Consumes this worker's share of a lease and copies the leased blocks' slots for the
     * worker's layers into {@code dstBlockIds} (one per leased block, in order). The future
     * fails with a {@link TransferFailedException} naming the destination block ids if the
     * copy fails.
     *
     * <p>A load of 64 blocks or more is planned in two parts as a save is: the plan of a head
     * of 16-128 blocks comes with the lease's consumption and its copy starts while the rest is
     * planned ({@link BlockStore#planRest}), so the rest's plan, a round trip to the server in
     * server mode, overlaps the head's copy instead of running in series with the copy
     * (docs/gpu.md, "What changed on 2026-12-01"). The load ends once.
     */
    public CompletableFuture<CopyResult> load(String instanceId, int workerRank, Token leaseId, long[] dstBlockIds) {
        return load(instanceId, workerRank, leaseId, dstBlockIds, null);
    }

    /**
     * A load whose copies go layer by layer (one group of the copy batch per registered
     * region, in region order), so a compute stream can wait for one layer alone ({@link
     * LayeredLoad#awaitLayer}) while later layers still copy: vLLM's {@code
     * wait_for_layer_load} for a load inside the step. Otherwise as {@link #load}, but planned
     * in one part (no head).
     */
    public LayeredLoad loadLayered(String instanceId, int workerRank, Token leaseId, long[] dstBlockIds) {
        return loadLayered(instanceId, workerRank, leaseId, dstBlockIds, null);
    }

    /**
     * {@link #loadLayered(String, int, Token, long[])} whose copies are held until {@code
     * holdUntil} completes (either way; null: not held): the store plans the load and the
     * engine lists its copies now, and queues them on the GPU once the caller opens the hold
     * (a load started where vLLM allocates its blocks, held until the step that reads them
     * starts: docs/gpu.md, "Loads started at allocation"). The caller must open it: until then
     * the load holds a copy lane and its lease.
     */
    public LayeredLoad loadLayered(String instanceId, int workerRank, Token leaseId, long[] dstBlockIds,
            CompletableFuture<?> holdUntil) {
        LayeredLoad layered = new LayeredLoad();
        layered.gate = holdUntil;
        layered.result = load(instanceId, workerRank, leaseId, dstBlockIds, layered);
        return layered;
    }

    private CompletableFuture<CopyResult> load(String instanceId, int workerRank, Token leaseId, long[] dstBlockIds,
            LayeredLoad layered) {
        startOp();
        try {
            // A layer-wise load goes in one part: layer i waits for every part's group i, so a
            // head planned first lets no layer start sooner; it adds a lane beside the rest's
            // (both contending for the GPU's SMs with the forward) and delays the rest's group 0
            // by the head's enqueue (docs/benchmarks, the seventh H200 run).
            BegunLoads.Begun b = leaseId == null || dstBlockIds == null ? null : begun.take(leaseId, instanceId, workerRank);
            if (b != null) {
                io.pegaflow.engine.transfer.StagedLoad staged = b.staged();
                if (staged != null && (layered == null || !staged.claim(layered.gate))) {
                    staged.release(); // a load that is not layer-wise reads the pool, as does one whose staging failed
                    staged = null;
                }
                try {
                    checkBegun(b, dstBlockIds);
                } catch (RuntimeException refused) {
                    if (staged != null) {
                        staged.finish();
                    }
                    throw refused;
                }
                if (layered != null) {
                    layered.planned();
                    layered.staged = staged;
                }
                return submit(instanceId, workerRank, b.plan(), null, dstBlockIds.clone(), 0, b.asked(), layered);
            }
            int head = dstBlockIds == null || layered != null ? 0 : headBlocks(dstBlockIds.length);
            long asked = clock.getAsLong(); // before the store issued the plan: its hold runs from later
            if (head == 0) {
                CopyPlan plan = store.beginLoad(instanceId, workerRank, leaseId, dstBlockIds);
                if (layered != null) {
                    layered.planned();
                }
                return submit(instanceId, workerRank, plan, null, dstBlockIds.clone(), 0, asked, layered);
            }
            CopyPlan first = store.beginLoad(instanceId, workerRank, leaseId, dstBlockIds, head);
            // where the first part ends (a server without planRest plans every block at once)
            int covered = first.runs() == 0 ? 0 : first.runBlock()[first.runs() - 1] + 1;
            return submit(instanceId, workerRank, first, covered >= first.blocks() ? null
                    : () -> store.planRest(instanceId, workerRank, first.id(), covered, first.blocks()),
                    dstBlockIds.clone(), 0, asked, layered);
        } finally {
            endOp();
        }
    }

    /**
     * A begun load's destination ids, checked here as the store checks a beginLoad's (the store
     * never saw them); a bad one rolls the load back and is refused.
     */
    private void checkBegun(BegunLoads.Begun b, long[] dstBlockIds) {
        try {
            if (dstBlockIds.length != b.plan().blocks()) {
                throw new InvalidArgumentException("load of lease " + b.lease() + ": " + dstBlockIds.length
                        + " destination block ids for " + b.plan().blocks() + " leased blocks; expected equal counts");
            }
            LayerRegion.checkBlockIds(regionsOf(b.instanceId(), b.workerRank()), null, dstBlockIds, "dstBlockIds");
        } catch (RuntimeException refused) {
            try {
                store.endCopy(b.instanceId(), b.plan().id(), false, 0, 0); // refused: a failed load, not an unused one
            } catch (RuntimeException gone) {
                // expired, unregistered, or the server is gone: nothing stays pinned by it
            }
            throw refused;
        }
    }

    /**
     * Moves a plan's bytes between the worker's regions and the pool, then ends the plan with
     * the outcome; a plan whose copy cannot even start is ended as failed (rolled back). With
     * {@code rest}, the plan came in parts: the rest is asked for once the first part's copy
     * is under way and copied beside it, and the plan ends when every part started has
     * finished. The future fails with a {@link TransferFailedException} naming the caller's
     * block ids involved (for a load: every destination, whose bytes are then not valid).
     * {@code asked}: this engine's clock before the plan was asked for (a load's hold, below).
     */
    private CompletableFuture<CopyResult> submit(String instanceId, int workerRank, CopyPlan plan,
            java.util.function.Supplier<CopyPlan> rest, long[] blockIds, long waitStream, long asked, LayeredLoad layered) {
        CompletableFuture<CopyResult> result = new CompletableFuture<>();
        // What flush, close and unregisterInstance wait for: the caller's future, and the
        // plan's end (a save's seal lands after the future; neither waits for the other, so a
        // callback of the future may flush).
        CompletableFuture<Void> settled = new CompletableFuture<>();
        track(instanceId, result);
        track(instanceId, settled);
        boolean save = plan.direction() == CopyPlan.Direction.SAVE;
        String what = (save ? "save" : "load") + " copy for instance '" + instanceId + "' worker " + workerRank;
        long[] failed = save ? CopyBatches.distinctBlocks(plan, blockIds) : blockIds;
        long start = clock.getAsLong();
        List<CompletableFuture<Long>> copies = new ArrayList<>(2);
        Throwable notStarted = null;
        try {
            LayerRegion[] worker = regionsOf(instanceId, workerRank);
            copies.add(CopyBatches.copy(transfer, plan, worker, blockIds, waitStream, layered));
            if (rest != null) {
                copies.add(CopyBatches.copy(transfer, rest.get(), worker, blockIds, waitStream, layered));
            }
        } catch (Throwable t) {
            notStarted = t;
            if (layered != null && layered.staged != null && copies.isEmpty()) {
                layered.staged.finish(); // no copy reads its staging
            }
        }
        Throwable startFailure = notStarted;
        // ends once, after every part that started (a running copy still reads or writes the pinned slots)
        ends.settle(instanceId, plan, save, what, failed, copies, startFailure, start, asked, result, settled);
        return result;
    }

    // ---------------------------------------------------------------- maintenance, stats, close

    /**
     * The visibility barrier (prefill/decode's "KV ready"): returns once every save (and load)
     * this engine started before the call has ended and the store confirmed that those saves
     * are visible to local and other hosts' queries. A failed save is reported on its own
     * future and simply is not visible; the barrier does not fail for it.
     *
     * @param timeoutMs how long to wait in all (< 0: forever)
     * @throws PegaflowException TIMEOUT naming what was still running, or the store's
     *     TIMEOUT / UNAVAILABLE when the cluster registry did not confirm
     */
    public void flush(long timeoutMs) {
        startOp();
        try {
            long deadline = System.nanoTime() + (timeoutMs < 0 ? 0 : TimeUnit.MILLISECONDS.toNanos(timeoutMs));
            List<CompletableFuture<?>> all = new ArrayList<>();
            pending.values().forEach(all::addAll);
            for (CompletableFuture<?> f : all) {
                try {
                    if (timeoutMs < 0) {
                        f.join();
                    } else {
                        f.get(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
                    }
                } catch (TimeoutException e) {
                    long left = all.stream().filter(x -> !x.isDone()).count();
                    throw new PegaflowException(ErrorCode.TIMEOUT, "flush: " + left + " of " + all.size()
                            + " copies started before it still running after " + timeoutMs + " ms");
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new PegaflowException(ErrorCode.INTERNAL, "flush interrupted", e);
                } catch (ExecutionException | RuntimeException e) {
                    // the caller of that save or load sees the failure through its own future
                }
            }
            store.flush();
        } finally {
            endOp();
        }
    }

    /** Expires leases and partially saved blocks now (embedded engines; the server sweeps its own). */
    public void sweep() {
        startOp();
        try {
            if (local != null) {
                local.sweep();
            }
        } finally {
            endOp();
        }
    }

    /** See {@link BlockStore#resetCache} (vLLM's {@code reset_cache}). */
    public LocalStore.Cleared resetCache(String instanceId) {
        startOp();
        try {
            return store.resetCache(instanceId);
        } finally {
            endOp();
        }
    }

    /** See {@link BlockStore#demote} (a request's retention hint "low"). */
    public int demote(String instanceId, BlockHashes hashes) {
        startOp();
        try {
            return store.demote(instanceId, hashes);
        } finally {
            endOp();
        }
    }

    /** See {@link BlockStore#kvEvents}. */
    public KvEventLog.Batch kvEvents(String instanceId, long after, int max) {
        startOp();
        try {
            return store.kvEvents(instanceId, after, max);
        } finally {
            endOp();
        }
    }

    public EngineStats stats() {
        startOp();
        try {
            ends.awaitEnds(true);
            return store.stats();
        } finally {
            endOp();
        }
    }

    /** Name of the copy engine in use ({@code host} or {@code cuda}). */
    public String transferName() {
        return transfer.name();
    }

    /** Time spent committing pool pages at start (0 unless {@link EngineConfig#prefault()}). */
    public long prefaultNanos() {
        return prefaultNanos;
    }

    /** The control plane's invariants (embedded engines; see {@link LocalStore#verifyInvariants()}). */
    public void verifyInvariants() {
        if (local == null) {
            throw new UnsupportedOperationException("invariants are checked where the control plane runs (the server)");
        }
        ends.awaitEnds(true);
        local.verifyInvariants();
    }

    /** Waits for copies in flight, then closes the control plane (or the connection), the copy engine and the pool. */
    @Override
    public void close() {
        gate.writeLock().lock();
        try {
            if (closed) {
                return;
            }
            closed = true;
        } finally {
            gate.writeLock().unlock();
        }
        List<CompletableFuture<?>> all = new ArrayList<>();
        pending.values().forEach(all::addAll);
        awaitQuietly(all);
        rollBack(begun.dropAll(null));
        ends.shutdown();
        try {
            store.close();
        } finally {
            transfer.close();
            pool.close();
        }
    }

    // ---------------------------------------------------------------- internals

    private void startOp() {
        gate.readLock().lock();
        if (closed) {
            gate.readLock().unlock();
            throw new EngineClosedException("engine is closed");
        }
    }

    private void endOp() {
        gate.readLock().unlock();
    }

    private LayerRegion[] regionsOf(String instanceId, int workerRank) {
        Map<Integer, LayerRegion[]> byRank = regions.get(instanceId);
        LayerRegion[] r = byRank == null ? null : byRank.get(workerRank);
        if (r == null) {
            throw new UnknownInstanceException("worker rank " + workerRank + " of instance '" + instanceId
                    + "' registered its regions in another process; copies run where the regions live");
        }
        return r;
    }

    /** Registered while the gate's read lock is held, so close() cannot miss it. */
    private void track(String instanceId, CompletableFuture<?> f) {
        Set<CompletableFuture<?>> set = pending.computeIfAbsent(instanceId, k -> ConcurrentHashMap.newKeySet());
        set.add(f);
        f.whenComplete((r, e) -> set.remove(f));
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
}
