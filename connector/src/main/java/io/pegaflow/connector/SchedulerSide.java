package io.pegaflow.connector;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.EngineSource;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.Token;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.PegaflowException;
import io.pegaflow.engine.QueryResult;
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
 */
public final class SchedulerSide {
    /** What {@link #lookup} returns for "not known yet, ask again" (vLLM's None). */
    public static final long ASK_AGAIN = -1;

    private final EngineSource source;
    private final String instanceId;
    private final int blockSize;
    private final boolean loadEnabled;
    /** A P/D decode instance: a partial hit answers "not yet" until the whole prefix is there (or maxWait). */
    private final boolean waitFullPrefix;
    private long prefixWaits;
    private final Map<String, Req> requests = new HashMap<>();
    private final Map<String, StepPlan.Load> pendingLoads = new LinkedHashMap<>();
    private final List<StepPlan.Save> stepSaves = new ArrayList<>();
    private final List<String> stepPreempted = new ArrayList<>();
    private long lookupFailures;
    private long notYetAnswers;
    private long waitTimeouts;
    private long maxWaitNanos = java.util.concurrent.TimeUnit.SECONDS.toNanos(10);
    /** {@link #lookup}'s answer while the prefix is read back from a lower tier: vLLM asks again. */
    public static final long NOT_YET = -1;
    private long contractViolations;
    private long loadFailures;

    /** A lease no store issues: a load carrying it fails on every block (recompute). */
    static final Token NO_LEASE = Token.NONE;

    /** Per-request state. */
    private static final class Req {
        // probe: the exact window it asked about, the engine and generation its lease is from
        BlockHashes probeWindow;
        int probeBase;
        int probeHit;
        Token probeLease;
        PegaEngine probeEngine;
        long probeGeneration;
        boolean probed;
        // blocks
        long[] table = new long[0];
        int savedUpTo;
        boolean hadSaves;
        boolean loading;
        PegaEngine loadEngine; // issued the pending load's lease (released there at shutdown)
        long[] loadTargets = new long[0];
        boolean loadFailed; // a load of this request failed: no more hits for it (recompute)
        boolean prefixWaitOver; // a decode instance waited its limit for the whole prefix
        boolean finishedByVllm;
        long waitingSince; // nanoTime of the first "not yet" answer; 0: not waiting
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
        if (blockSize < 1) {
            throw new InvalidArgumentException("block size " + blockSize + "; expected >= 1 token");
        }
        if (source == null) {
            throw new InvalidArgumentException("engine source is null; expected the store link");
        }
        this.source = source;
        this.instanceId = instanceId;
        this.blockSize = blockSize;
        this.loadEnabled = loadEnabled;
        this.waitFullPrefix = waitFullPrefix;
    }

    private Req req(String id) {
        return requests.computeIfAbsent(id, k -> new Req());
    }

