package io.pegaflow.engine.cuda;

import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandle;

/**
 * Calls of a bound {@code int}-returning C function with its arguments' own primitive types:
 * nothing boxed, no argument array, so a call allocates nothing on the Java heap. The copy
 * engine calls the driver many times per load (a paced lead polls its group's event in a
 * spin), and the JVM inside vLLM runs a small serial-collected heap: calls that allocated (an
 * {@code Object[]} and boxed {@code long}s through {@code invokeWithArguments}) filled its
 * young generation, and each young collection stopped every thread of the JVM, the copy
 * lane's and vLLM's own calls into it (docs/benchmarks/README.md, "Twentieth GPU run").
 *
 * <p>{@code invoke}, not {@code invokeExact}: a caller passing an {@code int} where the C
 * function takes a {@code long} still works (the handle's {@code asType} is cached after the
 * first call); with the types equal, as every binding here has them, no conversion runs.
 */
final class Downcall {
    private Downcall() {}

    static int call(MethodHandle h, String what, long a) {
        try {
            return (int) h.invoke(a);
        } catch (Throwable t) {
            throw failed(what, t);
        }
    }

    static int call(MethodHandle h, String what, long a, long b) {
        try {
            return (int) h.invoke(a, b);
        } catch (Throwable t) {
            throw failed(what, t);
        }
    }

    static int call(MethodHandle h, String what, long a, long b, int c) {
        try {
            return (int) h.invoke(a, b, c);
        } catch (Throwable t) {
            throw failed(what, t);
        }
    }

    static int call(MethodHandle h, String what, long a, long b, long c, long d) {
        try {
            return (int) h.invoke(a, b, c, d);
        } catch (Throwable t) {
            throw failed(what, t);
        }
    }

    static int call(MethodHandle h, String what, MemorySegment a, long b) {
        try {
            return (int) h.invoke(a, b);
        } catch (Throwable t) {
            throw failed(what, t);
        }
    }

    /** {@code cuMemcpyBatchAsync} without {@code failIdx} (CUDA 13): eight 64-bit arguments. */
    static int call(MethodHandle h, String what, long a, long b, long c, long d, long e, long f, long g, long i) {
        try {
            return (int) h.invoke(a, b, c, d, e, f, g, i);
        } catch (Throwable t) {
            throw failed(what, t);
        }
    }

    /** {@code cuMemcpyBatchAsync} with {@code failIdx} (CUDA 12.8-12.9): nine. */
    static int call(MethodHandle h, String what, long a, long b, long c, long d, long e, long f, long g, long i, long j) {
        try {
            return (int) h.invoke(a, b, c, d, e, f, g, i, j);
        } catch (Throwable t) {
            throw failed(what, t);
        }
    }

    /** {@code cuLaunchKernel}: function, grid and block dimensions, shared memory, stream, params, extra. */
    static int launch(MethodHandle h, long function, int gx, int gy, int gz, int bx, int by, int bz, int shared,
            long stream, MemorySegment params, MemorySegment extra) {
        try {
            return (int) h.invoke(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
        } catch (Throwable t) {
            throw failed("cuLaunchKernel", t);
        }
    }

    /** Any other shape (calls made once, at start or teardown): boxed, which is fine there. */
    static int boxed(MethodHandle h, String what, Object... args) {
        try {
            return (int) h.invokeWithArguments(args);
        } catch (Throwable t) {
            throw failed(what, t);
        }
    }

    private static RuntimeException failed(String what, Throwable t) {
        if (t instanceof RuntimeException r) {
            return r;
        }
        if (t instanceof Error e) {
            throw e;
        }
        return new CudaException(what + " could not be called: " + t, t);
    }
}
