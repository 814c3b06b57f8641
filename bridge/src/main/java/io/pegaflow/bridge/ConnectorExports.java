package io.pegaflow.bridge;

import static io.pegaflow.bridge.Marshal.buffer;
import static io.pegaflow.bridge.Marshal.bytes;
import static io.pegaflow.bridge.Marshal.guard;
import static io.pegaflow.bridge.Marshal.hashes;
import static io.pegaflow.bridge.Marshal.lines;
import static io.pegaflow.bridge.Marshal.longs;
import static io.pegaflow.bridge.Marshal.putText;
import static io.pegaflow.bridge.Marshal.str;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import io.pegaflow.connector.CacheGroup;
import io.pegaflow.connector.SchedulerSide;
import io.pegaflow.connector.WorkerSide;
import io.pegaflow.engine.InvalidArgumentException;
import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The vLLM connector's brains ({@code io.pegaflow.connector}) as exports for the Python shim:
 * scheduler side ({@code sched_*}) and worker side ({@code worker_*}), each created on a store
 * link, which gives them the current engine at every call. Results a caller's buffer was too
 * small for are kept for its next call, so nothing is lost.
 */
final class ConnectorExports {
    static final Marshal.Handles<SchedulerSide> SCHEDULERS = new Marshal.Handles<>("scheduler connector");
    static final Marshal.Handles<WorkerSide> WORKERS = new Marshal.Handles<>("worker connector");
    private static final Map<Long, byte[]> UNREAD_PLANS = new ConcurrentHashMap<>();
    private static final Map<Long, byte[]> UNREAD_FINISHED = new ConcurrentHashMap<>();
    private static final Map<Long, long[]> UNREAD_ERRORS = new ConcurrentHashMap<>();

    private ConnectorExports() {}

    private static SchedulerSide sched(long handle) {
        return SCHEDULERS.get(handle);
    }

    private static WorkerSide workerSide(long handle) {
        return WORKERS.get(handle);
    }

    /**
     * {@code groups}: one line per KV-cache group, in vLLM's order, {@code "<kind> <window> <instance_id>"}
     * with kind 0 full attention, 1 sliding window (window: tokens), 2 recurrent state (window 0).
     */
    static List<CacheGroup> groups(MemorySegment text) {
        List<CacheGroup> out = new ArrayList<>();
        for (String line : lines(text, "groups")) {
            String[] f = line.split(" ", 3);
            if (f.length != 3) {
                throw new InvalidArgumentException("KV-cache group line '" + line + "'; expected '<kind> <window> <instance_id>'");
            }
            try {
                out.add(new CacheGroup(f[2], CacheGroup.Kind.of(Integer.parseInt(f[0])), Integer.parseInt(f[1])));
            } catch (NumberFormatException e) {
                throw new InvalidArgumentException("KV-cache group line '" + line + "'; expected integer kind and window");
            }
        }
        return out;
    }

    /** Block tables of every group: {@code counts[g]} ids of group g, back to back in {@code ids}. */
    static long[][] tables(MemorySegment ids, MemorySegment counts, int nGroups, String what) {
        if (nGroups < 1 || nGroups > SchedulerSide.MAX_GROUPS) {
            throw new InvalidArgumentException(what + " of " + nGroups + " KV-cache groups; expected 1 to " + SchedulerSide.MAX_GROUPS);
        }
        long[] n = longs(counts, nGroups, SchedulerSide.MAX_GROUPS, "SchedulerSide.MAX_GROUPS", what + " counts");
        long total = 0;
        for (long c : n) {
            if (c < 0 || c > io.pegaflow.engine.Limits.MAX_HASHES_PER_CALL) {
                throw new InvalidArgumentException(what + " count " + c + "; expected 0 to " + io.pegaflow.engine.Limits.MAX_HASHES_PER_CALL);
            }
            total += c;
        }
        long[] all = longs(ids, (int) total, nGroups * io.pegaflow.engine.Limits.MAX_HASHES_PER_CALL,
                "groups x Limits.MAX_HASHES_PER_CALL", what);
        long[][] out = new long[nGroups][];
        for (int g = 0, at = 0; g < nGroups; at += (int) n[g], g++) {
            out[g] = java.util.Arrays.copyOfRange(all, at, at + (int) n[g]);
        }
        return out;
    }

