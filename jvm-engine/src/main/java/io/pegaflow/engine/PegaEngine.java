package io.pegaflow.engine;

import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.CopyBatch;
import io.pegaflow.engine.transfer.LayerSplit;
import io.pegaflow.engine.transfer.TransferEngine;
import io.pegaflow.engine.transfer.TransferFuture;
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
 * failed copy's after it is rolled back. This engine's own {@link #query}, {@link #stats} and
 * {@link #flush} wait for those seals, so they see every save whose future completed;
 * another process sees it a round trip later (or after this engine's {@link #flush}, the
 * visibility barrier). {@link #close()}
 * and {@link #unregisterInstance} wait for copies in flight and their ends, so the caller
 * may free its regions afterwards.
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
    /** Saves that landed whose seal is still being told to the control plane (their settled futures). */
    private final Set<CompletableFuture<Void>> ending = ConcurrentHashMap.newKeySet();
    /** Held loads that landed whose end (the unpin) is still being told (their settled futures). */
    private final Set<CompletableFuture<Void>> unpinning = ConcurrentHashMap.newKeySet();
    /** Tells the control plane those ends, off the copy engine's completer threads. */
    private final java.util.concurrent.ExecutorService enders = java.util.concurrent.Executors.newCachedThreadPool(
            Thread.ofPlatform().daemon().name("pegaflow-end-", 0).factory());
    /** Operations hold the read lock while they start; close takes the write lock to stop new ones. */
    private final ReentrantReadWriteLock gate = new ReentrantReadWriteLock();
    private boolean closed;

    private PegaEngine(BlockStore store, LocalStore local, HostPool pool, Function<HostPool, TransferEngine> transfer,
            LongSupplier clock, boolean prefault, int threads) {
        this.store = store;
        this.local = local;
        this.pool = pool;
        this.clock = clock;
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
        awaitEnds(true);
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
        awaitEnds(false);
        return local == null ? null : local.ssd();
    }

    // ---------------------------------------------------------------- registration

    /** See {@link LocalStore#registerInstance}. */
    public void registerInstance(InstanceSpec spec) {
        startOp();
        try {
            store.registerInstance(spec);
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
            InstanceRegistry.checkWorker(instanceId, worker);
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
            store.unregisterInstance(instanceId);
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
            if (ending.isEmpty() && unpinning.isEmpty()) {
                throw e;
            }
            // blocks of saves still being sealed, and of loads still being unpinned, beside
            // their futures are not evictable yet
            awaitEnds(true);
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
            awaitEnds(false); // its own saves; a held load's unpin does not change what it finds
            return store.query(instanceId, hashes);
        } finally {
            endOp();
        }
    }

    /** Drops a lease of {@code instanceId} and all its remaining shares. */
    public void release(String instanceId, Token leaseId) {
        startOp();
        try {
            store.release(instanceId, leaseId);
        } finally {
            endOp();
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
     * wait_for_layer_load} for a load inside the step. Otherwise as {@link #load}.
     */
    public LayeredLoad loadLayered(String instanceId, int workerRank, Token leaseId, long[] dstBlockIds) {
        LayeredLoad layered = new LayeredLoad();
        layered.result = load(instanceId, workerRank, leaseId, dstBlockIds, layered);
        return layered;
    }

    /**
     * The copies of one {@link #loadLayered} load: each part's (a plan can come in two) transfer
     * and which of its groups holds each region's pieces. Complete once {@code loadLayered}
     * returned (every part was submitted).
     */
    public static final class LayeredLoad {
        private CompletableFuture<CopyResult> result;
        private final List<TransferFuture> parts = new java.util.concurrent.CopyOnWriteArrayList<>();
        private final List<int[]> groupOfRegion = new java.util.concurrent.CopyOnWriteArrayList<>();

        /** Completes when every byte landed and the load ended; fails naming the destination blocks. */
        public CompletableFuture<CopyResult> result() {
            return result;
        }

        /**
         * Orders CUDA stream {@code stream} (0: blocks this thread) after region {@code region}'s
         * pieces of every part. A failed copy is not thrown here: {@link #result} reports it
         * (the caller then marks the blocks invalid), and waiting on it ends at once.
         */
        public void awaitLayer(int region, long stream) {
            for (int p = 0; p < parts.size(); p++) {
                int[] groups = groupOfRegion.get(p);
                int g = region >= 0 && region < groups.length ? groups[region] : -1;
                if (g < 0) {
                    continue;
                }
                try {
                    parts.get(p).awaitGroup(g, stream);
                } catch (RuntimeException failed) {
                    // the result fails with it
                }
            }
        }

        void add(TransferFuture part, int[] groups) {
            groupOfRegion.add(groups);
            parts.add(part);
        }
    }

    private CompletableFuture<CopyResult> load(String instanceId, int workerRank, Token leaseId, long[] dstBlockIds,
            LayeredLoad layered) {
        startOp();
        try {
            int head = dstBlockIds == null ? 0 : headBlocks(dstBlockIds.length);
            long asked = clock.getAsLong(); // before the store issued the plan: its hold runs from later
            if (head == 0) {
                CopyPlan plan = store.beginLoad(instanceId, workerRank, leaseId, dstBlockIds);
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
        long[] failed = save ? distinctBlocks(plan, blockIds) : blockIds;
        long start = clock.getAsLong();
        List<CompletableFuture<Long>> copies = new ArrayList<>(2);
        Throwable notStarted = null;
        try {
            LayerRegion[] worker = regionsOf(instanceId, workerRank);
            copies.add(copy(plan, worker, blockIds, waitStream, layered));
            if (rest != null) {
                copies.add(copy(rest.get(), worker, blockIds, waitStream, layered));
            }
        } catch (Throwable t) {
            notStarted = t;
        }
        Throwable startFailure = notStarted;
        // ends once, after every part that started (a running copy still reads or writes the pinned slots)
        CompletableFuture.allOf(copies.toArray(CompletableFuture[]::new)).whenComplete((x, copyFailure) -> {
            Throwable err = startFailure != null ? startFailure
                    : copyFailure instanceof java.util.concurrent.CompletionException c && c.getCause() != null
                            ? c.getCause() : copyFailure;
            long bytes = 0;
            for (CompletableFuture<Long> c : copies) {
                bytes += c.isDone() && !c.isCompletedExceptionally() ? c.join() : 0;
            }
            // A load may end beside its future only when the store promised to hold its pins
            // for longer than the copy took, counted from before the plan was asked for (half
            // the hold: margin for the two clocks; the hold is 10 s, a copy milliseconds). The
            // rest of a two-part load belongs to the same open load and hold, issued later.
            // Otherwise it ends first: its end succeeding is then what proves its slots stayed
            // pinned through the copy (a plan rolled back meanwhile may have had its slots
            // reused by another save, and the load must fail so that vLLM recomputes).
            boolean held = !save && plan.holdNanos() > 0 && clock.getAsLong() - asked < plan.holdNanos() / 2;
            if (err == null && (save || held)) {
                // The caller hears of a copy that landed at once and the plan ends beside it:
                // the GPU blocks are free to reuse (a save) or hold what the pool held (a
                // load), and the end, a control-plane round trip, stays off the caller's path
                // (docs/gpu.md, "Saves seal beside their futures"). This engine's own reads wait
                // for it (awaitEnds).
                long moved = bytes;
                long nanos = clock.getAsLong() - start;
                Set<CompletableFuture<Void>> ends = save ? ending : unpinning;
                ends.add(settled);
                settled.whenComplete((v, e) -> ends.remove(settled));
                Runnable seal = () -> {
                    try {
                        store.endCopy(instanceId, plan.id(), true, moved, nanos);
                    } catch (Throwable t) {
                        // the bytes moved; the store's outcome is a save not made visible, its
                        // reservation rolled back later (recomputed), or a load's pins released
                        // later: at the end of the plan's hold (its instance unregistered) or at
                        // the copy TTL
                        LOG.log(System.Logger.Level.WARNING, "ending the " + what + " (plan " + plan.id()
                                + ") after its copy landed failed; " + (save ? "its blocks are not made visible"
                                : "the store releases its pins later"), t);
                    } finally {
                        settled.complete(null);
                    }
                };
                try {
                    enders.execute(seal);
                } catch (Throwable t) {
                    seal.run(); // no thread for it (closing, or none could start): seal here
                }
                result.complete(new CopyResult(plan.blocks(), plan.skippedBlocks(), moved));
                return;
            }
            try {
                if (err == null) {
                    store.endCopy(instanceId, plan.id(), true, bytes, clock.getAsLong() - start);
                    settled.complete(null);
                    result.complete(new CopyResult(plan.blocks(), plan.skippedBlocks(), bytes));
                    return;
                }
                // a failed copy is rolled back before the caller hears of it
                store.endCopy(instanceId, plan.id(), false, 0, 0);
                settled.complete(null); // before the caller's callbacks, which may flush or close
                if (startFailure != null && copies.isEmpty()) {
                    result.completeExceptionally(new TransferFailedException(what + " could not start: " + err, failed, err));
                } else {
                    result.completeExceptionally(new TransferFailedException(what + " failed: " + err, failed, err));
                }
            } catch (Throwable t) {
                settled.complete(null);
                if (err != null) {
                    // the store rejects nothing it handed out; report the copy's failure
                    result.completeExceptionally(new TransferFailedException(what + " failed: " + err, failed, err));
                } else {
                    result.completeExceptionally(t); // a load whose plan the store no longer holds
                }
            }
        });
        return result;
    }

    /**
     * Starts the copy of one plan (or part of one); the future holds the bytes moved. With
     * {@code layered}, the pieces go region by region, each region a group of the batch.
     */
    private CompletableFuture<Long> copy(CopyPlan plan, LayerRegion[] worker, long[] blockIds, long waitStream,
            LayeredLoad layered) {
        if (layered != null) {
            return copyLayered(plan, worker, blockIds, waitStream, layered);
        }
        CopyBatch batch = new CopyBatch(plan.direction().batch(), (int) Math.min(1 << 20, plan.slots() * 2))
                .waitFor(waitStream);
        for (int j = 0; j < plan.runs(); j++) {
            int first = plan.runRegion()[j];
            int count = plan.runCount()[j];
            if (first < 0 || count < 1 || first + count > worker.length) {
                throw new InvalidArgumentException("copy plan run " + j + " covers regions " + first + ".."
                        + (first + count - 1) + " of a worker with " + worker.length);
            }
            int index = plan.runBlock()[j];
            if (index < 0 || index >= blockIds.length) {
                throw new InvalidArgumentException("copy plan run " + j + " is for block " + index + " of "
                        + blockIds.length);
            }
            long blockId = blockIds[index];
            long host = plan.runOffset()[j];
            for (int r = first; r < first + count; r++) {
                LayerRegion region = worker[r];
                for (int s = 0; s < region.segments(); s++) {
                    batch.add(region.pieceAddress(blockId, s), host + s * region.segmentBytes(), region.segmentBytes());
                }
                host += region.slotBytes();
            }
        }
        long bytes = batch.totalBytes();
        return transfer.submit(batch).thenApply(v -> bytes);
    }

    /**
     * A layered part: its layer groups ({@link #layerMajor}) dealt round-robin over the copy
     * engine's {@link LayerSplit#lanes()} batches, each submitted on its own (a lane each), so
     * one layer's copy need not wait for the previous layer's tail on one stream. A batch that
     * cannot be submitted fails the part after the batches already submitted have finished
     * (the plan is rolled back only once nothing reads or writes its slots).
     */
    private CompletableFuture<Long> copyLayered(CopyPlan plan, LayerRegion[] worker, long[] blockIds, long waitStream,
            LayeredLoad layered) {
        LayerSplit split = transfer.layerSplit();
        int lanes = Math.max(1, Math.min(split.lanes(), worker.length));
        List<TransferFuture> submitted = new ArrayList<>(lanes);
        long[] bytes = new long[lanes];
        try {
            for (int k = 0; k < lanes; k++) {
                CopyBatch batch = new CopyBatch(plan.direction().batch(),
                        (int) Math.min(1 << 20, plan.slots() * 2 / lanes + 16)).waitFor(waitStream);
                int[] groups = layerMajor(plan, worker, blockIds, batch, split.groupBytes(), k, lanes);
                if (batch.size() == 0) {
                    continue;
                }
                bytes[k] = batch.totalBytes();
                TransferFuture part = transfer.submit(batch);
                submitted.add(part);
                layered.add(part, groups);
            }
        } catch (RuntimeException | Error e) {
            for (TransferFuture f : submitted) {
                try {
                    f.join();
                } catch (RuntimeException ignored) {
                    // failing anyway
                }
            }
            throw e;
        }
        long total = java.util.Arrays.stream(bytes).sum();
        return CompletableFuture.allOf(submitted.toArray(CompletableFuture[]::new)).thenApply(v -> total);
    }

    /**
     * Fills {@code batch} with the plan's pieces layer-group by layer-group, closing a group of
     * the batch after each: consecutive regions join one group until each block's slots of
     * the group reach {@code groupBytes} (0: one region per group), and within a group the
     * pieces go block by block, so a block's slots of the group stay one stretch of the pool
     * (what the CUDA engine's bounce path moves at the line). Of the groups, in order, only
     * those whose ordinal is {@code lane} modulo {@code lanes} go into this batch. Returns each
     * region's group index in this batch (-1: no pieces of this batch).
     */
    static int[] layerMajor(CopyPlan plan, LayerRegion[] worker, long[] blockIds, CopyBatch batch, long groupBytes,
            int lane, int lanes) {
        long[] before = new long[worker.length + 1]; // pool offset of each region's slot within a run
        for (int r = 0; r < worker.length; r++) {
            before[r + 1] = before[r] + worker[r].slotBytes();
        }
        boolean[] used = new boolean[worker.length];
        for (int j = 0; j < plan.runs(); j++) {
            int first = plan.runRegion()[j];
            int count = plan.runCount()[j];
            if (first < 0 || count < 1 || first + count > worker.length) {
                throw new InvalidArgumentException("copy plan run " + j + " covers regions " + first + ".."
                        + (first + count - 1) + " of a worker with " + worker.length);
            }
            int index = plan.runBlock()[j];
            if (index < 0 || index >= blockIds.length) {
                throw new InvalidArgumentException("copy plan run " + j + " is for block " + index + " of "
                        + blockIds.length);
            }
            java.util.Arrays.fill(used, first, first + count, true);
        }
        int[] groups = new int[worker.length];
        java.util.Arrays.fill(groups, -1);
        int next = 0; // groups in this batch
        int ordinal = 0; // groups of the plan
        int from = 0;
        while (from < worker.length) {
            if (!used[from]) {
                from++;
                continue;
            }
            int to = from + 1; // regions [from, to) form this group
            long stretch = worker[from].slotBytes();
            while (to < worker.length && used[to] && stretch < groupBytes) {
                stretch += worker[to].slotBytes();
                to++;
            }
            if (ordinal++ % lanes != lane) {
                from = to;
                continue;
            }
            int start = batch.size();
            for (int j = 0; j < plan.runs(); j++) {
                int first = plan.runRegion()[j];
                int lo = Math.max(from, first);
                int hi = Math.min(to, first + plan.runCount()[j]);
                long blockId = blockIds[plan.runBlock()[j]];
                for (int r = lo; r < hi; r++) {
                    LayerRegion region = worker[r];
                    long host = plan.runOffset()[j] + before[r] - before[first];
                    for (int s = 0; s < region.segments(); s++) {
                        batch.add(region.pieceAddress(blockId, s), host + s * region.segmentBytes(), region.segmentBytes());
                    }
                }
            }
            if (batch.size() > start) {
                batch.endGroup();
                java.util.Arrays.fill(groups, from, to, next++);
            }
            from = to;
        }
        return groups;
    }

    /** The caller's block ids a save plan writes, each once, in plan order. */
    private static long[] distinctBlocks(CopyPlan plan, long[] blockIds) {
        long[] ids = new long[plan.blocks()];
        int last = -1;
        int n = 0;
        for (int j = 0; j < plan.runs() && n < ids.length; j++) {
            if (plan.runBlock()[j] != last) {
                last = plan.runBlock()[j];
                ids[n++] = blockIds[last];
            }
        }
        return ids;
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
            awaitEnds(true);
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
        awaitEnds(true);
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
        enders.shutdown();
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

    /**
     * Waits until every save whose future has completed has also been sealed with the control
     * plane (ends never fail: a failed end is logged), so this engine reads its own saves; with
     * {@code loads}, every held load's end too (its pins: stats, space for a save).
     */
    private void awaitEnds(boolean loads) {
        for (Object end : ending.toArray()) {
            ((CompletableFuture<?>) end).join();
        }
        if (loads) {
            for (Object end : unpinning.toArray()) {
                ((CompletableFuture<?>) end).join();
            }
        }
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
