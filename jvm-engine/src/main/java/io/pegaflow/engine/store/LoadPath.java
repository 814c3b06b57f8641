package io.pegaflow.engine.store;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.CopyPlan;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.Limits;
import io.pegaflow.engine.PermissionDeniedException;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.Token;
import io.pegaflow.engine.TransferFailedException;
import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.store.OpenCopy.OpenLoad;
import java.util.Arrays;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.LongSupplier;
import java.util.function.ObjLongConsumer;

/**
 * The read path: a query leases the resident prefix (or answers "not yet" while the tiers
 * below, {@link SsdReadBack} and {@link PeerShare}, bring its continuation in), and each
 * worker's load consumes its share of the lease and plans its copy. Runs under
 * {@link LocalStore}'s lock, on callers' threads: its entry points (the store's query,
 * release, beginLoad and planRest) take it; {@link #expireLeases} runs with it held.
 */
final class LoadPath {
    private final StoreLock lock;
    private final InstanceRegistry registry;
    private final PoolSpace pool;
    private final LeaseTable leases;
    private final OpenCopies copies;
    private final SsdReadBack readBack;
    private final PeerShare peers;
    private final CachePolicy policy;
    private final Quotas quotas;
    private final ObjLongConsumer<Counter> count;
    private final LongSupplier clock;
    /** Loads still to refuse at their start (testing: pegaflow-server --inject-load-failures). */
    private final AtomicInteger injectedLoadFailures = new AtomicInteger();

    /** Distinct blocks asked for per window: the hit-rate ceiling (final answers only). */
    private final io.pegaflow.engine.metrics.DistinctBlocks distinct;

    LoadPath(StoreLock lock, InstanceRegistry registry, PoolSpace pool, LeaseTable leases, OpenCopies copies,
            SsdReadBack readBack, PeerShare peers, Quotas quotas, CachePolicy policy, ObjLongConsumer<Counter> count,
            LongSupplier clock, io.pegaflow.engine.metrics.DistinctBlocks distinct) {
        this.lock = lock;
        this.registry = registry;
        this.pool = pool;
        this.leases = leases;
        this.copies = copies;
        this.readBack = readBack;
        this.peers = peers;
        this.quotas = quotas;
        this.policy = policy;
        this.count = count;
        this.clock = clock;
        this.distinct = distinct;
    }