    static int pfSchedCreate(long link, MemorySegment groups, int blockSize, int loadEnabled, MemorySegment out) {
        return guard(() -> {
            MemorySegment o = buffer(out, 8, "out");
            int mode = loadEnabled & ~(IN_STEP | AT_ALLOC | WARM_UP | PLAN_AT_LOAD);
            if (mode < 0 || mode > 2) {
                throw new io.pegaflow.engine.InvalidArgumentException("sched_create load mode " + loadEnabled
                        + "; expected 0 (no loads), 1 (load) or 2 (load, waiting for the whole prefix: a P/D decode"
                        + " instance), plus 4 for loads inside the step, plus 8 to start those where their blocks are allocated,"
                        + " plus 16 to warm the lookup path up, plus 32 to plan each load at the load, not at its lookup");
            }
            SchedulerSide s = new SchedulerSide(LinkExports.LINKS.get(link), groups(groups), blockSize,
                    mode != 0, mode == 2);
            s.inStepLoads((loadEnabled & IN_STEP) != 0);
            s.loadsAtAlloc((loadEnabled & AT_ALLOC) != 0);
            s.beginAtLookup((loadEnabled & PLAN_AT_LOAD) == 0);
            if ((loadEnabled & WARM_UP) != 0) {
                // a server's client warms its calls too, whether or not the server answers yet
                startWarmUp(blockSize, LinkExports.LINKS.get(link).mode() == io.pegaflow.client.StoreLink.Mode.SERVER);
            }
            o.set(JAVA_LONG, 0, SCHEDULERS.add(s));
        });
    }

    /** {@code *out_tokens}: matched tokens beyond num_computed (0 on a miss or a store failure). */
    static int pfSchedLookup(long sched, MemorySegment reqId, MemorySegment hashes, int n, int hashLen, long numTokens,
            long numComputed, MemorySegment outTokens) {
        return guard(() -> buffer(outTokens, 8, "out_tokens").set(JAVA_LONG, 0, sched(sched).lookup(str(reqId, "req_id"),
                hashes(hashes, n, hashLen), numTokens, numComputed)));
    }

    static int pfSchedAfterAlloc(long sched, MemorySegment reqId, MemorySegment blockIds, MemorySegment counts, int nGroups,
            long numExternal) {
        return guard(() -> sched(sched).afterAlloc(str(reqId, "req_id"), tables(blockIds, counts, nGroups, "block_ids"),
                numExternal));
    }

    static int pfSchedSchedule(long sched, MemorySegment reqId, MemorySegment hashes, int n, int hashLen, int hashOffset,
            MemorySegment newBlockIds, MemorySegment counts, int nGroups, int resumed, long numComputed, long numScheduled) {
        return guard(() -> sched(sched).schedule(str(reqId, "req_id"), hashes(hashes, n, hashLen), hashOffset,
                tables(newBlockIds, counts, nGroups, "new_block_ids"), resumed != 0, numComputed, numScheduled));
    }

    static int pfSchedPreempted(long sched, MemorySegment reqId) {
        return guard(() -> sched(sched).preempted(str(reqId, "req_id")));
    }

    /**
     * Builds this step's plan into {@code buf}; {@code *out_len} is its size. When it does not
     * fit, nothing is lost: PF_INVALID_ARGUMENT is returned with the size, the plan is kept,
     * and the next call (with a larger buffer) returns it.
     */
    static int pfSchedBuildPlan(long sched, MemorySegment buf, long cap, MemorySegment outLen) {
        return guard(() -> {
            byte[] plan = UNREAD_PLANS.remove(sched);
            if (plan == null) {
                plan = sched(sched).buildPlan();
            }
            buffer(outLen, 8, "out_len").set(JAVA_LONG, 0, plan.length);
            if (cap < plan.length) {
                UNREAD_PLANS.put(sched, plan);
                throw new InvalidArgumentException("plan of " + plan.length + " bytes does not fit a buffer of " + cap
                        + " bytes; call again with a buffer of at least " + plan.length);
            }
            MemorySegment.copy(plan, 0, buffer(buf, plan.length == 0 ? 1 : plan.length, "buf"), JAVA_BYTE, 0, plan.length);
        });
    }

    static int pfSchedRequestFinished(long sched, MemorySegment reqId, MemorySegment outHold) {
        return guard(() -> buffer(outHold, 4, "out_hold").set(JAVA_INT, 0,
                sched(sched).requestFinished(str(reqId, "req_id")) ? 1 : 0));
    }

