package io.pegaflow.engine.pool;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.StructLayout;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.VarHandle;

/**
 * The few libc calls the pool needs (Linux, 64-bit), bound once at class initialisation.
 * Every call checks its result and reports the call, the arguments and errno.
 */
final class LibC {
    static final int PROT_READ = 0x1;
    static final int PROT_WRITE = 0x2;
    static final int MAP_SHARED = 0x01;
    static final int MAP_PRIVATE = 0x02;
    static final int MAP_ANONYMOUS = 0x20;
    static final int MAP_NORESERVE = 0x4000;
    static final int MADV_HUGEPAGE = 14;
    private static final long MAP_FAILED = -1L;

    private static final Linker LINKER = Linker.nativeLinker();
    private static final StructLayout CAPTURE = Linker.Option.captureStateLayout();
    private static final VarHandle ERRNO =
            CAPTURE.varHandle(MemoryLayout.PathElement.groupElement("errno"));
    private static final Linker.Option CAPTURE_ERRNO = Linker.Option.captureCallState("errno");

    private static final MethodHandle MMAP = bind("mmap", FunctionDescriptor.of(ValueLayout.JAVA_LONG,
            ValueLayout.JAVA_LONG, ValueLayout.JAVA_LONG, ValueLayout.JAVA_INT, ValueLayout.JAVA_INT,
            ValueLayout.JAVA_INT, ValueLayout.JAVA_LONG));
    private static final MethodHandle MUNMAP = bind("munmap", FunctionDescriptor.of(ValueLayout.JAVA_INT,
            ValueLayout.JAVA_LONG, ValueLayout.JAVA_LONG));
    private static final MethodHandle MADVISE = bind("madvise", FunctionDescriptor.of(ValueLayout.JAVA_INT,
            ValueLayout.JAVA_LONG, ValueLayout.JAVA_LONG, ValueLayout.JAVA_INT));

    private LibC() {}

    private static MethodHandle bind(String name, FunctionDescriptor fd) {
        MemorySegment symbol = LINKER.defaultLookup().find(name).orElseThrow(
                () -> new UnsatisfiedLinkError("libc symbol '" + name + "' not found; PegaFlow-JVM needs Linux glibc"));
        return LINKER.downcallHandle(symbol, fd, CAPTURE_ERRNO);
    }

    /** Anonymous private mapping, pages reserved lazily (first touch). Returns the address. */
    static long mmapAnonymous(long bytes) {
        return mmap(0L, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0L);
    }

    static long mmap(long addr, long bytes, int prot, int flags, int fd, long offset) {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment state = arena.allocate(CAPTURE);
            long result = (long) MMAP.invokeExact(state, addr, bytes, prot, flags, fd, offset);
            if (result == MAP_FAILED) {
                int errno = (int) ERRNO.get(state, 0L);
                throw new IllegalStateException("mmap(len=" + bytes + ", prot=" + prot + ", flags=0x"
                        + Integer.toHexString(flags) + ", fd=" + fd + ") failed: errno " + errno + describe(errno));
            }
            return result;
        } catch (RuntimeException | Error e) {
            throw e;
        } catch (Throwable t) {
            throw new IllegalStateException("mmap downcall failed", t);
        }
    }

    static void munmap(long addr, long bytes) {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment state = arena.allocate(CAPTURE);
            int rc = (int) MUNMAP.invokeExact(state, addr, bytes);
            if (rc != 0) {
                int errno = (int) ERRNO.get(state, 0L);
                throw new IllegalStateException("munmap(addr=0x" + Long.toHexString(addr) + ", len=" + bytes
                        + ") failed: errno " + errno + describe(errno));
            }
        } catch (RuntimeException | Error e) {
            throw e;
        } catch (Throwable t) {
            throw new IllegalStateException("munmap downcall failed", t);
        }
    }

    /** Advice is a hint: returns false (instead of throwing) when the kernel declines it. */
    static boolean madvise(long addr, long bytes, int advice) {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment state = arena.allocate(CAPTURE);
            return (int) MADVISE.invokeExact(state, addr, bytes, advice) == 0;
        } catch (RuntimeException | Error e) {
            throw e;
        } catch (Throwable t) {
            throw new IllegalStateException("madvise downcall failed", t);
        }
    }

    private static String describe(int errno) {
        return switch (errno) {
            case 12 -> " (ENOMEM: not enough address space or memory)";
            case 22 -> " (EINVAL: bad length, flags or alignment)";
            case 13 -> " (EACCES)";
            case 19 -> " (ENODEV)";
            default -> "";
        };
    }
}
