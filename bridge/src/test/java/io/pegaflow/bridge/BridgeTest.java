package io.pegaflow.bridge;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static org.assertj.core.api.Assertions.assertThat;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandle;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/**
 * The table as a C caller sees it: header and exports agree, and calling a stub through a
 * downcall (what C does) returns error codes with a per-thread message instead of throwing.
 */
@TestMethodOrder(MethodOrderer.OrderAnnotation.class) // the process's warm-up starts once: sched_create's test first
class BridgeTest {
    private static final MemorySegment TABLE = MemorySegment.ofAddress(Bridge.bootstrap()).reinterpret(8L + 8L * 64);

    private static MethodHandle fn(String name, FunctionDescriptor fd) {
        int index = Bridge.exports().indexOf(name);
        assertThat(index).as("export %s", name).isNotNegative();
        return Linker.nativeLinker().downcallHandle(TABLE.get(ADDRESS, 8L + 8L * index), fd);
    }

    @Test
    void tableHeaderAndExportsMatchTheCHeader() throws Exception {
        assertThat(TABLE.get(JAVA_INT, 0)).isEqualTo(Bridge.ABI_VERSION);
        assertThat(TABLE.get(JAVA_INT, 4)).isEqualTo(Bridge.exports().size());
        assertThat(Bridge.bootstrap()).as("built once").isEqualTo(TABLE.address());
        String header = Files.readString(Path.of("include", "pegaflow.h"));
        assertThat(header).contains("#define PEGAFLOW_ABI_VERSION " + Bridge.ABI_VERSION);
        String struct = header.substring(header.indexOf("typedef struct pegaflow_api {"), header.indexOf("} pegaflow_api;"));
        Matcher m = Pattern.compile("int32_t \\(\\*(\\w+)\\)\\(([^;]*?)\\);", Pattern.DOTALL).matcher(struct);
        List<String> names = new ArrayList<>();
        List<Integer> arity = new ArrayList<>();
        while (m.find()) {
            names.add(m.group(1));
            String args = m.group(2).trim();
            arity.add(args.equals("void") ? 0 : args.split(",").length);
        }
        assertThat(names).isEqualTo(Bridge.exports());
        assertThat(arity).isEqualTo(Bridge.signatures().stream().map(t -> t.parameterCount()).toList());
    }