    /**
     * Destination block ids vLLM reported as failed loads this step (update_connector_output's
     * invalid_block_ids); call before sched_finished. Requests whose load they hit stop being
     * offered hits, so a load that keeps failing cannot loop.
     */
    static int pfSchedFailedBlocks(long sched, MemorySegment ids, int n) {
        return guard(() -> sched(sched).failedBlocks(Marshal.blockIds(ids, n, "failed block ids")));
    }

    /** {@code sending}, {@code recving}, {@code failed}: request ids separated by '\n' (NULL or "" for none). */
    static int pfSchedFinished(long sched, MemorySegment sending, MemorySegment recving, MemorySegment failed) {
        return guard(() -> {
            SchedulerSide s = sched(sched);
            s.failedLoads(lines(failed, "failed"));
            s.finished(lines(sending, "sending"), lines(recving, "recving"));
        });
    }

    static int pfSchedClose(long sched) {
        return guard(() -> {
            SchedulerSide s = SCHEDULERS.remove(sched);
            if (s != null) {
                s.shutdown();
            }
            UNREAD_PLANS.remove(sched);
        });
    }

    /**
     * The process's lookup and in-step load warm-up ({@code LookupWarmUp}), once per process, on
     * its own thread: true if this call started it. An optimisation only: a thread that cannot
     * be had is logged, not raised.
     */
    private static boolean startWarmUp(int blockSize, boolean serverMode) {
        try {
            return io.pegaflow.connector.LookupWarmUp.startOnce(blockSize, serverMode) != null;
        } catch (RuntimeException | Error e) {
            System.getLogger(ConnectorExports.class.getName()).log(System.Logger.Level.DEBUG,
                    "lookup warm-up not started", e);
            return false;
        }
    }

    /**
     * {@code warm_up}: a worker in a process of its own (vLLM's workers with several GPUs) asks
     * for the warm-up that {@code sched_create}'s bit 16 starts in the scheduler's process;
     * {@code *out_started} 1 if this call started it, 0 if it ran or runs already.
     */
    static int pfWarmUp(int blockSize, MemorySegment outStarted) {
        return guard(() -> {
            MemorySegment o = buffer(outStarted, 4, "out_started");
            if (blockSize < 1 || blockSize > 65536) {
                throw new io.pegaflow.engine.InvalidArgumentException("warm_up block size " + blockSize
                        + "; expected 1 to 65536 tokens");
            }
            o.set(JAVA_INT, 0, startWarmUp(blockSize, anyServerLink()) ? 1 : 0);
        });
    }

    /**
     * Whether a store link of this process is a server's client: the worker's {@code warm_up}
     * carries no link, and in one process with the scheduler (vLLM on one GPU) it comes first,
     * so its choice is the process's warm-up.
     */
    static boolean anyServerLink() {
        for (long h : LinkExports.LINKS.handles()) {
            try {
                if (LinkExports.LINKS.get(h).mode() == io.pegaflow.client.StoreLink.Mode.SERVER) {
                    return true;
                }
            } catch (RuntimeException closedMeanwhile) {
                // a link closed between the listing and the look: not this process's server
            }
        }
        return false;
    }

    /** {@code groups}: as in sched_create. */
    static int pfWorkerCreate(long link, MemorySegment groups, int workerRank, MemorySegment out) {
        return guard(() -> {
            MemorySegment o = buffer(out, 8, "out");
            WorkerSide w = new WorkerSide(LinkExports.LINKS.get(link), groups(groups), workerRank);
            o.set(JAVA_LONG, 0, WORKERS.add(w));
        });
    }

    static int pfWorkerStartLoads(long worker, MemorySegment plan, long len) {
        return guard(() -> workerSide(worker).startLoads(bytes(plan, len, "plan")));
    }

    /** sched_create's load-mode bit: hits are loaded inside the step that uses them (ABI 6). */
    static final int IN_STEP = 4;
    /** sched_create mode bit: in-step loads start where their blocks are allocated (a worker in this process). */
    static final int AT_ALLOC = 8;
    /** sched_create mode bit: warm the lookup path up on a scratch engine ({@code LookupWarmUp}), once per process. */
    static final int WARM_UP = 16;
    /** sched_create mode bit: a load asks for its plan itself, never taking one its lookup began. */
    static final int PLAN_AT_LOAD = 32;

