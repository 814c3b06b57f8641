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
 * The few libc calls the pool needs (Linux, 64-bit), bound once at class initialisation:
 * mappings, and open/flock/close for the lock that guards a shared pool's files.
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
    static final int O_RDWR = 02;
    static final int O_CREAT = 0100;
    static final int O_EXCL = 0200;
    /** Differs by architecture: 0400000 on x86-64, 0100000 on arm64 (asm-generic/fcntl.h). */
    static final int O_NOFOLLOW = "aarch64".equals(System.getProperty("os.arch")) ? 0100000 : 0400000;
    static final int O_CLOEXEC = 02000000;
    static final int LOCK_EX = 2;
    static final int LOCK_NB = 4;
    static final int ENOENT = 2;
    static final int EACCES = 13;
    static final int EEXIST = 17;
    static final int ELOOP = 40;
    static final int EWOULDBLOCK = 11;
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
    // open(2) is variadic: the mode is its third, variadic argument.
    private static final MethodHandle OPEN = bind("open", FunctionDescriptor.of(ValueLayout.JAVA_INT,
            ValueLayout.ADDRESS, ValueLayout.JAVA_INT, ValueLayout.JAVA_INT), Linker.Option.firstVariadicArg(2));
    private static final MethodHandle FLOCK = bind("flock", FunctionDescriptor.of(ValueLayout.JAVA_INT,
            ValueLayout.JAVA_INT, ValueLayout.JAVA_INT));
    private static final MethodHandle CLOSE = bind("close", FunctionDescriptor.of(ValueLayout.JAVA_INT,
            ValueLayout.JAVA_INT));

    private LibC() {}

    private static MethodHandle bind(String name, FunctionDescriptor fd, Linker.Option... more) {
        MemorySegment symbol = LINKER.defaultLookup().find(name).orElseThrow(
                () -> new UnsatisfiedLinkError("libc symbol '" + name + "' not found; PegaFlow-JVM needs Linux glibc"));
        Linker.Option[] options = new Linker.Option[more.length + 1];
        options[0] = CAPTURE_ERRNO;
        System.arraycopy(more, 0, options, 1, more.length);
        return LINKER.downcallHandle(symbol, fd, options);
    }

    /** A failed call's errno, for callers that tell the expected failures (EEXIST, EWOULDBLOCK...) apart. */
    static final class ErrnoException extends Exception {
        final int errno;

        ErrnoException(String call, int errno) {
            super(call + " failed: errno " + errno + describe(errno));
            this.errno = errno;
        }
    }

    /** open(2); returns the descriptor or throws with errno. */
    static int open(String path, int flags, int mode) throws ErrnoException {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment state = arena.allocate(CAPTURE);
            int fd = (int) OPEN.invokeExact(state, arena.allocateFrom(path), flags, mode);
            if (fd < 0) {
                throw new ErrnoException("open(" + path + ", flags=0" + Integer.toOctalString(flags) + ", mode=0"
                        + Integer.toOctalString(mode) + ")", (int) ERRNO.get(state, 0L));
            }
            return fd;
        } catch (ErrnoException | RuntimeException | Error e) {
            throw e;
        } catch (Throwable t) {
            throw new IllegalStateException("open downcall failed", t);
        }
    }

    /** flock(2) on an open file description: the lock lives until every descriptor of it is closed. */
    static void flock(int fd, int operation) throws ErrnoException {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment state = arena.allocate(CAPTURE);
            if ((int) FLOCK.invokeExact(state, fd, operation) != 0) {
                throw new ErrnoException("flock(fd=" + fd + ", op=" + operation + ")", (int) ERRNO.get(state, 0L));
            }
        } catch (ErrnoException | RuntimeException | Error e) {
            throw e;
        } catch (Throwable t) {
            throw new IllegalStateException("flock downcall failed", t);
        }
    }

    static void close(int fd) {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment state = arena.allocate(CAPTURE);
            if ((int) CLOSE.invokeExact(state, fd) != 0) {
                int errno = (int) ERRNO.get(state, 0L);
                throw new IllegalStateException("close(fd=" + fd + ") failed: errno " + errno + describe(errno));
            }
        } catch (RuntimeException | Error e) {
            throw e;
        } catch (Throwable t) {
            throw new IllegalStateException("close downcall failed", t);
        }
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
            case 2 -> " (ENOENT)";
            case 11 -> " (EWOULDBLOCK: held by another open file)";
            case 12 -> " (ENOMEM: not enough address space or memory)";
            case 22 -> " (EINVAL: bad length, flags or alignment)";
            case 13 -> " (EACCES: permission denied)";
            case 17 -> " (EEXIST)";
            case 19 -> " (ENODEV)";
            case 40 -> " (ELOOP: a symbolic link)";
            default -> "";
        };
    }
}
