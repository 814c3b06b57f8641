package io.pegaflow.engine.cuda;

import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static org.assertj.core.api.Assertions.assertThat;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandle;
import java.lang.management.ManagementFactory;
import org.junit.jupiter.api.Test;

/**
 * The copy engine's driver calls allocate nothing on the heap (a young collection per load
 * stopped the copy lane and vLLM's calls into the JVM). Checked on libc functions bound the way
 * the driver's are, since this machine has no CUDA driver: the per-call path is the same code.
 */
class DowncallTest {
    private static final Linker LINKER = Linker.nativeLinker();
    /** {@code int ffsl(long)}: the shape of cuEventQuery, cuEventSynchronize, cuCtxSetCurrent. */
    private static final MethodHandle FFSL = LINKER.downcallHandle(LINKER.defaultLookup().find("ffsl").orElseThrow(),
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG));
    /** {@code int strcmp(const char*, const char*)} with the pointers as longs: cuEventRecord's shape. */
    private static final MethodHandle STRCMP = LINKER.downcallHandle(LINKER.defaultLookup().find("strcmp").orElseThrow(),
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG, JAVA_LONG));
    private static final int CALLS = 200_000;

    @Test
    void typedCallsReturnTheFunctionsResult() {
        assertThat(Downcall.call(FFSL, "ffsl", 0L)).isZero();
        assertThat(Downcall.call(FFSL, "ffsl", 1L << 40)).isEqualTo(41);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment x = a.allocateFrom("abc");
            MemorySegment y = a.allocateFrom("abd");
            assertThat(Downcall.call(STRCMP, "strcmp", x.address(), y.address())).isNegative();
            assertThat(Downcall.call(STRCMP, "strcmp", y.address(), y.address())).isZero();
        }
    }

    @Test
    void typedCallsAllocateNothingWhereBoxedOnesDo() {
        try (Arena a = Arena.ofConfined()) {
            long x = a.allocateFrom("abc").address();
            long y = a.allocateFrom("abd").address();
            long sink = 0;
            for (int round = 0; round < 3; round++) { // past the interpreter and the first compilations
                sink += typed(x, y) + boxed(x, y);
            }
            com.sun.management.ThreadMXBean threads = (com.sun.management.ThreadMXBean) ManagementFactory.getThreadMXBean();
            long before = threads.getCurrentThreadAllocatedBytes();
            sink += typed(x, y);
            long typedBytes = threads.getCurrentThreadAllocatedBytes() - before;
            before = threads.getCurrentThreadAllocatedBytes();
            sink += boxed(x, y);
            long boxedBytes = threads.getCurrentThreadAllocatedBytes() - before;
            assertThat(sink).isNotZero();
            // the measurement sees allocation: the boxed path's array and boxes, per call
            assertThat(boxedBytes).as("bytes the boxed calls allocated").isGreaterThan(32L * 2 * CALLS);
            // a few objects at most (the ThreadMXBean's own), never per call
            assertThat(typedBytes).as("bytes %d typed calls allocated", 2 * CALLS).isLessThan(4096);
        }
    }

    private static long typed(long x, long y) {
        long sum = 0;
        for (int i = 0; i < CALLS; i++) {
            sum += Downcall.call(FFSL, "ffsl", (1L << 33) + i) + Downcall.call(STRCMP, "strcmp", x, y);
        }
        return sum;
    }

    private static long boxed(long x, long y) {
        long sum = 0;
        for (int i = 0; i < CALLS; i++) {
            sum += Downcall.boxed(FFSL, "ffsl", (1L << 33) + i) + Downcall.boxed(STRCMP, "strcmp", x, y);
        }
        return sum;
    }
}