    /** start_load_kv: as worker_start_loads; *out_in_step gets the step's loads that run inside it (ABI 6). */
    static int pfWorkerStartStepLoads(long worker, MemorySegment plan, long len, MemorySegment outInStep) {
        return guard(() -> {
            MemorySegment o = buffer(outInStep, 4, "out_in_step");
            o.set(JAVA_INT, 0, workerSide(worker).startLoads(bytes(plan, len, "plan")));
        });
    }

    /** wait_for_layer_load: stream waits for registered region {@code layer} of the step's in-step loads (ABI 6). */
    static int pfWorkerWaitLayer(long worker, int layer, long stream) {
        return guard(() -> workerSide(worker).waitLayer(layer, stream));
    }

    static int pfWorkerSubmitSaves(long worker, MemorySegment plan, long len, long stream) {
        return guard(() -> workerSide(worker).submitSaves(bytes(plan, len, "plan"), stream));
    }

    static int pfWorkerAwaitPreempted(long worker, MemorySegment plan, long len) {
        return guard(() -> workerSide(worker).awaitPreempted(bytes(plan, len, "plan")));
    }

    /** The last line of a {@link #pfWorkerGetFinished} answer when the worker is {@link WorkerSide#idle}. */
    private static final byte[] IDLE_LINE = "I -\n".getBytes(StandardCharsets.UTF_8);

    /**
     * {@code finished}: ids vLLM finished this step ('\n'-separated). Writes lines "S <id>"
     * (saves done: free the blocks), "R <id>" (load done) and "F <id>" (that load failed) into
     * {@code buf}, then "I -" when nothing is left for a later call to report ({@link
     * WorkerSide#idle}, as of this call); *out_len is the text's length (the results are kept
     * for the next call when they do not fit, and its "I" line is that call's).
     */
    static int pfWorkerGetFinished(long worker, MemorySegment finished, MemorySegment buf, int cap, MemorySegment outLen) {
        return guard(() -> {
            WorkerSide side = workerSide(worker);
            byte[] text = UNREAD_FINISHED.remove(worker);
            if (text == null) {
                WorkerSide.Finished f = side.getFinished(lines(finished, "finished"));
                StringBuilder sb = new StringBuilder();
                f.sending().forEach(id -> sb.append("S ").append(id).append('\n'));
                f.recving().forEach(id -> sb.append("R ").append(id).append('\n'));
                f.failed().forEach(id -> sb.append("F ").append(id).append('\n'));
                text = sb.toString().getBytes(StandardCharsets.UTF_8);
            } else {
                side.noteFinished(lines(finished, "finished")); // results are taken on the next call
            }
            byte[] out = text;
            if (side.idle()) {
                out = java.util.Arrays.copyOf(text, text.length + IDLE_LINE.length);
                System.arraycopy(IDLE_LINE, 0, out, text.length, IDLE_LINE.length);
            }
            if (cap <= out.length) {
                UNREAD_FINISHED.put(worker, text); // returned by the next call, with a larger buffer
            }
            putText(out, buf, cap, outLen, "finished list");
        });
    }

    static int pfWorkerLoadErrors(long worker, MemorySegment out, int cap, MemorySegment outCount) {
        return guard(() -> {
            long[] ids = UNREAD_ERRORS.remove(worker);
            if (ids == null) {
                ids = workerSide(worker).drainLoadErrors();
            }
            buffer(outCount, 4, "out_count").set(JAVA_INT, 0, ids.length);
            if (ids.length > cap) {
                UNREAD_ERRORS.put(worker, ids);
                throw new InvalidArgumentException(ids.length + " failed block ids do not fit " + cap
                        + "; call again with room for " + ids.length);
            }
            if (ids.length > 0) {
                MemorySegment.copy(ids, 0, buffer(out, 8L * ids.length, "out"), JAVA_LONG, 0, ids.length);
            }
        });
    }

    static int pfWorkerClose(long worker) {
        return guard(() -> {
            WorkerSide w = WORKERS.remove(worker);
            UNREAD_FINISHED.remove(worker);
            UNREAD_ERRORS.remove(worker);
            if (w != null) {
                w.shutdown();
            }
        });
    }