    /**
     * See {@link LocalStore#query}; with {@code beginRank >= 0}, {@link LocalStore#queryAndBegin}:
     * a final hit also begins that worker's load.
     */
    QueryResult query(String instanceId, BlockHashes hashes, int beginRank) {
        if (hashes == null) {
            throw new InvalidArgumentException("query: hashes must not be null");
        }
        int n = hashes.count();
        Token leaseId = null;
        CopyPlan begun = null;
        int hit;
        String answered = null; // the namespace of a final answer (not "not yet"), for the hit-rate ceiling
        lock.lock();
        try {
            lock.checkOpen();
            Instance inst = registry.sealed(instanceId);
            // a rank the instance does not have is bad input: refused before anything is leased
            Instance.Worker beginWorker = beginRank < 0 ? null : InstanceRegistry.worker(inst, beginRank);
            long now = clock.getAsLong();
            expireLeases(now);
            if (n > 0) {
                quotas.checkLease(inst, n, leases.size(), leases.leasedBlocks()); // before anything is planned
            }
            Block[] found = new Block[n];
            long lookupStart = System.nanoTime();
            hit = inst.ns.blocks.sealedPrefix(hashes.packed(), hashes.hashLen(), n, found);
            long leaseStart = System.nanoTime();
            RemoteTier remote = peers.remote();
            if ((readBack.tier() != null || remote != null) && hit < n) {
                // The resident prefix is pinned while reads are planned (they may evict), and
                // unpinning makes it the newest: the read-back evicts older blocks first.
                for (int i = 0; i < hit; i++) {
                    pool.lru().pin(found[i]);
                }
                int pending;
                try {
                    pending = readBack.prefetch(inst.ns, hashes, hit, now);
                } finally {
                    for (int i = 0; i < hit; i++) {
                        pool.lru().unpin(found[i]);
                    }
                }
                if (pending == 0 && remote != null
                        && inst.ns.blocks.get(hashes.packed(), hit * hashes.hashLen(), hashes.hashLen()) == null
                        && remote.missed(inst.ns.namespace, hashes, hit)) {
                    pending = n - hit; // a lookup or fetch is under way; its run is not known yet
                }
                if (pending > 0) {
                    count.accept(Counter.QUERY_REQUESTS, 1);
                    count.accept(Counter.SSD_PENDING_ANSWERS, 1);
                    return new QueryResult(hit, null, pending);
                }
            }
            int fromSsd = 0;
            int fromPeer = 0;
            for (int i = 0; i < hit; i++) {
                found[i].evictFirst = false; // asked for again: it proved worth keeping
                if (found[i].fromSsd) {
                    found[i].fromSsd = false;
                    fromSsd++;
                } else if (found[i].fromPeer) {
                    found[i].fromPeer = false;
                    fromPeer++;
                }
            }
            count.accept(Counter.TIER_SSD_BLOCKS, fromSsd);
            count.accept(Counter.TIER_PEER_BLOCKS, fromPeer);
            count.accept(Counter.TIER_DRAM_BLOCKS, hit - fromSsd - fromPeer);
            count.accept(Counter.TIER_MISS_BLOCKS, n - hit);
            long planStart = leaseStart;
            if (hit > 0) {
                leaseId = leases.issue(inst, hit == found.length ? found : Arrays.copyOf(found, hit), now);
                planStart = System.nanoTime();
                if (beginWorker != null && mayBegin(leases.get(leaseId), beginWorker)) {
                    begun = begin(inst, beginWorker, leases.get(leaseId), Integer.MAX_VALUE, true);
                    count.accept(Counter.QUERY_PLAN_NANOS, System.nanoTime() - planStart);
                }
            }
            // an answered query's phases (a "not yet" returned above): where a lookup's time goes
            count.accept(Counter.QUERY_LOOKUP_NANOS, leaseStart - lookupStart);
            count.accept(Counter.QUERY_LEASE_NANOS, planStart - leaseStart);
            count.accept(Counter.QUERY_REQUESTS, 1);
            count.accept(Counter.HIT_BLOCKS, hit);
            count.accept(Counter.MISS_BLOCKS, n - hit);
            if (hit > 0) {
                count.accept(Counter.LEASES_CREATED, 1);
            }
            answered = inst.ns.namespace;
            policy.looked(inst.ns, hashes); // a final answer counts once; "not yet" repeats do not
        } finally {
            lock.unlock();
        }
        if (answered != null) {
            distinct.observe(answered, hashes, clock.getAsLong()); // outside the store's lock: the sketch has its own
        }
        return new QueryResult(hit, leaseId, 0, begun);
    }

    /**
     * Under lock: whether a query's lease may begin {@code worker}'s load at once. Where it may
     * not (the plan over {@link Limits#MAX_PLAN_SLOTS}, half the open-copy quotas taken, a fault
     * injected for the next load), the query still answers and the worker's own beginLoad meets
     * the same refusal with its error.
     */
    private boolean mayBegin(Lease lease, Instance.Worker worker) {
        return injectedLoadFailures.get() == 0
                && (long) lease.blocks.length * worker.regions.length <= Limits.MAX_PLAN_SLOTS
                && quotas.allowsBegun(lease.instance, copies.size());
    }

    /** See {@link LocalStore#release}. */
    void release(String instanceId, Token leaseId) {
        if (leaseId == null) {
            throw new InvalidArgumentException("release: lease is null");
        }
        lock.locked(() -> {
            lock.checkOpen();
            expireLeases(clock.getAsLong());
            leases.get(leaseId).instance.checkOwner(instanceId, "lease " + leaseId);
            leases.remove(leaseId);
        });
    }

    /** See {@link LocalStore#injectLoadFailures}. */
    void injectLoadFailures(int n) {
        if (n < 0) {
            throw new InvalidArgumentException("injected load failures " + n + "; expected >= 0");
        }
        injectedLoadFailures.set(n);
    }