    /**
     * {@code get_num_new_matched_tokens}: how many tokens beyond {@code numComputedTokens}
     * can be loaded, given the request's full-block hashes. At least the last prompt token is
     * always left to compute. The answer (and its lease) is memoized while the inputs are
     * the same, so calling again changes nothing; changed inputs release the old lease first.
     * Returns 0 on any store failure (server down, instance not registered yet).
     */
    public long lookup(String requestId, BlockHashes hashes, long numTokens, long numComputedTokens) {
        Req r = req(requestId);
        int base = (int) (numComputedTokens / blockSize);
        int usable = (int) Math.min(hashes.count(), Math.max(0, (numTokens - 1) / blockSize)) - base;
        EngineSource.Binding now = source.binding();
        if (!loadEnabled || usable <= 0 || now.engine() == null || r.loadFailed) {
            dropProbe(r);
            return 0;
        }
        if (r.probed && r.probeGeneration == now.generation() && r.probeBase == base
                && r.probeWindow.count() == usable && r.probeWindow.sameAs(hashes, base)) {
            return (long) r.probeHit * blockSize;
        }
        dropProbe(r);
        BlockHashes window = hashes.slice(base, base + usable);
        QueryResult q;
        try {
            q = now.engine().query(instanceId, window);
        } catch (PegaflowException e) {
            lookupFailures++;
            r.waitingSince = 0;
            return 0; // the store is unavailable or not ready: recompute
        }
        if (waitFullPrefix && !q.pending() && q.hitBlocks() < usable && !r.prefixWaitOver) {
            long t = System.nanoTime();
            if (r.waitingSince == 0) {
                r.waitingSince = t;
            }
            if (t - r.waitingSince < maxWaitNanos) {
                if (q.lease() != null) {
                    releaseQuietly(now.engine(), q.lease()); // asked again next step
                }
                notYetAnswers++;
                prefixWaits++;
                return NOT_YET;
            }
            waitTimeouts++;
            r.prefixWaitOver = true; // take what is there from now on
        } else if (q.pending()) {
            // The prefix continues on SSD and is being read back: vLLM keeps the request
            // waiting and asks again next step, up to the wait limit; then it recomputes.
            long t = System.nanoTime();
            if (r.waitingSince == 0) {
                r.waitingSince = t;
            }
            if (t - r.waitingSince < maxWaitNanos) {
                notYetAnswers++;
                return NOT_YET;
            }
            waitTimeouts++;
            r.waitingSince = 0;
            r.loadFailed = true; // no more waiting for this request
            return 0;
        }
        r.waitingSince = 0;
        r.probed = true;
        r.probeWindow = window;
        r.probeBase = base;
        r.probeHit = q.hitBlocks();
        r.probeLease = q.lease();
        r.probeEngine = now.engine();
        r.probeGeneration = now.generation();
        return (long) q.hitBlocks() * blockSize;
    }

    private void dropProbe(Req r) {
        if (r.probeLease != null) {
            releaseQuietly(r.probeEngine, r.probeLease);
        }
        r.probed = false;
        r.probeLease = null;
        r.probeEngine = null;
        r.probeWindow = null;
        r.probeHit = 0;
    }

    /** On the engine that issued it: after a restart the old engine is closed and this fails quietly. */
    private void releaseQuietly(PegaEngine engine, Token lease) {
        if (engine == null) {
            return;
        }
        try {
            engine.release(instanceId, lease);
        } catch (PegaflowException ignored) {
            // expired, or the server is gone: either way nothing stays pinned
        }
    }

    /**
     * {@code update_state_after_alloc}: vLLM allocated {@code blockIds} (the request's whole
     * block table for its single KV-cache group) and will load {@code numExternalTokens}.
     * The probe's lease becomes a pending load into the blocks after the locally computed
     * ones; with 0 external tokens the probe is released.
     */
    public void afterAlloc(String requestId, long[] blockIds, long numExternalTokens) {
        Req r = req(requestId);
        r.table = blockIds.clone();
        if (numExternalTokens <= 0) {
            if (r.probed) {
                dropProbe(r);
            }
            return;
        }
        int blocks = (int) (numExternalTokens / blockSize);
        int base = (int) Math.min(r.probeBase, blockIds.length);
        if (!r.probed || r.probeLease == null || blocks != r.probeHit || blockIds.length < base + blocks
                || numExternalTokens % blockSize != 0) {
            // vLLM committed to a load we did not offer (not the contract; never seen): the
            // request waits for finished_recving, so send a load that fails on every target
            // block; the worker reports it and vLLM recomputes (kv_load_failure_policy=recompute).
            contractViolations++;
            dropProbe(r);
            int from = Math.min(base, blockIds.length);
            int to = (int) Math.min(blockIds.length, from + Math.max(1, (numExternalTokens + blockSize - 1) / blockSize));
            r.loadTargets = Arrays.copyOfRange(blockIds, from, to);
            pendingLoads.put(requestId, new StepPlan.Load(requestId, NO_LEASE, r.loadTargets));
            r.loading = true;
            r.loadEngine = null;
            return;
        }
        r.loadTargets = Arrays.copyOfRange(blockIds, base, base + blocks);
        pendingLoads.put(requestId, new StepPlan.Load(requestId, r.probeLease, r.loadTargets));
        r.loading = true;
        r.loadEngine = r.probeEngine;
        r.savedUpTo = Math.max(r.savedUpTo, base + blocks); // loaded blocks are already stored
        r.probed = false;
        r.probeLease = null;
        r.probeEngine = null;
        r.probeWindow = null;
    }

