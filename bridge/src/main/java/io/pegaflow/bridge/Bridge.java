package io.pegaflow.bridge;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.EngineStats;
import io.pegaflow.engine.ErrorCode;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.LeaseId;
import io.pegaflow.engine.LoadResult;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.PegaflowException;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.SaveResult;
import io.pegaflow.engine.TransferFailedException;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.cuda.CudaOptions;
import io.pegaflow.engine.cuda.CudaTransferEngine;
import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.metrics.Gauge;
import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The engine as a C ABI: {@link #bootstrap()} builds, once per process, a table of Panama
 * upcall stubs (the {@code pegaflow_api} struct of {@code bridge/include/pegaflow.h}) and
 * returns its address. Python (ctypes) and C/C++/Rust hosts call the engine through it as
 * plain C functions.
 *
 * <p>Rules every exported function follows: arguments and results are primitives, addresses
 * and byte buffers; the return value is an {@link ErrorCode} value (0 = ok) and outputs go
 * through pointers; nothing is thrown across the boundary (an escaping exception would kill
 * the host process), and the message of the last failure is kept per thread for
 * {@code last_error}. Any thread may call: foreign threads are attached by the JVM on their
 * first upcall. Engines and completions are handles ({@code int64}) into maps here.
 */
public final class Bridge {
    /** Bumped on any change to the table's layout or a function's signature. */
    public static final int ABI_VERSION = 1;

    private static final ThreadLocal<String> LAST_ERROR = ThreadLocal.withInitial(() -> "");
    private static final Map<Long, PegaEngine> ENGINES = new ConcurrentHashMap<>();
    private static final Map<Long, CompletableFuture<?>> COMPLETIONS = new ConcurrentHashMap<>();
    private static final Map<Long, io.pegaflow.connector.SchedulerSide> SCHEDULERS = new ConcurrentHashMap<>();
    private static final Map<Long, byte[]> UNREAD_PLANS = new ConcurrentHashMap<>();
    private static final Map<Long, io.pegaflow.connector.WorkerSide> WORKERS = new ConcurrentHashMap<>();
    private static final AtomicLong NEXT_HANDLE = new AtomicLong(1);
    private static volatile long table;

    /** Fields per layer in {@code register_worker}'s {@code layer_params}. */
    static final int LAYER_PARAMS = 7;

    private Bridge() {}

    /**
     * The function table's address (built on first call). Called through JNI by the host
     * right after it created the JVM: {@code CallStaticLongMethodA(Bridge, "bootstrap", "()J")}.
     */
    public static synchronized long bootstrap() {
        if (table == 0) {
            table = buildTable();
        }
        return table;
    }

    /** Exported functions in table order; the order is the ABI (see pegaflow.h). */
    private static final String[] EXPORTS = {
        "last_error", "noop", "engine_create", "engine_close", "register_instance", "register_worker",
        "unregister_instance", "save", "query", "load", "release", "wait", "poll", "completion_free",
        "failed_blocks", "stats", "shutdown", "engine_connect",
        "sched_create", "sched_lookup", "sched_after_alloc", "sched_schedule", "sched_preempted", "sched_build_plan",
        "sched_request_finished", "sched_finished", "sched_close",
        "worker_create", "worker_start_loads", "worker_submit_saves", "worker_await_preempted", "worker_get_finished",
        "worker_load_errors", "worker_close", "sched_rebind", "worker_rebind", "engine_server_id",
        "sched_failed_blocks",
    };

    private static long buildTable() {
        Linker linker = Linker.nativeLinker();
        MemorySegment t = Arena.global().allocate(8L + 8L * EXPORTS.length, 8);
        t.set(JAVA_INT, 0, ABI_VERSION);
        t.set(JAVA_INT, 4, EXPORTS.length);
        MethodHandles.Lookup lookup = MethodHandles.lookup();
        for (int i = 0; i < EXPORTS.length; i++) {
            Method m = find(EXPORTS[i]);
            try {
                MethodHandle h = lookup.unreflect(m);
                MemorySegment stub = linker.upcallStub(h, descriptor(m.getParameterTypes()), Arena.global());
                t.set(ADDRESS, 8L + 8L * i, stub);
            } catch (IllegalAccessException e) {
                throw new IllegalStateException("cannot export " + m, e);
            }
        }
        return t.address();
    }

    private static Method find(String export) {
        String name = camel(export);
        for (Method m : Bridge.class.getDeclaredMethods()) {
            if (m.getName().equals(name) && Modifier.isStatic(m.getModifiers()) && m.getReturnType() == int.class) {
                return m;
            }
        }
        throw new IllegalStateException("no exported method " + name + " for " + export);
    }

    private static String camel(String export) {
        StringBuilder sb = new StringBuilder("pf");
        for (String part : export.split("_")) {
            sb.append(Character.toUpperCase(part.charAt(0))).append(part.substring(1));
        }
        return sb.toString();
    }

    private static FunctionDescriptor descriptor(Class<?>[] params) {
        MemoryLayout[] layouts = new MemoryLayout[params.length];
        for (int i = 0; i < params.length; i++) {
            layouts[i] = params[i] == int.class ? JAVA_INT : params[i] == long.class ? JAVA_LONG : ADDRESS;
        }
        return FunctionDescriptor.of(JAVA_INT, layouts);
    }

    // ---------------------------------------------------------------- error plumbing

    @FunctionalInterface
    private interface Body {
        void run() throws Exception;
    }

    /** Runs {@code body}; maps any throwable to an error code and keeps its message for this thread. */
    private static int guard(Body body) {
        try {
            body.run();
            return 0;
        } catch (PegaflowException e) {
            LAST_ERROR.set(e.getMessage());
            return e.code().value();
        } catch (Throwable t) {
            LAST_ERROR.set(t.getClass().getName() + ": " + t.getMessage());
            return ErrorCode.INTERNAL.value();
        }
    }

    private static String str(MemorySegment p, String what) {
        if (p.equals(MemorySegment.NULL)) {
            throw new InvalidArgumentException(what + " is NULL; expected a NUL-terminated UTF-8 string");
        }
        return p.reinterpret(Long.MAX_VALUE).getString(0, StandardCharsets.UTF_8);
    }

    private static MemorySegment buffer(MemorySegment p, long bytes, String what) {
        if (p.equals(MemorySegment.NULL)) {
            throw new InvalidArgumentException(what + " is NULL; expected a buffer of " + bytes + " bytes");
        }
        return p.reinterpret(bytes);
    }

    private static PegaEngine engine(long handle) {
        PegaEngine e = ENGINES.get(handle);
        if (e == null) {
            throw new InvalidArgumentException("engine handle " + handle + " is unknown or closed");
        }
        return e;
    }

    private static CompletableFuture<?> completion(long handle) {
        CompletableFuture<?> f = COMPLETIONS.get(handle);
        if (f == null) {
            throw new InvalidArgumentException("completion handle " + handle + " is unknown or freed");
        }
        return f;
    }

    private static long[] longs(MemorySegment p, int n, String what) {
        if (n < 0) {
            throw new InvalidArgumentException(what + " count " + n + "; expected >= 0");
        }
        return n == 0 ? new long[0] : buffer(p, 8L * n, what).toArray(JAVA_LONG);
    }

    private static byte[][] hashes(MemorySegment p, int n, int hashLen) {
        if (n < 0 || (n > 0 && (hashLen < 1 || hashLen > 64))) {
            throw new InvalidArgumentException("hashes: count " + n + ", hash_len " + hashLen
                    + "; expected count >= 0 and 1 <= hash_len <= 64");
        }
        byte[][] out = new byte[n][];
        if (n == 0) {
            return out;
        }
        byte[] all = buffer(p, (long) n * hashLen, "hashes").toArray(JAVA_BYTE);
        for (int i = 0; i < n; i++) {
            out[i] = Arrays.copyOfRange(all, i * hashLen, (i + 1) * hashLen);
        }
        return out;
    }

    // ---------------------------------------------------------------- exports (pf + camel-cased C name)

    /** Copies this thread's last error message (UTF-8, NUL-terminated, truncated to cap-1); returns its full length. */
    static int pfLastError(MemorySegment buf, int cap) {
        try {
            byte[] msg = LAST_ERROR.get().getBytes(StandardCharsets.UTF_8);
            if (!buf.equals(MemorySegment.NULL) && cap > 0) {
                MemorySegment b = buf.reinterpret(cap);
                int n = Math.min(msg.length, cap - 1);
                MemorySegment.copy(msg, 0, b, JAVA_BYTE, 0, n);
                b.set(JAVA_BYTE, n, (byte) 0);
            }
            return msg.length;
        } catch (Throwable t) {
            return 0;
        }
    }

    /** Does nothing: the cost of one call across the boundary. */
    static int pfNoop() {
        return 0;
    }

    /** {@code flags} bit 0: commit every pool page now ({@link EngineConfig#prefault()}). */
    static int pfEngineCreate(MemorySegment poolSize, int copyThreads, long leaseTtlMs, int transfer, int device,
            int flags, MemorySegment outEngine) {
        return guard(() -> {
            if ((flags & ~1) != 0) {
                throw new InvalidArgumentException("engine_create: flags 0x" + Integer.toHexString(flags)
                        + "; expected only bit 0 (prefault)");
            }
            EngineConfig.Builder b = EngineConfig.builder().poolSize(str(poolSize, "pool_size")).copyThreads(copyThreads)
                    .prefault((flags & 1) != 0);
            if (leaseTtlMs > 0) {
                b.leaseTtl(Duration.ofMillis(leaseTtlMs));
            }
            switch (transfer) {
                case 0 -> { }
                case 1 -> b.transfer(pool -> CudaTransferEngine.create(pool, CudaOptions.defaults().withDevice(device)));
                default -> throw new InvalidArgumentException("transfer " + transfer + "; expected 0 (host) or 1 (cuda)");
            }
            MemorySegment out = buffer(outEngine, 8, "out_engine");
            PegaEngine engine = PegaEngine.create(b.build());
            long handle = NEXT_HANDLE.getAndIncrement();
            ENGINES.put(handle, engine);
            out.set(JAVA_LONG, 0, handle);
        });
    }

    static int pfEngineClose(long engine) {
        return guard(() -> {
            PegaEngine e = ENGINES.remove(engine);
            SERVER_IDS.remove(engine);
            if (e == null) {
                throw new InvalidArgumentException("engine handle " + engine + " is unknown or closed");
            }
            e.close();
        });
    }

    static int pfRegisterInstance(long engine, MemorySegment instanceId, MemorySegment namespace, int tpSize, int worldSize) {
        return guard(() -> engine(engine).registerInstance(
                new InstanceSpec(str(instanceId, "instance_id"), str(namespace, "namespace"), tpSize, worldSize)));
    }

    /**
     * {@code layer_names}: the layers' names separated by '\n'; {@code layer_params}: per
     * layer 7 int64 (layout 0=SPLIT_KV 1=COMBINED 2=MLA, base address, region bytes, blocks,
     * block stride, segment bytes, segment offset).
     */
    static int pfRegisterWorker(long engine, MemorySegment instanceId, int workerRank, int tpRank, int deviceId,
            int numLayers, MemorySegment layerNames, MemorySegment layerParams) {
        return guard(() -> {
            String[] names = str(layerNames, "layer_names").split("\n", -1);
            if (numLayers < 1 || names.length != numLayers) {
                throw new InvalidArgumentException("register_worker: num_layers " + numLayers + " but " + names.length
                        + " names in layer_names; expected equal and >= 1");
            }
            long[] p = longs(layerParams, numLayers * LAYER_PARAMS, "layer_params");
            List<LayerRegion> regions = new ArrayList<>();
            KvLayout[] layouts = KvLayout.values();
            for (int i = 0; i < numLayers; i++) {
                int at = i * LAYER_PARAMS;
                if (p[at] < 0 || p[at] >= layouts.length) {
                    throw new InvalidArgumentException("layer '" + names[i] + "': layout " + p[at]
                            + "; expected 0 (SPLIT_KV), 1 (COMBINED) or 2 (MLA)");
                }
                if (p[at + 3] > Integer.MAX_VALUE) {
                    throw new InvalidArgumentException("layer '" + names[i] + "': numBlocks " + p[at + 3] + " too large");
                }
                regions.add(new LayerRegion(names[i], layouts[(int) p[at]], p[at + 1], p[at + 2], (int) p[at + 3],
                        p[at + 4], p[at + 5], p[at + 6]));
            }
            engine(engine).registerWorker(str(instanceId, "instance_id"), new WorkerSpec(workerRank, tpRank, deviceId, regions));
        });
    }

    static int pfUnregisterInstance(long engine, MemorySegment instanceId) {
        return guard(() -> engine(engine).unregisterInstance(str(instanceId, "instance_id")));
    }

    /** {@code layer_names}: NULL for all of the worker's layers, else '\n'-separated names. */
    static int pfSave(long engine, MemorySegment instanceId, int workerRank, int n, MemorySegment blockIds,
            MemorySegment hashes, int hashLen, MemorySegment layerNames, long waitStream, MemorySegment outCompletion) {
        return guard(() -> {
            MemorySegment out = buffer(outCompletion, 8, "out_completion");
            List<String> layers = layerNames.equals(MemorySegment.NULL) ? null : List.of(str(layerNames, "layer_names").split("\n"));
            CompletableFuture<SaveResult> f = engine(engine).save(str(instanceId, "instance_id"), workerRank, layers,
                    longs(blockIds, n, "block_ids"), hashes(hashes, n, hashLen), waitStream);
            long handle = NEXT_HANDLE.getAndIncrement();
            COMPLETIONS.put(handle, f);
            out.set(JAVA_LONG, 0, handle);
        });
    }

    /** Writes the hit count and, when it is > 0, the 16-byte lease (else 16 zero bytes). */
    static int pfQuery(long engine, MemorySegment instanceId, int n, MemorySegment hashes, int hashLen,
            MemorySegment outHit, MemorySegment outLease) {
        return guard(() -> {
            MemorySegment hit = buffer(outHit, 4, "out_hit");
            MemorySegment lease = buffer(outLease, LeaseId.BYTES, "out_lease");
            if (n < 0) {
                throw new InvalidArgumentException("query: hash count " + n + "; expected >= 0");
            }
            byte[] packed = n == 0 ? new byte[0] : buffer(hashes, (long) n * hashLen, "hashes").toArray(JAVA_BYTE);
            QueryResult q = engine(engine).query(str(instanceId, "instance_id"), packed, hashLen);
            hit.set(JAVA_INT, 0, q.hitBlocks());
            byte[] bytes = q.hasLease() ? q.lease().toBytes() : new byte[LeaseId.BYTES];
            MemorySegment.copy(bytes, 0, lease, JAVA_BYTE, 0, LeaseId.BYTES);
        });
    }

    static int pfLoad(long engine, MemorySegment instanceId, int workerRank, MemorySegment lease, int n,
            MemorySegment dstBlockIds, MemorySegment outCompletion) {
        return guard(() -> {
            MemorySegment out = buffer(outCompletion, 8, "out_completion");
            LeaseId id = LeaseId.fromBytes(buffer(lease, LeaseId.BYTES, "lease").toArray(JAVA_BYTE));
            CompletableFuture<LoadResult> f = engine(engine).load(str(instanceId, "instance_id"), workerRank, id,
                    longs(dstBlockIds, n, "dst_block_ids"));
            long handle = NEXT_HANDLE.getAndIncrement();
            COMPLETIONS.put(handle, f);
            out.set(JAVA_LONG, 0, handle);
        });
    }

    static int pfRelease(long engine, MemorySegment lease) {
        return guard(() -> engine(engine).release(LeaseId.fromBytes(buffer(lease, LeaseId.BYTES, "lease").toArray(JAVA_BYTE))));
    }

    /**
     * Waits up to {@code timeout_ms} (< 0: forever) for a completion; on success writes three
     * int64: blocks saved (or loaded), blocks skipped (saves), bytes copied. A failed operation
     * returns its error code (TRANSFER_FAILED: {@code failed_blocks} lists the block ids).
     */
    static int pfWait(long completion, long timeoutMs, MemorySegment outValues) {
        return guard(() -> {
            CompletableFuture<?> f = completion(completion);
            Object r;
            try {
                r = timeoutMs < 0 ? f.get() : f.get(timeoutMs, TimeUnit.MILLISECONDS);
            } catch (TimeoutException e) {
                throw new PegaflowException(ErrorCode.TIMEOUT, "completion " + completion + " not done after " + timeoutMs + " ms");
            } catch (ExecutionException e) {
                Throwable cause = e.getCause();
                if (cause instanceof PegaflowException pe) {
                    throw pe;
                }
                throw new PegaflowException(ErrorCode.INTERNAL, String.valueOf(cause), cause);
            }
            if (!outValues.equals(MemorySegment.NULL)) {
                MemorySegment out = outValues.reinterpret(24);
                long[] v = r instanceof SaveResult s ? new long[] {s.savedBlocks(), s.skippedBlocks(), s.bytes()}
                        : r instanceof LoadResult l ? new long[] {l.blocks(), 0, l.bytes()} : new long[3];
                MemorySegment.copy(v, 0, out, JAVA_LONG, 0, 3);
            }
        });
    }

    static int pfPoll(long completion, MemorySegment outDone) {
        return guard(() -> buffer(outDone, 4, "out_done").set(JAVA_INT, 0, completion(completion).isDone() ? 1 : 0));
    }

    static int pfCompletionFree(long completion) {
        return guard(() -> {
            if (COMPLETIONS.remove(completion) == null) {
                throw new InvalidArgumentException("completion handle " + completion + " is unknown or freed");
            }
        });
    }

    /** The block ids a failed transfer did not move (up to cap), and their count. */
    static int pfFailedBlocks(long completion, MemorySegment out, int cap, MemorySegment outCount) {
        return guard(() -> {
            CompletableFuture<?> f = completion(completion);
            long[] ids = new long[0];
            if (f.isCompletedExceptionally()) {
                Throwable t = f.handle((r, e) -> e).join();
                if (t instanceof TransferFailedException tf) {
                    ids = tf.blockIds();
                }
            }
            buffer(outCount, 4, "out_count").set(JAVA_INT, 0, ids.length);
            int n = Math.min(ids.length, Math.max(0, cap));
            if (n > 0) {
                MemorySegment.copy(ids, 0, buffer(out, 8L * n, "out"), JAVA_LONG, 0, n);
            }
        });
    }

    /** Engine stats as JSON (UTF-8, NUL-terminated if it fits); writes the full length. */
    static int pfStats(long engine, MemorySegment buf, int cap, MemorySegment outLen) {
        return guard(() -> {
            EngineStats s = engine(engine).stats();
            StringBuilder sb = new StringBuilder("{");
            for (Gauge g : Gauge.values()) {
                sb.append('"').append(g.metricName()).append("\":").append(s.get(g)).append(',');
            }
            for (Counter c : Counter.values()) {
                sb.append('"').append(c.metricName()).append("\":").append(s.get(c)).append(',');
            }
            sb.setCharAt(sb.length() - 1, '}');
            byte[] json = sb.toString().getBytes(StandardCharsets.UTF_8);
            buffer(outLen, 4, "out_len").set(JAVA_INT, 0, json.length);
            if (!buf.equals(MemorySegment.NULL) && cap > json.length) {
                MemorySegment b = buf.reinterpret(cap);
                MemorySegment.copy(json, 0, b, JAVA_BYTE, 0, json.length);
                b.set(JAVA_BYTE, json.length, (byte) 0);
            }
        });
    }

    /** Closes every engine (waiting for copies in flight) and frees every completion: for process exit. */
    static int pfShutdown() {
        return guard(() -> {
            for (Long h : List.copyOf(ENGINES.keySet())) {
                PegaEngine e = ENGINES.remove(h);
                if (e != null) {
                    e.close();
                }
            }
            COMPLETIONS.clear();
        });
    }

    /**
     * Training run for the JVM's ahead-of-time cache ({@code -XX:AOTCacheOutput}): builds the
     * table and drives one engine through a save, query, load and release, so the classes the
     * in-process start needs are loaded and linked when the cache is written at exit. The
     * Python launcher runs it once per runtime and jar (python/pegaflow/_bridge.py).
     */
    public static void main(String[] args) throws Exception {
        bootstrap();
        try (java.lang.foreign.Arena arena = java.lang.foreign.Arena.ofConfined();
                PegaEngine engine = PegaEngine.create(EngineConfig.builder().poolSize("1mb").build())) {
            long base = arena.allocate(8192, 64).address();
            engine.registerInstance(new InstanceSpec("train", "train", 1, 1));
            engine.registerWorker("train", new WorkerSpec(0, 0, 0,
                    List.of(new LayerRegion("l", KvLayout.SPLIT_KV, base, 8192, 4, 1024, 1024, 4096))));
            byte[][] h = {new byte[32], new byte[32]};
            h[1][0] = 1;
            engine.save("train", 0, new long[] {0, 1}, h).join();
            QueryResult q = engine.query("train", h);
            engine.load("train", 0, q.lease(), new long[] {2, 3}).join();
            engine.release(engine.query("train", h).lease());
            engine.stats();
        }
    }

    /**
     * A worker engine whose control plane is pegaflow-server at {@code endpoint}
     * ({@code HOST:PORT}): it maps the server's shared pool and copies itself; every other
     * function works on the handle as on an embedded engine. {@code deadline_ms} bounds each
     * call to the server (an unreachable server is PF_UNAVAILABLE within it).
     */
    static int pfEngineConnect(MemorySegment endpoint, int copyThreads, int transfer, int device, long deadlineMs,
            MemorySegment outEngine) {
        return guard(() -> {
            MemorySegment out = buffer(outEngine, 8, "out_engine");
            java.util.function.Function<io.pegaflow.engine.pool.HostPool, io.pegaflow.engine.transfer.TransferEngine> copies =
                    switch (transfer) {
                        case 0 -> pool -> new io.pegaflow.engine.transfer.HostTransferEngine(pool, Math.max(1, copyThreads));
                        case 1 -> pool -> CudaTransferEngine.create(pool, CudaOptions.defaults().withDevice(device));
                        default -> throw new InvalidArgumentException("transfer " + transfer + "; expected 0 (host) or 1 (cuda)");
                    };
            io.pegaflow.server.EngineClient.Connection c = io.pegaflow.server.EngineClient.open(str(endpoint, "endpoint"),
                    copies, deadlineMs > 0 ? deadlineMs : 5000);
            long handle = NEXT_HANDLE.getAndIncrement();
            ENGINES.put(handle, c.engine());
            SERVER_IDS.put(handle, c.serverId());
            out.set(JAVA_LONG, 0, handle);
        });
    }

    // ---------------------------------------------------------------- the vLLM connector's brain

    /** The server process behind each connected engine (engine_connect). */
    private static final Map<Long, String> SERVER_IDS = new ConcurrentHashMap<>();

    /**
     * The id of the server process a connected engine talks to ("" for an embedded engine);
     * it changes on every server start.
     */
    static int pfEngineServerId(long engine, MemorySegment buf, int cap, MemorySegment outLen) {
        return guard(() -> {
            engine(engine);
            putText(SERVER_IDS.getOrDefault(engine, "").getBytes(StandardCharsets.UTF_8), buf, cap, outLen, "server id");
        });
    }

    /**
     * Writes {@code text} NUL-terminated into {@code buf} of {@code cap} bytes and its length
     * into {@code *outLen}; when it does not fit, only the length is written and the call fails
     * naming the size needed.
     */
    private static void putText(byte[] text, MemorySegment buf, int cap, MemorySegment outLen, String what) {
        buffer(outLen, 4, "out_len").set(JAVA_INT, 0, text.length);
        if (cap <= text.length) {
            throw new InvalidArgumentException(what + " of " + text.length + " bytes does not fit " + cap
                    + " bytes; pass a buffer of at least " + (text.length + 1));
        }
        MemorySegment b = buffer(buf, cap, "buf");
        MemorySegment.copy(text, 0, b, JAVA_BYTE, 0, text.length);
        b.set(JAVA_BYTE, text.length, (byte) 0);
    }

    /**
     * Destination block ids vLLM reported as failed loads this step (update_connector_output's
     * invalid_block_ids); call before sched_finished. Requests whose load they hit stop being
     * offered hits, so a load that keeps failing cannot loop.
     */
    static int pfSchedFailedBlocks(long sched, MemorySegment ids, int n) {
        return guard(() -> sched(sched).failedBlocks(longs(ids, n, "ids")));
    }

    /** Results a caller's buffer was too small for, kept for its next call (nothing is lost). */
    private static final Map<Long, byte[]> UNREAD_FINISHED = new ConcurrentHashMap<>();
    private static final Map<Long, long[]> UNREAD_ERRORS = new ConcurrentHashMap<>();

    /** An engine handle for the connector: 0 means "no engine" (disconnected). */
    private static PegaEngine engineOrNull(long handle) {
        return handle == 0 ? null : engine(handle);
    }

    private static io.pegaflow.connector.SchedulerSide sched(long handle) {
        io.pegaflow.connector.SchedulerSide s = SCHEDULERS.get(handle);
        if (s == null) {
            throw new InvalidArgumentException("scheduler connector handle " + handle + " is unknown or closed");
        }
        return s;
    }

    private static io.pegaflow.connector.WorkerSide workerSide(long handle) {
        io.pegaflow.connector.WorkerSide w = WORKERS.get(handle);
        if (w == null) {
            throw new InvalidArgumentException("worker connector handle " + handle + " is unknown or closed");
        }
        return w;
    }

    private static byte[] bytes(MemorySegment p, long len, String what) {
        if (len < 0) {
            throw new InvalidArgumentException(what + " length " + len + "; expected >= 0");
        }
        return len == 0 ? new byte[0] : buffer(p, len, what).toArray(JAVA_BYTE);
    }

    private static List<String> lines(MemorySegment p, String what) {
        if (p.equals(MemorySegment.NULL)) {
            return List.of();
        }
        String text = str(p, what);
        return text.isEmpty() ? List.of() : List.of(text.split("\n"));
    }

    static int pfSchedCreate(long engine, MemorySegment instanceId, int blockSize, int loadEnabled, MemorySegment out) {
        return guard(() -> {
            MemorySegment o = buffer(out, 8, "out");
            io.pegaflow.connector.SchedulerSide s = new io.pegaflow.connector.SchedulerSide(engineOrNull(engine),
                    str(instanceId, "instance_id"), blockSize, loadEnabled != 0);
            long handle = NEXT_HANDLE.getAndIncrement();
            SCHEDULERS.put(handle, s);
            o.set(JAVA_LONG, 0, handle);
        });
    }

    /** {@code *out_tokens}: matched tokens beyond num_computed (0 on a miss or a store failure). */
    static int pfSchedLookup(long sched, MemorySegment reqId, MemorySegment hashes, int n, int hashLen, long numTokens,
            long numComputed, MemorySegment outTokens) {
        return guard(() -> buffer(outTokens, 8, "out_tokens").set(JAVA_LONG, 0, sched(sched).lookup(str(reqId, "req_id"),
                bytes(hashes, (long) n * hashLen, "hashes"), hashLen, numTokens, numComputed)));
    }

    static int pfSchedAfterAlloc(long sched, MemorySegment reqId, MemorySegment blockIds, int n, long numExternal) {
        return guard(() -> sched(sched).afterAlloc(str(reqId, "req_id"), longs(blockIds, n, "block_ids"), numExternal));
    }

    static int pfSchedSchedule(long sched, MemorySegment reqId, MemorySegment hashes, int n, int hashLen, int hashOffset,
            MemorySegment newBlockIds, int nIds, int resumed, long numComputed, long numScheduled) {
        return guard(() -> sched(sched).schedule(str(reqId, "req_id"), bytes(hashes, (long) n * hashLen, "hashes"), hashLen,
                hashOffset, longs(newBlockIds, nIds, "new_block_ids"), resumed != 0, numComputed, numScheduled));
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

    /** {@code sending} and {@code recving}: request ids separated by '\n' (NULL or "" for none). */
    static int pfSchedFinished(long sched, MemorySegment sending, MemorySegment recving) {
        return guard(() -> sched(sched).finished(lines(sending, "sending"), lines(recving, "recving")));
    }

    static int pfSchedClose(long sched) {
        return guard(() -> {
            io.pegaflow.connector.SchedulerSide s = SCHEDULERS.remove(sched);
            if (s != null) {
                s.shutdown();
            }
            UNREAD_PLANS.remove(sched);
        });
    }

    static int pfWorkerCreate(long engine, MemorySegment instanceId, int workerRank, MemorySegment out) {
        return guard(() -> {
            MemorySegment o = buffer(out, 8, "out");
            io.pegaflow.connector.WorkerSide w = new io.pegaflow.connector.WorkerSide(engineOrNull(engine),
                    str(instanceId, "instance_id"), workerRank);
            long handle = NEXT_HANDLE.getAndIncrement();
            WORKERS.put(handle, w);
            o.set(JAVA_LONG, 0, handle);
        });
    }

    static int pfWorkerStartLoads(long worker, MemorySegment plan, long len) {
        return guard(() -> workerSide(worker).startLoads(bytes(plan, len, "plan")));
    }

    static int pfWorkerSubmitSaves(long worker, MemorySegment plan, long len, long stream) {
        return guard(() -> workerSide(worker).submitSaves(bytes(plan, len, "plan"), stream));
    }

    static int pfWorkerAwaitPreempted(long worker, MemorySegment plan, long len) {
        return guard(() -> workerSide(worker).awaitPreempted(bytes(plan, len, "plan")));
    }

    /**
     * {@code finished}: ids vLLM finished this step ('\n'-separated). Writes lines "S <id>"
     * (saves done: free the blocks) and "R <id>" (load done) into {@code buf}; *out_len is
     * the text's length (it is kept for the next call when it does not fit).
     */
    static int pfWorkerGetFinished(long worker, MemorySegment finished, MemorySegment buf, int cap, MemorySegment outLen) {
        return guard(() -> {
            byte[] text = UNREAD_FINISHED.remove(worker);
            if (text == null) {
                io.pegaflow.connector.WorkerSide.Finished f = workerSide(worker).getFinished(lines(finished, "finished"));
                StringBuilder sb = new StringBuilder();
                f.sending().forEach(id -> sb.append("S ").append(id).append('\n'));
                f.recving().forEach(id -> sb.append("R ").append(id).append('\n'));
                text = sb.toString().getBytes(StandardCharsets.UTF_8);
            } else {
                workerSide(worker).noteFinished(lines(finished, "finished")); // results are taken on the next call
            }
            if (cap <= text.length) {
                UNREAD_FINISHED.put(worker, text); // returned by the next call, with a larger buffer
            }
            putText(text, buf, cap, outLen, "finished list");
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
            io.pegaflow.connector.WorkerSide w = WORKERS.remove(worker);
            UNREAD_FINISHED.remove(worker);
            UNREAD_ERRORS.remove(worker);
            if (w != null) {
                w.shutdown();
            }
        });
    }

    /** Points the scheduler connector at another engine handle (0: none, every lookup misses). */
    static int pfSchedRebind(long sched, long engine) {
        return guard(() -> sched(sched).rebind(engineOrNull(engine)));
    }

    /** Points the worker connector at another engine handle (0: none); transfers in flight finish on the old one. */
    static int pfWorkerRebind(long worker, long engine) {
        return guard(() -> workerSide(worker).rebind(engineOrNull(engine)));
    }

    /** For tests: the Java signature of each export, in table order. */
    static List<MethodType> signatures() {
        List<MethodType> out = new ArrayList<>();
        for (String e : EXPORTS) {
            Method m = find(e);
            out.add(MethodType.methodType(m.getReturnType(), m.getParameterTypes()));
        }
        return out;
    }

    static List<String> exports() {
        return List.of(EXPORTS);
    }
}