    /** See {@link LocalStore#beginLoad(String, int, Token, long[], int)}. */
    CopyPlan beginLoad(String instanceId, int workerRank, Token leaseId, long[] dstBlockIds, int planBlocks) {
        if (planBlocks < 1) {
            throw new InvalidArgumentException("load: plan_blocks " + planBlocks + "; expected >= 1 (or 0 on the wire: all)");
        }
        if (leaseId == null || dstBlockIds == null) {
            throw new InvalidArgumentException("load: lease and dstBlockIds must not be null");
        }
        if (injectedLoadFailures.getAndUpdate(n -> Math.max(0, n - 1)) > 0) {
            count.accept(Counter.LOAD_FAULTS_INJECTED, 1);
            throw new TransferFailedException("load of lease " + leaseId + " refused: a fault injected for testing "
                    + "(--inject-load-failures)", dstBlockIds, null);
        }
        return lock.locked(() -> {
            lock.checkOpen();
            Instance inst = registry.sealed(instanceId);
            Instance.Worker worker = InstanceRegistry.worker(inst, workerRank);
            expireLeases(clock.getAsLong());
            Lease lease = leases.get(leaseId);
            lease.instance.checkOwner(instanceId, "lease " + leaseId);
            if (lease.consumedBy.get(workerRank)) {
                throw new InvalidArgumentException("worker " + workerRank + " already consumed its share of lease " + leaseId);
            }
            if (dstBlockIds.length != lease.blocks.length) {
                throw new InvalidArgumentException("load of lease " + leaseId + ": " + dstBlockIds.length
                        + " destination block ids for " + lease.blocks.length + " leased blocks; expected equal counts");
            }
            Limits.checkPlan("load", dstBlockIds.length, worker.regions.length);
            worker.checkBlockIds(null, dstBlockIds, "dstBlockIds");
            quotas.checkCopy(lease.instance, "a load", copies.size());
            return begin(inst, worker, lease, planBlocks, false);
        });
    }

    /**
     * Under lock, its checks passed: consumes {@code worker}'s share of {@code lease}, pins the
     * leased blocks and opens the load ({@code byQuery}: a query began it); its plan holds the
     * first {@code planBlocks} blocks' runs.
     */
    private CopyPlan begin(Instance inst, Instance.Worker worker, Lease lease, int planBlocks, boolean byQuery) {
        Block[] blocks = lease.blocks;
        lease.consumedBy.set(worker.spec.workerRank());
        pool.pinAll(blocks);
        if (lease.fullyConsumed()) {
            leases.remove(lease.id);
        }
        if (!byQuery) {
            count.accept(Counter.LOAD_REQUESTS, 1); // a query's is counted at its end: one dropped unused never ran
        }
        Token id = copies.newId();
        OpenLoad load = new OpenLoad(inst, worker, blocks, copies.deadline(), byQuery);
        copies.opened(id, load);
        return load.plan(id, 0, Math.min(planBlocks, blocks.length), copies.holdNanos());
    }

    /** See {@link LocalStore#planRest}. */
    CopyPlan planRest(String instanceId, int workerRank, Token planId, int fromBlock, int toBlock) {
        if (planId == null) {
            throw new InvalidArgumentException("plan rest: the copy id is null");
        }
        return lock.locked(() -> {
            lock.checkOpen();
            OpenCopy op = copies.get(planId);
            if (!(op instanceof OpenLoad load)) {
                throw new InvalidArgumentException("copy " + planId + " is not an open load: already ended, rolled back,"
                        + " expired, a save, or its instance was unregistered");
            }
            op.instance().checkOwner(instanceId, "copy " + planId);
            if (load.worker().spec.workerRank() != workerRank) {
                throw new PermissionDeniedException("load " + planId + " was begun by worker " + load.worker().spec.workerRank()
                        + ", not " + workerRank);
            }
            if (fromBlock < 0 || fromBlock > toBlock || toBlock > load.blocks().length) {
                throw new InvalidArgumentException("plan of load " + planId + " for blocks " + fromBlock + " .. " + toBlock
                        + "; expected 0 <= from <= to <= " + load.blocks().length);
            }
            return load.plan(planId, fromBlock, toBlock, Math.max(0, copies.heldUntil(load) - clock.getAsLong()));
        });
    }

    /** Under lock: drops the leases past their TTL (counted). */
    void expireLeases(long now) {
        count.accept(Counter.LEASES_EXPIRED, leases.expireUntil(now));
    }
}