    /** The counters pegaflow.h promised since ABI 6: a smaller cap is refused, a larger one takes what this build has. */
    static final int WORKER_STATS_ABI6 = 10;

    static int pfWorkerStats(long worker, MemorySegment out, int cap, MemorySegment outCount) {
        return guard(() -> {
            WorkerSide w = workerSide(worker);
            if (cap < WORKER_STATS_ABI6) {
                throw new InvalidArgumentException("worker_stats cap " + cap + "; expected >= " + WORKER_STATS_ABI6
                        + " (this build has " + WorkerSide.STAT_COUNT + " counters)");
            }
            long[] stats = w.drainStats();
            int n = Math.min(cap, stats.length); // a caller built against an older header gets the counters it knows
            buffer(outCount, 4, "out_count").set(JAVA_INT, 0, n);
            MemorySegment.copy(stats, 0, buffer(out, 8L * n, "out"), JAVA_LONG, 0, n);
        });
    }

    /**
     * {@code sched_lookup} with the prompt's partial last block (P/D's tail flow): {@code
     * tail_tokens[0..n_tail)} after the {@code n} full blocks' hashes; the tail's key is derived
     * in Java ({@code VllmBlockHasher.tailKey}). Since ABI 9.
     */
    static int pfSchedLookupTail(long sched, MemorySegment reqId, MemorySegment hashes, int n, int hashLen,
            MemorySegment tailTokens, int nTail, long numTokens, long numComputed, MemorySegment outTokens) {
        return guard(() -> {
            if (nTail < 1 || nTail > io.pegaflow.engine.hash.VllmBlockHasher.MAX_TAIL_TOKENS) {
                throw new InvalidArgumentException("sched_lookup_tail: n_tail " + nTail + "; expected 1 to "
                        + io.pegaflow.engine.hash.VllmBlockHasher.MAX_TAIL_TOKENS);
            }
            int[] tail = buffer(tailTokens, 4L * nTail, "tail_tokens").toArray(JAVA_INT);
            buffer(outTokens, 8, "out_tokens").set(JAVA_LONG, 0, sched(sched).lookup(str(reqId, "req_id"),
                    hashes(hashes, n, hashLen), tail, numTokens, numComputed));
        });
    }

    /** The scheduler-side counters pegaflow.h promised since ABI 9: a smaller cap is refused, a larger one takes what this build has. */
    static final int SCHED_STATS_ABI9 = 9;

    /** The scheduler side's counters since the last call ({@code SchedulerSide.STAT_*} order). Since ABI 9. */
    static int pfSchedStats(long sched, MemorySegment out, int cap, MemorySegment outCount) {
        return guard(() -> {
            if (cap < SCHED_STATS_ABI9) {
                throw new InvalidArgumentException("sched_stats cap " + cap + "; expected >= " + SCHED_STATS_ABI9
                        + " (this build has " + SchedulerSide.STAT_COUNT + " counters)");
            }
            long[] stats = sched(sched).drainStats();
            int n = Math.min(cap, stats.length); // a caller built against an older header gets the counters it knows
            buffer(outCount, 4, "out_count").set(JAVA_INT, 0, n);
            MemorySegment.copy(stats, 0, buffer(out, 8L * n, "out"), JAVA_LONG, 0, n);
        });
    }

    /** The key of a prompt's partial last block ({@code VllmBlockHasher.tailKey}) into out[0..parent_len). Since ABI 9. */
    static int pfTailKey(MemorySegment parent, int parentLen, MemorySegment tokens, int n, MemorySegment out) {
        return guard(() -> {
            if (parentLen < 1 || parentLen > 32) {
                throw new InvalidArgumentException("tail_key: parent_len " + parentLen + "; expected 1 to 32");
            }
            if (n < 1 || n > io.pegaflow.engine.hash.VllmBlockHasher.MAX_TAIL_TOKENS) {
                throw new InvalidArgumentException("tail_key: n " + n + "; expected 1 to "
                        + io.pegaflow.engine.hash.VllmBlockHasher.MAX_TAIL_TOKENS);
            }
            byte[] key = io.pegaflow.engine.hash.VllmBlockHasher.tailKey(bytes(parent, parentLen, "parent"),
                    buffer(tokens, 4L * n, "tokens").toArray(JAVA_INT));
            MemorySegment.copy(key, 0, buffer(out, key.length, "out"), JAVA_BYTE, 0, key.length);
        });
    }
}