    private static String lastError(Arena a) throws Throwable {
        MethodHandle lastError = fn("last_error", FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_INT));
        MemorySegment buf = a.allocate(4096);
        int len = (int) lastError.invokeExact(buf, 4096);
        return buf.getString(0);
    }

    /**
     * save and load check n against its cap before reading the caller's arrays: a count of
     * 2^31 - 1 over an 8-byte array used to be read (16 GiB asked for, INTERNAL) or read past
     * the array; now it is INVALID_ARGUMENT naming the cap, and the engine goes on.
     */
    @Test
    void saveAndLoadCheckTheirCountsBeforeReadingTheCallersArrays() throws Throwable {
        MethodHandle create = fn("engine_create", FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_INT, JAVA_LONG, JAVA_INT,
                JAVA_INT, JAVA_INT, ADDRESS, ADDRESS));
        MethodHandle close = fn("engine_close", FunctionDescriptor.of(JAVA_INT, JAVA_LONG));
        MethodHandle save = fn("save", FunctionDescriptor.of(JAVA_INT, JAVA_LONG, ADDRESS, JAVA_INT, JAVA_INT, ADDRESS, ADDRESS,
                JAVA_INT, ADDRESS, JAVA_LONG, ADDRESS));
        MethodHandle load = fn("load", FunctionDescriptor.of(JAVA_INT, JAVA_LONG, ADDRESS, JAVA_INT, ADDRESS, JAVA_INT, ADDRESS,
                ADDRESS));
        MethodHandle query = fn("query", FunctionDescriptor.of(JAVA_INT, JAVA_LONG, ADDRESS, JAVA_INT, ADDRESS, JAVA_INT, ADDRESS,
                ADDRESS));
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(8);
            assertThat((int) create.invokeExact(a.allocateFrom("4mb"), 1, 0L, 0, 0, 0, a.allocateFrom(""), out)).isZero();
            long engine = out.get(JAVA_LONG, 0);
            try {
                MemorySegment one = a.allocate(8); // room for one block id, or one 8-byte hash
                for (int n : new int[] {Integer.MAX_VALUE, 262_145, -1}) {
                    int rc = (int) save.invokeExact(engine, a.allocateFrom("i"), 0, n, one, one, 8, MemorySegment.NULL, 0L,
                            a.allocate(8));
                    assertThat(rc).as("save of %d", n).isEqualTo(1);
                    assertThat(lastError(a)).contains("block_ids count " + n).contains("Limits.MAX_HASHES_PER_CALL");
                    rc = (int) load.invokeExact(engine, a.allocateFrom("i"), 0, a.allocate(16), n, one, a.allocate(8));
                    assertThat(rc).as("load of %d", n).isEqualTo(1);
                    assertThat(lastError(a)).contains("dst_block_ids count " + n).contains("Limits.MAX_HASHES_PER_CALL");
                    rc = (int) query.invokeExact(engine, a.allocateFrom("i"), n, one, 8, a.allocate(8), a.allocate(16));
                    assertThat(rc).as("query of %d", n).isEqualTo(1);
                }
                int rc = (int) query.invokeExact(engine, a.allocateFrom("i"), 0, MemorySegment.NULL, 0, a.allocate(8), a.allocate(16));
                assertThat(rc).as("the engine still answers (unknown instance)").isEqualTo(2);
            } finally {
                assertThat((int) close.invokeExact(engine)).isZero();
            }
        }
    }

    /**
     * sched_create's bit 16 starts the process's lookup warm-up (once: a later start is refused,
     * which is how this test sees it started) and the scheduler side is made as without it.
     */
    @Test
    @Order(1)
    void schedCreatesWarmUpBitStartsTheLookupWarmUp() throws Throwable {
        MethodHandle open = fn("link_open", FunctionDescriptor.of(JAVA_INT, ADDRESS, ADDRESS, ADDRESS, JAVA_INT, JAVA_LONG,
                JAVA_LONG, ADDRESS, ADDRESS));
        MethodHandle linkClose = fn("link_close", FunctionDescriptor.of(JAVA_INT, JAVA_LONG));
        MethodHandle create = fn("sched_create", FunctionDescriptor.of(JAVA_INT, JAVA_LONG, ADDRESS, JAVA_INT, JAVA_INT, ADDRESS));
        MethodHandle schedClose = fn("sched_close", FunctionDescriptor.of(JAVA_INT, JAVA_LONG));
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(8);
            int rc = (int) open.invokeExact(a.allocateFrom("embedded"), a.allocateFrom("127.0.0.1:50055"),
                    a.allocateFrom("4mb"), 1, 1000L, 0L, a.allocateFrom(""), out);
            assertThat(rc).as(lastError(a)).isZero();
            long link = out.get(JAVA_LONG, 0);
            try {
                assertThat((int) create.invokeExact(link, a.allocateFrom("0 0 warm"), 16, 1 | 16, out)).isZero();
                assertThat((int) schedClose.invokeExact(out.get(JAVA_LONG, 0))).isZero();
                assertThat(io.pegaflow.connector.LookupWarmUp.startOnce(16)).as("started by sched_create").isNull();
            } finally {
                assertThat((int) linkClose.invokeExact(link)).isZero();
            }
        }
    }

    /**
     * warm_up (a worker in a process of its own asks for it) starts the same once-per-process
     * warm-up as sched_create's bit 16 and says whether this call started it; a block size out of
     * range is refused naming it, before anything starts. (That a first call answers 1 is checked
     * in a fresh process: python/tests/test_bridge.py.)
     */
    @Test
    @Order(2)
    void warmUpExportAnswersWhetherItStartedTheWarmUp() throws Throwable {
        MethodHandle warm = fn("warm_up", FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS));
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(4);
            out.set(JAVA_INT, 0, 7);
            assertThat((int) warm.invokeExact(0, out)).isNotZero();
            assertThat(lastError(a)).contains("warm_up block size 0").contains("expected 1 to 65536");
            assertThat(out.get(JAVA_INT, 0)).as("untouched by the refusal").isEqualTo(7);
            boolean before = io.pegaflow.connector.LookupWarmUp.started();
            assertThat((int) warm.invokeExact(16, out)).as(lastError(a)).isZero();
            assertThat(out.get(JAVA_INT, 0)).isEqualTo(before ? 0 : 1);
            assertThat(io.pegaflow.connector.LookupWarmUp.started()).isTrue();
            assertThat((int) warm.invokeExact(16, out)).isZero();
            assertThat(out.get(JAVA_INT, 0)).as("once per process").isZero();
        }
    }

    /**
     * The worker's warm_up carries no link; in one process with the scheduler it comes first, so
     * it takes server mode from the process's links: a server's client (answering or not) makes
     * it a client's warm-up, an embedded link does not.
     */
    @Test
    void theWorkersWarmUpIsAServerClientsWhereALinkOfTheProcessIsOne() throws Throwable {
        MethodHandle open = fn("link_open", FunctionDescriptor.of(JAVA_INT, ADDRESS, ADDRESS, ADDRESS, JAVA_INT, JAVA_LONG,
                JAVA_LONG, ADDRESS, ADDRESS));
        MethodHandle linkClose = fn("link_close", FunctionDescriptor.of(JAVA_INT, JAVA_LONG));
        boolean before = ConnectorExports.anyServerLink();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(8);
            assertThat((int) open.invokeExact(a.allocateFrom("embedded"), a.allocateFrom("127.0.0.1:50055"),
                    a.allocateFrom("4mb"), 1, 1000L, 0L, a.allocateFrom(""), out)).as(lastError(a)).isZero();
            long embedded = out.get(JAVA_LONG, 0);
            assertThat(ConnectorExports.anyServerLink()).as("an embedded link").isEqualTo(before);
            // no server there: the link starts detached, still a server's client
            assertThat((int) open.invokeExact(a.allocateFrom("server"), a.allocateFrom("127.0.0.1:1"),
                    a.allocateFrom("4mb"), 1, 200L, 0L, a.allocateFrom(""), out)).as(lastError(a)).isZero();
            long server = out.get(JAVA_LONG, 0);
            assertThat(ConnectorExports.anyServerLink()).as("a server's client").isTrue();
            assertThat((int) linkClose.invokeExact(server)).isZero();
            assertThat(ConnectorExports.anyServerLink()).isEqualTo(before);
            assertThat((int) linkClose.invokeExact(embedded)).isZero();
        }
    }

    @Test
    void aBadCallReturnsItsCodeAndTheMessageStaysWithTheThread() throws Throwable {
        MethodHandle query = fn("query", FunctionDescriptor.of(JAVA_INT, JAVA_LONG, ADDRESS, JAVA_INT, ADDRESS, JAVA_INT, ADDRESS, ADDRESS));
        MethodHandle lastError = fn("last_error", FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_INT));
        MethodHandle noop = fn("noop", FunctionDescriptor.of(JAVA_INT));
        try (Arena a = Arena.ofConfined()) {
            int rc = (int) query.invokeExact(12345L, a.allocateFrom("x"), 0, MemorySegment.NULL, 0, a.allocate(8), a.allocate(16));
            assertThat(rc).isEqualTo(1); // INVALID_ARGUMENT
            MemorySegment buf = a.allocate(256);
            int len = (int) lastError.invokeExact(buf, 256);
            assertThat(buf.getString(0)).isEqualTo("engine handle 12345 is unknown or closed").hasSize(len);
            MemorySegment small = a.allocate(8);
            assertThat((int) lastError.invokeExact(small, 8)).isEqualTo(len);
            assertThat(small.getString(0)).isEqualTo("engine ").as("truncated to cap - 1 and terminated");
            assertThat((int) noop.invokeExact()).isZero();
            String[] other = new String[1];
            Thread t = Thread.ofPlatform().start(() -> {
                try (Arena b = Arena.ofConfined()) {
                    MemorySegment ob = b.allocate(64);
                    int n = (int) lastError.invokeExact(ob, 64);
                    other[0] = n + ":" + ob.getString(0);
                } catch (Throwable e) {
                    other[0] = e.toString();
                }
            });
            t.join();
            assertThat(other[0]).as("another thread has its own last error").isEqualTo("0:");
        }
    }
}
