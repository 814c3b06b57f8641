package io.pegaflow.bridge;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.ErrorCode;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.WorkerSpec;
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
import java.util.ArrayList;
import java.util.List;

/**
 * The engine as a C ABI: {@link #bootstrap()} builds, once per process, a table of Panama
 * upcall stubs (the {@code pegaflow_api} struct of {@code bridge/include/pegaflow.h}) and
 * returns its address. Python (ctypes) and C/C++/Rust hosts call the engine through it as
 * plain C functions. The exports live by concern: {@link EngineExports} (engines and
 * copies), {@link LinkExports} (the store link of a vLLM process), {@link ConnectorExports}
 * (the connector's brains); {@link Marshal} holds what they share.
 *
 * <p>Rules every exported function follows: arguments and results are primitives, addresses
 * and byte buffers; the return value is an {@link ErrorCode} value (0 = ok) and outputs go
 * through pointers; nothing is thrown across the boundary (an escaping exception would kill
 * the host process), and the message of the last failure is kept per thread for
 * {@code last_error}. Any thread may call: foreign threads are attached by the JVM on their
 * first upcall. Engines, links, brains and completions are {@code int64} handles.
 */
public final class Bridge {
    /** Bumped on any change to the table's layout or a function's signature. */
    public static final int ABI_VERSION = 9;

    private static volatile long table;

    private Bridge() {}

    /** One exported C function: its name and the class holding {@code pf<CamelName>}. */
    private record Export(String name, Class<?> owner) {}

    /** Exported functions in table order; the order is the ABI (see pegaflow.h). */
    private static final List<Export> EXPORTS = exports(
            EngineExports.class, List.of("last_error", "noop", "engine_create", "engine_close", "register_instance",
                    "register_worker", "unregister_instance", "save", "query", "load", "release", "wait", "poll",
                    "completion_free", "failed_blocks", "stats", "shutdown", "engine_connect", "engine_server_id"),
            LinkExports.class, List.of("link_open", "link_register_worker", "link_unregister_instance", "link_status",
                    "link_stats", "link_close"),
            ConnectorExports.class, List.of("sched_create", "sched_lookup", "sched_after_alloc", "sched_schedule",
                    "sched_preempted", "sched_build_plan", "sched_request_finished", "sched_failed_blocks",
                    "sched_finished", "sched_close", "worker_create", "worker_start_loads", "worker_submit_saves",
                    "worker_await_preempted", "worker_get_finished", "worker_load_errors", "worker_close",
                    "worker_stats"),
            EngineExports.class, List.of("block_hashes", "completion_on_done", "flush", "query_request", "query_cancel",
                    "register_rank"),
            ConnectorExports.class, List.of("worker_start_step_loads", "worker_wait_layer"),
            LinkExports.class, List.of("link_reset_cache"),
            LinkExports.class, List.of("link_kv_events", "link_demote"),
            ConnectorExports.class, List.of("sched_lookup_tail", "sched_stats", "tail_key", "warm_up"));

    private static List<Export> exports(Object... ownersAndNames) {
        List<Export> out = new ArrayList<>();
        for (int i = 0; i < ownersAndNames.length; i += 2) {
            Class<?> owner = (Class<?>) ownersAndNames[i];
            for (Object name : (List<?>) ownersAndNames[i + 1]) {
                out.add(new Export((String) name, owner));
            }
        }
        return List.copyOf(out);
    }

    /**
     * The function table's address (built on first call). Called through JNI by the host
     * right after it created the JVM: {@code CallStaticLongMethodA(Bridge, "bootstrap", "()J")}.
     */
    public static synchronized long bootstrap() {
        if (table == 0) {
            logs();
            table = buildTable();
        }
        return table;
    }

    /**
     * The in-process JVM logs one line per record into the host's standard error, like the server
     * ({@code PEGAFLOW_LOG_LEVEL}, {@code PEGAFLOW_LOG_FORMAT}: as its {@code --log-level} and
     * {@code --log-format}); a host that configured {@code java.util.logging} itself keeps its own.
     */
    private static void logs() {
        if (System.getProperty("java.util.logging.config.file") != null
                || System.getProperty("java.util.logging.config.class") != null) {
            return;
        }
        String level = System.getenv().getOrDefault("PEGAFLOW_LOG_LEVEL", "info");
        String format = System.getenv().getOrDefault("PEGAFLOW_LOG_FORMAT", "text");
        try {
            io.pegaflow.engine.logging.Logs.configure(level, format);
        } catch (io.pegaflow.engine.InvalidArgumentException e) {
            io.pegaflow.engine.logging.Logs.configure("info", "text");
            System.getLogger(Bridge.class.getName()).log(System.Logger.Level.WARNING,
                    "PEGAFLOW_LOG_LEVEL / PEGAFLOW_LOG_FORMAT: " + e.getMessage() + "; logging at info as text");
        }
    }

    private static long buildTable() {
        Linker linker = Linker.nativeLinker();
        MemorySegment t = Arena.global().allocate(8L + 8L * EXPORTS.size(), 8);
        t.set(JAVA_INT, 0, ABI_VERSION);
        t.set(JAVA_INT, 4, EXPORTS.size());
        MethodHandles.Lookup lookup = MethodHandles.lookup();
        for (int i = 0; i < EXPORTS.size(); i++) {
            Method m = find(EXPORTS.get(i));
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

    private static Method find(Export export) {
        String name = camel(export.name());
        for (Method m : export.owner().getDeclaredMethods()) {
            if (m.getName().equals(name) && Modifier.isStatic(m.getModifiers()) && m.getReturnType() == int.class) {
                return m;
            }
        }
        throw new IllegalStateException("no exported method " + name + " in " + export.owner().getSimpleName()
                + " for " + export.name());
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
            byte[] packed = new byte[64];
            packed[32] = 1;
            BlockHashes h = new BlockHashes(packed, 32);
            engine.save("train", 0, new long[] {0, 1}, h).join();
            QueryResult q = engine.query("train", h);
            engine.load("train", 0, q.lease(), new long[] {2, 3}).join();
            engine.release("train", engine.query("train", h).lease());
            engine.stats();
        }
    }

    /** For tests: the Java signature of each export, in table order. */
    static List<MethodType> signatures() {
        List<MethodType> out = new ArrayList<>();
        for (Export e : EXPORTS) {
            Method m = find(e);
            out.add(MethodType.methodType(m.getReturnType(), m.getParameterTypes()));
        }
        return out;
    }

    static List<String> exports() {
        return EXPORTS.stream().map(Export::name).toList();
    }
}
