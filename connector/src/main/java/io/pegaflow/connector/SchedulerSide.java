package io.pegaflow.connector;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.EngineSource;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.Token;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.PegaflowException;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.hash.VllmBlockHasher;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The scheduler-side connector's brain (one per vLLM engine-core process). vLLM's hooks
 * arrive here as plain data from the Python shim, in the scheduler's order:
 * {@link #lookup} (any number of times per waiting request), {@link #afterAlloc} (the commit
 * point), {@link #schedule} for every scheduled request and then {@link #buildPlan} once per
 * step, {@link #requestFinished} once per request, {@link #finished} with what workers
 * reported.
 *
 * <p>Request states: a <em>probe</em> (a lookup's answer and the lease pinning it, reused
 * while the request's cache state is unchanged, so repeated lookups have no side effects);
 * a <em>pending load</em> (committed by afterAlloc, sent in the next plan); then saves of
 * newly completed full blocks, step by step. Any store failure in a lookup is a miss, never
 * an exception into vLLM. The engine comes from an {@link EngineSource} at each call (the
 * store link replaces it after a server restart); a probe remembers the generation whose
 * lease it holds and is void in any other. Not thread-safe: vLLM's scheduler calls from one
 * thread.
 *
 * <p>Hybrid models (vLLM's hybrid KV cache manager) have several KV-cache groups, each a
 * {@link CacheGroup} with its own store instance and block table. A hit of {@code k} blocks is
 * offered only where every group has what it needs at {@code k} (full attention: every block;
 * sliding window: the blocks inside the window; recurrent: the state at {@code k}), the
 * rightmost such {@code k} within the full-attention prefix; each group's lease covers
 * exactly what it loads. Saves skip vLLM's null block, and a recurrent group saves only the
 * states at the block boundaries its steps end on.
 *
 * <p>Size: every per-request rule of vLLM's scheduler hooks (lookup and lease, hit counting, loads, saves, holds, preemption, P/D waits) on one request table; the hooks' Python side is a call each.
 */
public final class SchedulerSide {
    /** {@link #lookup}'s answer while the prefix is read back from a lower tier: vLLM asks again. */
    public static final long NOT_YET = -1;
    /** vLLM's null block: a block table's placeholder for what a group no longer (or never) holds. */
    static final long NULL_BLOCK = 0;
    /**
     * Candidate hit ends one lookup tries before it answers 0: each try is one query per
     * sliding-window or recurrent group (full-attention groups are asked once). A recurrent
     * group has states only at the boundaries steps ended on, the rightmost usually within a
     * block or two of the full-attention prefix's end.
     */
    static final int MAX_HIT_ROUNDS = 64;

    private final EngineSource source;
    private final List<CacheGroup> groups;
    private final int blockSize;
    private final boolean loadEnabled;
    /** A P/D decode instance: a partial hit answers "not yet" until the whole prefix is there (or maxWait). */
    private final boolean waitFullPrefix;
    /**
     * The scheduler side's counters, one scheme for all ({@link #drainStats} order): lookups
     * answered (any answer but "not yet"), "not yet" answers, requests offered a hit and the
     * tokens offered, nanoseconds spent in lookups, lookups the store failed (answered 0),
     * requests that stopped waiting for a prefix and recomputed, "not yet" answers of a decode
     * instance waiting for its whole prefix, hits shrunk to what every group held; lookups that
     * began their load (the worker in this process), and of the engine's staging at the lookup
     * ({@code PEGAFLOW_PRESTAGE_MIB}, {@link PegaEngine#stagingCounts}) the loads staged and the
     * lookups it refused (buffer occupied, load too large, staging failed, buffer not had); hits
     * that could have begun their load at the lookup but did not, because no worker of the
     * instance runs in this process, or because the engine did not begin it (the worker's
     * regions are not registered with this process's engine, or the store began none); and how
     * soon stagings started ({@link io.pegaflow.engine.transfer.Stager#startTimes}): those whose
     * first group was queued, and their nanoseconds from the lookup to the staging thread's
     * start, in making the layout, and to that group queued on the copy engine; and those whose
     * first group the staging thread saw land while pacing them, with their nanoseconds from the
     * lookup to then (so how long the copy engine took to move it once queued, host-timed); and
     * the groups the staging thread queued while pacing, after seeing the group before them land,
     * with the nanoseconds from seeing that to queueing them (the host's part of the link's idle
     * time between paced groups).
     */
    public static final int STAT_LOOKUPS = 0, STAT_NOT_YET = 1, STAT_HIT_REQUESTS = 2, STAT_HIT_TOKENS = 3,
            STAT_LOOKUP_NANOS = 4, STAT_LOOKUP_FAILURES = 5, STAT_WAIT_TIMEOUTS = 6, STAT_PREFIX_WAITS = 7,
            STAT_HIT_SHRINKS = 8, STAT_BEGUN_AT_LOOKUP = 9, STAT_STAGINGS = 10, STAT_STAGING_BUSY = 11,
            STAT_STAGING_TOO_LARGE = 12, STAT_STAGING_FAILED = 13, STAT_STAGING_UNAVAILABLE = 14,
            STAT_BEGIN_NO_WORKER = 15, STAT_BEGIN_DECLINED = 16, STAT_STAGING_STARTS = 17, STAT_STAGING_TO_THREAD_NANOS = 18,
            STAT_STAGING_LAYOUT_NANOS = 19, STAT_STAGING_TO_FIRST_NANOS = 20, STAT_STAGING_LANDED = 21,
            STAT_STAGING_TO_LANDED_NANOS = 22, STAT_STAGING_PACED_GROUPS = 23, STAT_STAGING_PACED_GAP_NANOS = 24,
            STAT_COUNT = 25;
    /** Where each of {@link PegaEngine#stagingCounts}'s counts goes among the totals, in its order. */
    private static final int[] STAGING_STATS = {STAT_STAGINGS, STAT_STAGING_BUSY, STAT_STAGING_TOO_LARGE, STAT_STAGING_FAILED,
            STAT_STAGING_UNAVAILABLE, STAT_STAGING_STARTS, STAT_STAGING_TO_THREAD_NANOS, STAT_STAGING_LAYOUT_NANOS,
            STAT_STAGING_TO_FIRST_NANOS, STAT_STAGING_LANDED, STAT_STAGING_TO_LANDED_NANOS, STAT_STAGING_PACED_GROUPS,
            STAT_STAGING_PACED_GAP_NANOS};
    /** Totals since creation; {@link #drainStats} hands out what grew since its last call. */
    private final long[] totals = new long[STAT_COUNT];
    private final long[] drained = new long[STAT_COUNT];
    /** The engine whose {@link PegaEngine#stagingCounts} were last folded into the totals, and those counts. */
    private PegaEngine stagingEngine;
    private long[] stagingSeen = new long[0];
    private final Map<String, Req> requests = new HashMap<>();
    private final Map<String, List<StepPlan.Load>> pendingLoads = new LinkedHashMap<>();
    private final List<StepPlan.Save> stepSaves = new ArrayList<>();
    private final List<String> stepPreempted = new ArrayList<>();
    private long maxWaitNanos = io.pegaflow.engine.PrefixRequests.DEFAULT_MAX_WAIT_NANOS;
    private long contractViolations;
    private long loadFailures;
    /** Loads run inside the step that uses them (vLLM told the tokens are ready); one KV-cache group only. */
    private boolean inStepLoads;
    private boolean loadsAtAlloc;
    private boolean beginAtLookup = true;
    /** Requests whose in-step load was in a recent plan: their targets are matched against failed blocks. */
    private final java.util.Set<Req> inStepRecent = new java.util.HashSet<>();

    /** A lease no store issues: a load carrying it fails on every block (recompute). */
    static final Token NO_LEASE = Token.NONE;

    /** Per-request state. */
    private final class Req {
        // probe: the exact window it asked about, the engine and generation its leases are from
        BlockHashes probeWindow;
        int probeBase;
        int probeHit;
        final Token[] probeLeases = new Token[groups.size()];
        final int[] probeFrom = new int[groups.size()];
        PegaEngine probeEngine;
        long probeGeneration;
        boolean probed;
        long probeFreshUntil; // nanoTime: a probe whose lookup began the load is looked up again after it
        // blocks, per group
        long[][] tables = emptyTables();
        final int[] savedUpTo = new int[groups.size()];
        boolean hadSaves;
        boolean loading;
        PegaEngine loadEngine; // issued the pending load's leases (released there at shutdown)
        long[] loadTargets = new long[0];
        boolean loadFailed; // a load of this request failed: no more hits for it (recompute)
        boolean prefixWaitOver; // a decode instance waited its limit for the whole prefix
        boolean finishedByVllm;
        long waitingSince; // nanoTime of the first "not yet" answer; 0: not waiting
        long[] inStepTargets = new long[0]; // an in-step load's blocks, until its step's output is seen
        int inStepAge; // update_connector_output calls since its plan
        boolean tailProbe; // its last lookup's hit reaches the prompt's partial last block (P/D tail)

        /**
         * The one wait for a prefix (read back from a lower tier, or, P/D, the whole of it): starts
         * at the first "not yet" answer; whether it is still within {@code maxWaitNanos}.
         */
        boolean stillWaiting(long maxWaitNanos) {
            long t = System.nanoTime();
            if (waitingSince == 0) {
                waitingSince = t;
            }
            return t - waitingSince < maxWaitNanos;
        }
    }

    /** A hit: blocks [base, end) loadable, each group's lease and first leased block; or pending. */
    /** {@code freshUntil}: nanoTime after which a load the lookup began is asked for again (Long.MAX_VALUE: none began). */
    private record Hit(int end, Token[] leases, int[] from, boolean pending, long freshUntil) {
        Hit(int end, Token[] leases, int[] from, boolean pending) {
            this(end, leases, from, pending, Long.MAX_VALUE);
        }
    }

    /**
     * @param source      where the store's engine is found at each call (none: every lookup misses)
     * @param blockSize   vLLM's block size in tokens (one hash per block)
     * @param loadEnabled false for save-only deployments: lookups always miss
     */
    public SchedulerSide(EngineSource source, String instanceId, int blockSize, boolean loadEnabled) {
        this(source, instanceId, blockSize, loadEnabled, false);
    }

    /**
     * {@code waitFullPrefix}: a decode instance of prefill/decode disaggregation (vLLM's
     * {@code kv_consumer}). Its prompts were just prefilled elsewhere, and the prefill's blocks
     * may still be on their way (saved, advertised, fetched from the prefill host): a lookup
     * that finds less than the whole prefix answers "not yet" until it finds it all, or until
     * the wait limit, then takes what is there (docs/cluster.md, P/D).
     */
    public SchedulerSide(EngineSource source, String instanceId, int blockSize, boolean loadEnabled, boolean waitFullPrefix) {
        this(source, List.of(CacheGroup.full(instanceId)), blockSize, loadEnabled, waitFullPrefix);
    }

    /** One side for a model with {@code groups} (vLLM's KV-cache groups, in vLLM's order). */
    public SchedulerSide(EngineSource source, List<CacheGroup> groups, int blockSize, boolean loadEnabled,
            boolean waitFullPrefix) {
        if (blockSize < 1) {
            throw new InvalidArgumentException("block size " + blockSize + "; expected >= 1 token");
        }
        if (source == null) {
            throw new InvalidArgumentException("engine source is null; expected the store link");
        }
        if (groups == null || groups.isEmpty() || groups.size() > MAX_GROUPS) {
            throw new InvalidArgumentException((groups == null ? 0 : groups.size()) + " KV-cache groups; expected 1 to "
                    + MAX_GROUPS);
        }
        if (groups.stream().map(CacheGroup::instanceId).distinct().count() != groups.size()) {
            throw new InvalidArgumentException("KV-cache groups " + groups + " share an instance id; expected one each");
        }
        this.source = source;
        this.groups = List.copyOf(groups);
        this.blockSize = blockSize;
        this.loadEnabled = loadEnabled;
        this.waitFullPrefix = waitFullPrefix;
    }

    /**
     * Runs hits' loads inside the step that computes the request's tail ({@code
     * load_kv_async=False} in vLLM): the worker copies layer by layer and each attention layer
     * waits for its own, so the request skips the step it would wait in {@code
     * WAITING_FOR_REMOTE_KVS} and its compute overlaps the copy. A failed in-step load is
     * reported by its blocks (vLLM discards the step's output for the request and recomputes).
     * Only for a model with one KV-cache group: several groups' failures can be reported only
     * by request, which vLLM takes for asynchronous loads alone.
     */
    public void inStepLoads(boolean on) {
        inStepLoads = on && groups.size() == 1;
    }

    /**
     * Whether in-step loads start when vLLM allocates their blocks ({@code update_state_after_alloc})
     * rather than in the step's {@code start_load_kv}, where this process holds the instance's
     * worker too (vLLM's engine core with its worker in-process, TP 1): see {@link
     * WorkerSide#startAtAlloc}. Off by default until measured on the GPU.
     */
    public void loadsAtAlloc(boolean on) {
        loadsAtAlloc = on;
    }

    /**
     * Whether a lookup of a model with one KV-cache group begins the load of this process's
     * worker ({@link #queryAndBegin}; on by default); off, each load asks for its plan itself.
     */
    public void beginAtLookup(boolean on) {
        beginAtLookup = on;
    }

    /** Whether hits are loaded inside the step (see {@link #inStepLoads(boolean)}). */
    public boolean inStepLoads() {
        return inStepLoads;
    }

    /** Most KV-cache groups one model may have (vLLM's hybrid models have a handful). */
    public static final int MAX_GROUPS = 64;

    private long[][] emptyTables() {
        long[][] t = new long[groups.size()][];
        Arrays.fill(t, new long[0]);
        return t;
    }

    private Req req(String id) {
        return requests.computeIfAbsent(id, k -> new Req());
    }

    /**
     * {@code get_num_new_matched_tokens}: how many tokens beyond {@code numComputedTokens}
     * can be loaded, given the request's full-block hashes. At least the last prompt token is
     * always left to compute. The answer (and its leases) is memoized while the inputs are
     * the same, so calling again changes nothing; changed inputs release the old leases first.
     * Returns 0 on any store failure (server down, instance not registered yet).
     */
    public long lookup(String requestId, BlockHashes hashes, long numTokens, long numComputedTokens) {
        return lookup(requestId, hashes, null, numTokens, numComputedTokens);
    }

    /**
     * As {@link #lookup(String, BlockHashes, long, long)}, and with {@code tailTokens} (the
     * prompt's tokens after its last full block; null: none) the partial last block too, P/D's
     * tail flow (docs/cluster.md): its key is derived here ({@link VllmBlockHasher#tailKey}) from
     * the last full block's and looked up as one more block; a hit that reaches it covers every
     * prompt token but the last ({@code numTokens - 1}), and the allocation after it loads the
     * tail block whole ({@link #afterAlloc}). Counted once, here, as vLLM is answered.
     */
    public long lookup(String requestId, BlockHashes hashes, int[] tailTokens, long numTokens, long numComputedTokens) {
        long t0 = System.nanoTime();
        try {
            long n;
            if (tailTokens == null || hashes.count() == 0) {
                n = answer(requestId, hashes, numTokens, numComputedTokens);
                Req r = requests.get(requestId);
                if (r != null) {
                    r.tailProbe = false;
                }
            } else {
                int full = hashes.count();
                byte[] tail = VllmBlockHasher.tailKey(hashes.slice(full - 1, full).packed(), tailTokens);
                byte[] packed = Arrays.copyOf(hashes.packed(), hashes.packed().length + tail.length);
                System.arraycopy(tail, 0, packed, hashes.packed().length, tail.length);
                n = answer(requestId, new BlockHashes(packed, hashes.hashLen()), (long) (full + 1) * blockSize + 1,
                        numComputedTokens);
                boolean reachesTail = n > 0 && numComputedTokens + n > (long) full * blockSize;
                if (reachesTail) {
                    n = numTokens - 1 - numComputedTokens;
                }
                req(requestId).tailProbe = reachesTail;
            }
            if (n == NOT_YET) {
                totals[STAT_NOT_YET]++;
            } else {
                totals[STAT_LOOKUPS]++;
                if (n > 0) {
                    totals[STAT_HIT_REQUESTS]++;
                    totals[STAT_HIT_TOKENS] += n;
                }
            }
            return n;
        } finally {
            totals[STAT_LOOKUP_NANOS] += System.nanoTime() - t0;
        }
    }

    private long answer(String requestId, BlockHashes hashes, long numTokens, long numComputedTokens) {
        Req r = req(requestId);
        int base = (int) (numComputedTokens / blockSize);
        int usable = (int) Math.min(hashes.count(), Math.max(0, (numTokens - 1) / blockSize)) - base;
        EngineSource.Binding now = source.binding();
        if (!loadEnabled || usable <= 0 || now.engine() == null || r.loadFailed) {
            dropProbe(r);
            return 0;
        }
        if (r.probed && r.probeGeneration == now.generation() && r.probeBase == base
                && r.probeWindow.count() == usable && r.probeWindow.sameAs(hashes, base)
                && System.nanoTime() < r.probeFreshUntil) {
            return (long) r.probeHit * blockSize;
        }
        dropProbe(r);
        Hit q;
        try {
            // a decode instance waiting for the whole prefix asks again each step: no load to begin yet
            q = findHit(now.engine(), hashes, base, base + usable, beginAtLookup && !(waitFullPrefix && !r.prefixWaitOver));
        } catch (PegaflowException e) {
            totals[STAT_LOOKUP_FAILURES]++;
            r.waitingSince = 0;
            return 0; // the store is unavailable or not ready: recompute
        }
        int hit = q.end() - base;
        if (waitFullPrefix && !q.pending() && hit < usable && !r.prefixWaitOver) {
            if (r.stillWaiting(maxWaitNanos)) {
                releaseAll(now.engine(), q.leases()); // asked again next step
                totals[STAT_PREFIX_WAITS]++;
                return NOT_YET;
            }
            totals[STAT_WAIT_TIMEOUTS]++;
            r.prefixWaitOver = true; // take what is there from now on
        } else if (q.pending()) {
            // The prefix continues on SSD or another host and is being read back: vLLM keeps
            // the request waiting and asks again next step, up to the wait limit; then it recomputes.
            if (r.stillWaiting(maxWaitNanos)) {
                return NOT_YET;
            }
            totals[STAT_WAIT_TIMEOUTS]++;
            r.waitingSince = 0;
            r.loadFailed = true; // no more waiting for this request
            return 0;
        }
        r.waitingSince = 0;
        r.probed = true;
        r.probeWindow = hashes.slice(base, base + usable);
        r.probeBase = base;
        r.probeHit = hit;
        System.arraycopy(q.leases(), 0, r.probeLeases, 0, groups.size());
        System.arraycopy(q.from(), 0, r.probeFrom, 0, groups.size());
        r.probeEngine = now.engine();
        r.probeGeneration = now.generation();
        r.probeFreshUntil = q.freshUntil();
        return (long) hit * blockSize;
    }

    /**
     * The rightmost hit end in {@code (base, end]} where every group has what it needs, with
     * each group's lease over exactly the blocks it loads. Full-attention groups bound it by
     * their stored prefix; then each candidate end is checked against every sliding-window
     * group (its window's blocks all stored) and recurrent group (its state there stored), and
     * moved left past what is missing. Nothing stays leased on a miss, a "pending" answer or
     * an exception.
     */
    private Hit findHit(PegaEngine e, BlockHashes hashes, int base, int end, boolean mayBegin) {
        int n = groups.size();
        Token[] leases = new Token[n];
        int[] from = new int[n];
        int[] to = new int[n];
        long freshUntil = Long.MAX_VALUE;
        boolean done = false;
        try {
            int k = end;
            for (int g = 0; g < n; g++) {
                if (groups.get(g).kind() == CacheGroup.Kind.FULL) {
                    QueryResult q = n == 1 && mayBegin ? queryAndBegin(e, groups.get(g).instanceId(), hashes.slice(base, k))
                            : e.query(groups.get(g).instanceId(), hashes.slice(base, k));
                    if (q.begun() != null) {
                        totals[STAT_BEGUN_AT_LOOKUP]++;
                        // half the plan's hold: a load taken later must end before it reports
                        // (CopyEnds), so a request that waits that long looks up again
                        freshUntil = System.nanoTime() + q.begun().holdNanos() / 2;
                    }
                    if (q.pending()) {
                        releaseQuietly(e, g, q.lease());
                        return new Hit(base, leases, from, true);
                    }
                    leases[g] = q.lease();
                    from[g] = base;
                    k = base + q.hitBlocks();
                    to[g] = k;
                }
            }
            for (int round = 0; k > base; round++) {
                if (round == MAX_HIT_ROUNDS) {
                    k = base;
                    break;
                }
                int next = k;
                for (int g = 0; g < n; g++) {
                    CacheGroup group = groups.get(g);
                    if (group.kind() == CacheGroup.Kind.FULL) {
                        continue;
                    }
                    int f = Math.max(base, group.firstNeeded(k, blockSize));
                    QueryResult q = e.query(group.instanceId(), hashes.slice(f, k));
                    if (q.pending()) {
                        releaseQuietly(e, g, q.lease());
                        return new Hit(base, leases, from, true);
                    }
                    if (q.hitBlocks() == k - f) {
                        releaseQuietly(e, g, leases[g]);
                        leases[g] = q.lease();
                        from[g] = f;
                        to[g] = k;
                    } else {
                        releaseQuietly(e, g, q.lease());
                        // a window must end before the first missing block; a state is looked for one block left
                        next = Math.min(next, group.kind() == CacheGroup.Kind.RECURRENT ? k - 1 : f + q.hitBlocks());
                    }
                }
                if (next == k) {
                    break;
                }
                k = next;
            }
            if (k <= base) {
                return new Hit(base, leases, from, false); // released in finally
            }
            for (int g = 0; g < n; g++) {
                if (groups.get(g).kind() == CacheGroup.Kind.FULL && to[g] != k) {
                    // the hit shrank below this group's prefix: lease exactly [base, k) (pinned
                    // by the old lease meanwhile, so all of it is there), then drop the old lease
                    QueryResult q = e.query(groups.get(g).instanceId(), hashes.slice(base, k));
                    releaseQuietly(e, g, leases[g]);
                    leases[g] = q.lease();
                    to[g] = k;
                    totals[STAT_HIT_SHRINKS]++;
                    if (q.hitBlocks() != k - base) {
                        return new Hit(base, leases, from, false); // not the store's contract; released in finally
                    }
                }
            }
            done = true;
            return new Hit(k, leases, from, false, freshUntil);
        } finally {
            if (!done) {
                releaseAll(e, leases);
                Arrays.fill(leases, null);
            }
        }
    }

    /**
     * A lookup of a model with one KV-cache group: where the worker runs in this process (vLLM's
     * engine core with the worker in-process), the store also begins its load of the hit
     * ({@link PegaEngine#queryAndBegin}), so the step that loads asks the store for nothing (in
     * server mode, one round trip of the local socket in that step instead of two). Its lease,
     * released (a shorter hit, "not yet", no load), rolls that load back. Hybrid models, whose
     * lookups may shrink and re-lease a group's hit, ask for the plan at their load.
     */
    private QueryResult queryAndBegin(PegaEngine e, String instanceId, BlockHashes hashes) {
        WorkerSide w = WorkerSide.colocated(instanceId);
        QueryResult q = w == null ? e.query(instanceId, hashes) : e.queryAndBegin(instanceId, hashes, w.workerRank());
        if (q.begun() == null && q.lease() != null && q.hitBlocks() > 0) {
            totals[w == null ? STAT_BEGIN_NO_WORKER : STAT_BEGIN_DECLINED]++; // a hit whose load asks for its plan at the load
        }
        return q;
    }

    private void dropProbe(Req r) {
        releaseAll(r.probeEngine, r.probeLeases);
        Arrays.fill(r.probeLeases, null);
        r.probed = false;
        r.probeEngine = null;
        r.probeWindow = null;
        r.probeHit = 0;
    }

    /** {@code leases[g]} is group g's. */
    private void releaseAll(PegaEngine engine, Token[] leases) {
        for (int g = 0; g < leases.length; g++) {
            releaseQuietly(engine, g, leases[g]);
        }
    }

    /** On the engine that issued it: after a restart the old engine is closed and this fails quietly. */
    private void releaseQuietly(PegaEngine engine, int group, Token lease) {
        if (engine == null || lease == null || lease == NO_LEASE) {
            return;
        }
        try {
            engine.release(groups.get(group).instanceId(), lease);
        } catch (PegaflowException ignored) {
            // expired, or the server is gone: either way nothing stays pinned
        }
    }

    /**
     * {@code update_state_after_alloc} for a model with one KV-cache group: vLLM allocated
     * {@code blockIds} (the request's whole block table) and will load {@code numExternalTokens}.
     */
    public void afterAlloc(String requestId, long[] blockIds, long numExternalTokens) {
        afterAlloc(requestId, new long[][] {blockIds}, numExternalTokens);
    }

    /**
     * {@code update_state_after_alloc}: vLLM allocated {@code tables} (the request's whole block
     * table of each KV-cache group) and will load {@code numExternalTokens}. The probe's leases
     * become a pending load into each group's blocks of the hit; with 0 external tokens the
     * probe is released.
     */
    public void afterAlloc(String requestId, long[][] tables, long numExternalTokens) {
        checkGroups(requestId, tables);
        Req r = req(requestId);
        if (numExternalTokens % blockSize != 0 && r.tailProbe) {
            // the tail block is loaded whole (its bytes past the prompt are never read)
            numExternalTokens = (numExternalTokens + blockSize - 1) / blockSize * blockSize;
        }
        r.tables = copy(tables);
        if (numExternalTokens <= 0) {
            if (r.probed) {
                dropProbe(r);
            }
            return;
        }
        int blocks = (int) (numExternalTokens / blockSize);
        int base = r.probeBase;
        int end = base + blocks;
        boolean offered = r.probed && blocks == r.probeHit && numExternalTokens % blockSize == 0;
        List<long[]> dst = new ArrayList<>();
        for (int g = 0; offered && g < groups.size(); g++) {
            long[] t = tables[g];
            offered = r.probeLeases[g] != null && t.length >= end;
            if (offered) {
                long[] ids = Arrays.copyOfRange(t, r.probeFrom[g], end);
                offered = !dropsBlocks(g) || Arrays.stream(ids).noneMatch(id -> id == NULL_BLOCK); // else vLLM holds
                // no block where this group's hit loads one
                dst.add(ids);
            }
        }
        List<StepPlan.Load> loads = new ArrayList<>();
        List<long[]> targets = new ArrayList<>();
        if (!offered) {
            // vLLM committed to a load we did not offer (not the contract; never seen): the
            // request waits for finished_recving, so send loads that fail on every target
            // block; the worker reports them and vLLM recomputes (kv_load_failure_policy=recompute).
            contractViolations++;
            int from = base;
            dropProbe(r);
            int span = (int) Math.max(1, (numExternalTokens + blockSize - 1) / blockSize);
            for (int g = 0; g < groups.size(); g++) {
                long[] t = tables[g];
                int gr = g;
                long[] ids = Arrays.stream(Arrays.copyOfRange(t, Math.min(from, t.length), (int) Math.min(t.length,
                        (long) from + span))).filter(id -> !dropsBlocks(gr) || id != NULL_BLOCK).toArray();
                if (ids.length > 0) {
                    loads.add(new StepPlan.Load(requestId, g, NO_LEASE, ids, inStepLoads));
                    targets.add(ids);
                }
            }
            r.loadEngine = null;
        } else {
            for (int g = 0; g < groups.size(); g++) {
                loads.add(new StepPlan.Load(requestId, g, r.probeLeases[g], dst.get(g), inStepLoads));
                targets.add(dst.get(g));
                r.savedUpTo[g] = Math.max(r.savedUpTo[g], end); // loaded blocks are already stored
            }
            r.loadEngine = r.probeEngine;
            Arrays.fill(r.probeLeases, null); // now the pending load's
            r.probed = false;
            r.probeEngine = null;
            r.probeWindow = null;
        }
        r.loadTargets = targets.stream().flatMapToLong(Arrays::stream).toArray();
        pendingLoads.put(requestId, loads);
        r.loading = true;
        if (inStepLoads && loadsAtAlloc && r.loadEngine != null) { // a load offered (not a contract violation's)
            WorkerSide w = WorkerSide.colocated(groups.get(0).instanceId());
            if (w != null) {
                try {
                    w.startAtAlloc(loads);
                } catch (RuntimeException e) {
                    // the worker is shutting down (its executor refuses): the step starts the load, or
                    // reports it failed; vLLM's scheduler thread never sees this
                }
            }
        }
    }

    /**
     * Whether group {@code g}'s block table marks blocks vLLM dropped (outside a window, older
     * states) with its null block; a full-attention table holds real blocks only, block 0 included.
     */
    private boolean dropsBlocks(int g) {
        return groups.get(g).kind() != CacheGroup.Kind.FULL;
    }

    private void checkGroups(String requestId, long[][] tables) {
        if (tables == null || tables.length != groups.size()) {
            throw new InvalidArgumentException("request " + requestId + ": block tables of "
                    + (tables == null ? 0 : tables.length) + " KV-cache groups; expected " + groups.size());
        }
    }

    private static long[][] copy(long[][] tables) {
        long[][] out = new long[tables.length][];
        for (int g = 0; g < tables.length; g++) {
            out[g] = tables[g].clone();
        }
        return out;
    }

    /** {@link #schedule(String, BlockHashes, int, long[][], boolean, long, long)} for a model with one KV-cache group. */
    public void schedule(String requestId, BlockHashes hashes, int hashOffset, long[] newBlockIds,
            boolean resumed, long numComputedTokens, long numScheduledTokens) {
        schedule(requestId, hashes, hashOffset, new long[][] {newBlockIds}, resumed, numComputedTokens, numScheduledTokens);
    }

    /**
     * One scheduled request of this step: a window of its full-block hashes (hash
     * {@code hashOffset + i} is the i-th of {@code hashes}; callers pass only hashes they
     * have not passed before), the new block ids appended to each group's table (or its whole
     * table when {@code resumed}), and its token counts. Full blocks that this step completes
     * and that are not stored yet are saved: every one of a full-attention group, those a
     * sliding-window group still holds, and a recurrent group's state when the step ends on a
     * block boundary.
     */
    public void schedule(String requestId, BlockHashes hashes, int hashOffset, long[][] newBlockIds,
            boolean resumed, long numComputedTokens, long numScheduledTokens) {
        if (hashOffset < 0) {
            throw new InvalidArgumentException("request " + requestId + ": hash offset " + hashOffset + "; expected >= 0");
        }
        checkGroups(requestId, newBlockIds);
        Req r = req(requestId);
        for (int g = 0; g < groups.size(); g++) {
            if (resumed) {
                r.tables[g] = newBlockIds[g].clone();
            } else if (newBlockIds[g].length > 0) {
                long[] t = Arrays.copyOf(r.tables[g], r.tables[g].length + newBlockIds[g].length);
                System.arraycopy(newBlockIds[g], 0, t, r.tables[g].length, newBlockIds[g].length);
                r.tables[g] = t;
            }
        }
        int count = hashOffset + hashes.count();
        long end = numComputedTokens + numScheduledTokens;
        for (int g = 0; g < groups.size(); g++) {
            long[] table = r.tables[g];
            // Blocks vLLM had cached locally are saved too (deduplicated if already stored), so
            // other instances sharing the store find them.
            int full = (int) Math.min(count, Math.min(table.length, end / blockSize));
            int from = Math.max(r.savedUpTo[g], hashOffset);
            if (full <= from) {
                continue;
            }
            int first = switch (groups.get(g).kind()) {
                case FULL, SLIDING -> from;
                // the state after this step, where it ends on a block boundary (vLLM's checkpoint)
                case RECURRENT -> end % blockSize == 0 && full == end / blockSize ? full - 1 : full;
            };
            long[] ids = Arrays.copyOfRange(table, first, full);
            BlockHashes h = hashes.slice(first - hashOffset, full - hashOffset);
            int kept = dropsBlocks(g) ? (int) Arrays.stream(ids).filter(id -> id != NULL_BLOCK).count() : ids.length;
            if (kept < ids.length) { // what vLLM no longer holds (outside a window) is not saved
                long[] keptIds = new long[kept];
                byte[] keptHashes = new byte[kept * h.hashLen()];
                for (int i = 0, j = 0; i < ids.length; i++) {
                    if (ids[i] != NULL_BLOCK) {
                        System.arraycopy(h.packed(), i * h.hashLen(), keptHashes, j * h.hashLen(), h.hashLen());
                        keptIds[j++] = ids[i];
                    }
                }
                ids = keptIds;
                h = kept == 0 ? BlockHashes.EMPTY : new BlockHashes(keptHashes, h.hashLen());
            }
            if (kept > 0) {
                stepSaves.add(new StepPlan.Save(requestId, g, ids, h));
                r.hadSaves = true;
            }
            r.savedUpTo[g] = full;
        }
    }

    /** A request was preempted this step: its blocks are freed; it may be resumed later. */
    public void preempted(String requestId) {
        Req r = requests.get(requestId);
        if (r != null) {
            dropProbe(r);
            r.tables = emptyTables();
            // Workers finish its saves before vLLM reuses the blocks (handle_preemptions) and
            // forget them, so only saves after a resume make request_finished hold blocks.
            r.hadSaves = false;
        }
        stepPreempted.add(requestId);
    }

    /** {@code build_connector_meta}: this step's plan, encoded; the step's state is reset. */
    public byte[] buildPlan() {
        List<StepPlan.Load> loads = new ArrayList<>();
        pendingLoads.values().forEach(loads::addAll);
        for (String id : pendingLoads.keySet()) {
            Req r = requests.get(id);
            if (r != null && inStepLoads) {
                // runs in this step: no finished_recving will come; a failure comes as its blocks
                r.loading = false;
                r.inStepTargets = r.loadTargets;
                r.loadTargets = new long[0];
                r.inStepAge = 0;
                inStepRecent.add(r);
            }
        }
        StepPlan plan = new StepPlan(loads, new ArrayList<>(stepSaves), new ArrayList<>(stepPreempted));
        pendingLoads.clear();
        stepSaves.clear();
        stepPreempted.clear();
        // most decode steps plan nothing: empty bytes, and the workers make no call for them
        return plan.isEmpty() ? StepPlan.EMPTY_BYTES : plan.encode();
    }
    /**
     * {@code request_finished}: true when the request's blocks must stay allocated until a
     * worker reports it in {@code finished_sending} (some of its blocks were sent to be
     * saved). Releases any probe lease never committed.
     */
    public boolean requestFinished(String requestId) {
        Req r = requests.get(requestId);
        if (r == null) {
            return false;
        }
        dropProbe(r);
        // A load committed but not yet sent (vLLM can commit outside schedule(), then abort)
        // stays planned: vLLM keeps the blocks until the workers report it in finished_recving.
        r.finishedByVllm = true;
        if (r.loading) {
            return false; // vLLM itself delays freeing a request that waits for its KV
        }
        if (r.hadSaves) {
            return true;
        }
        requests.remove(requestId);
        return false;
    }

    /**
     * {@code update_connector_output}'s {@code invalid_block_ids}: requests whose load targets
     * include one of them failed to load and are not offered hits again.
     */
    public void failedBlocks(long[] blockIds) {
        if (blockIds.length == 0) {
            return;
        }
        java.util.Set<Long> failed = new java.util.HashSet<>();
        for (long id : blockIds) {
            failed.add(id);
        }
        for (Req r : requests.values()) {
            if (r.loading || r.inStepTargets.length > 0) {
                for (long id : r.loading ? r.loadTargets : r.inStepTargets) {
                    if (failed.contains(id)) {
                        r.loadFailed = true;
                        loadFailures++;
                        break;
                    }
                }
            }
        }
    }

    /**
     * {@code update_connector_output}'s {@code failed_recving} (before {@link #finished}): requests
     * whose load failed, reported by request (a model with several KV-cache groups, where vLLM
     * cannot map block ids back to requests); they are not offered hits again.
     */
    public void failedLoads(List<String> requestIds) {
        for (String id : requestIds) {
            Req r = requests.get(id);
            if (r != null && r.loading && !r.loadFailed) {
                r.loadFailed = true;
                loadFailures++;
            }
        }
    }

    /** {@code update_connector_output}: requests whose saves or loads all workers finished. */
    public void finished(List<String> sending, List<String> recving) {
        // an in-step load's failure arrives with its step's output, at most one step late under
        // vLLM's asynchronous scheduling: its targets are kept that long
        for (var it = inStepRecent.iterator(); it.hasNext(); ) {
            Req r = it.next();
            if (++r.inStepAge >= 2) {
                r.inStepTargets = new long[0];
                it.remove();
            }
        }
        for (String id : recving) {
            Req r = requests.get(id);
            if (r != null) {
                r.loading = false;
                r.loadTargets = new long[0];
                if (r.finishedByVllm) {
                    requests.remove(id); // aborted while loading: nothing else will come
                }
            }
        }
        for (String id : sending) {
            requests.remove(id);
        }
    }

    /** Releases every uncommitted probe (connector shutdown). */
    public void shutdown() {
        for (Req r : requests.values()) {
            dropProbe(r);
        }
        for (List<StepPlan.Load> loads : pendingLoads.values()) {
            for (StepPlan.Load l : loads) {
                Req r = requests.get(l.requestId());
                releaseQuietly(r == null ? null : r.loadEngine, l.group(), l.lease());
            }
        }
        pendingLoads.clear();
    }

    /** Requests with state (tests, metrics). */
    public int trackedRequests() {
        return requests.size();
    }

    /** Longest a request waits for a prefix read back from SSD before it recomputes. */
    public void maxWait(java.time.Duration wait) {
        if (wait == null || wait.isNegative()) {
            throw new InvalidArgumentException("max prefetch wait " + wait + "; expected a duration >= 0");
        }
        maxWaitNanos = wait.toNanos();
    }

    /** Hits that shrank below the full-attention prefix to where every other group had its blocks. */
    public long hitShrinks() {
        return totals[STAT_HIT_SHRINKS];
    }

    /** The KV-cache groups this side serves, in vLLM's order. */
    public List<CacheGroup> groups() {
        return groups;
    }

    /** "Not yet" answers of a decode instance waiting for the whole prefix. */
    public long prefixWaits() {
        return totals[STAT_PREFIX_WAITS];
    }

    /** Lookups answered "not yet" (prefix being read back from SSD or another host). */
    public long notYetAnswers() {
        return totals[STAT_NOT_YET];
    }

    /** Requests that stopped waiting for a read back and recomputed. */
    public long waitTimeouts() {
        return totals[STAT_WAIT_TIMEOUTS];
    }

    public long lookupFailures() {
        return totals[STAT_LOOKUP_FAILURES];
    }

    /** The counters ({@code STAT_*} order) grown since the last call: vLLM's connector stats. */
    public long[] drainStats() {
        foldStagingCounts();
        long[] out = new long[STAT_COUNT];
        for (int i = 0; i < STAT_COUNT; i++) {
            out[i] = totals[i] - drained[i];
            drained[i] = totals[i];
        }
        return out;
    }

    /** Adds what the engine's staging counted since the last call (from zero for an engine not seen before). */
    private void foldStagingCounts() {
        PegaEngine e = source.binding().engine();
        if (e == null) {
            return;
        }
        long[] now;
        try {
            now = e.stagingCounts();
        } catch (RuntimeException closed) {
            return; // counters only: a closed engine has nothing more to say
        }
        long[] seen = e == stagingEngine && stagingSeen.length == now.length ? stagingSeen : new long[now.length];
        for (int i = 0; i < Math.min(now.length, STAGING_STATS.length); i++) {
            totals[STAGING_STATS[i]] += Math.max(0, now[i] - seen[i]);
        }
        stagingEngine = e;
        stagingSeen = now;
    }

    /** Requests whose load failed (they recompute from then on). */
    public long loadFailures() {
        return loadFailures;
    }

    /** update_state_after_alloc calls that committed to a load this side never offered. */
    public long contractViolations() {
        return contractViolations;
    }
}