    /**
     * One scheduled request of this step: a window of its full-block hashes (hash
     * {@code hashOffset + i} is the i-th of {@code hashes}; callers pass only hashes they
     * have not passed before), the new block ids appended to its table (or its whole table when
     * {@code resumed}), and its token counts. Full blocks that this step completes and that are
     * not stored yet are saved.
     */
    public void schedule(String requestId, BlockHashes hashes, int hashOffset, long[] newBlockIds,
            boolean resumed, long numComputedTokens, long numScheduledTokens) {
        if (hashOffset < 0) {
            throw new InvalidArgumentException("request " + requestId + ": hash offset " + hashOffset + "; expected >= 0");
        }
        Req r = req(requestId);
        if (resumed) {
            r.table = newBlockIds.clone();
        } else if (newBlockIds.length > 0) {
            long[] t = Arrays.copyOf(r.table, r.table.length + newBlockIds.length);
            System.arraycopy(newBlockIds, 0, t, r.table.length, newBlockIds.length);
            r.table = t;
        }
        int count = hashOffset + hashes.count();
        // Blocks vLLM had cached locally are saved too (deduplicated if already stored), so
        // other instances sharing the store find them.
        int full = (int) Math.min(count, Math.min(r.table.length, (numComputedTokens + numScheduledTokens) / blockSize));
        int from = Math.max(r.savedUpTo, hashOffset);
        if (full <= from) {
            return;
        }
        long[] ids = Arrays.copyOfRange(r.table, from, full);
        stepSaves.add(new StepPlan.Save(requestId, ids, hashes.slice(from - hashOffset, full - hashOffset)));
        r.savedUpTo = full;
        r.hadSaves = true;
    }

    /** A request was preempted this step: its blocks are freed; it may be resumed later. */
    public void preempted(String requestId) {
        Req r = requests.get(requestId);
        if (r != null) {
            dropProbe(r);
            r.table = new long[0];
            // Workers finish its saves before vLLM reuses the blocks (handle_preemptions) and
            // forget them, so only saves after a resume make request_finished hold blocks.
            r.hadSaves = false;
        }
        stepPreempted.add(requestId);
    }

    /** {@code build_connector_meta}: this step's plan, encoded; the step's state is reset. */
    public byte[] buildPlan() {
        StepPlan plan = new StepPlan(new ArrayList<>(pendingLoads.values()), new ArrayList<>(stepSaves),
                new ArrayList<>(stepPreempted));
        pendingLoads.clear();
        stepSaves.clear();
        stepPreempted.clear();
        return plan.encode();
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
            if (r.loading) {
                for (long id : r.loadTargets) {
                    if (failed.contains(id)) {
                        r.loadFailed = true;
                        loadFailures++;
                        break;
                    }
                }
            }
        }
    }

    /** {@code update_connector_output}: requests whose saves or loads all workers finished. */
    public void finished(List<String> sending, List<String> recving) {
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
        for (StepPlan.Load l : pendingLoads.values()) {
            Req r = requests.get(l.requestId());
            releaseQuietly(r == null ? null : r.loadEngine, l.lease());
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

    /** Lookups answered "not yet" (prefix being read back from SSD). */
    /** "Not yet" answers of a decode instance waiting for the whole prefix. */
    public long prefixWaits() {
        return prefixWaits;
    }

    public long notYetAnswers() {
        return notYetAnswers;
    }

    /** Requests that stopped waiting for a read back and recomputed. */
    public long waitTimeouts() {
        return waitTimeouts;
    }

    public long lookupFailures() {
        return lookupFailures;
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
