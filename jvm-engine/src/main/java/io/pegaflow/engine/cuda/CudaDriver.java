package io.pegaflow.engine.cuda;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.SymbolLookup;
import java.lang.invoke.MethodHandle;
import java.util.Optional;

/**
 * The CUDA driver API ({@code libcuda.so.1}) through Panama downcalls. The library is opened
 * by soname (the driver mount puts it on the loader path, not always in the ldconfig cache)
 * once, on first use; if it is missing every call throws the same {@link CudaException}
 * saying so. Handles (contexts, streams, events, modules, functions) are plain {@code long}s;
 * every {@code CUresult} is checked and a failure names the call, its arguments and the
 * driver's error name and text.
 *
 * <p>Symbols are the versioned ones {@code cuda.h} maps to ({@code cuMemAlloc_v2} ...), so the
 * bindings do not depend on a header. Thread rule: a thread must make a context current
 * ({@link #ctxSetCurrent}) before calls that need one.
 *
 * <p>Why one file past 600 lines: every driver symbol the project binds, looked up once in one
 * static holder and failing the same way when the library is absent; each binding is a few
 * lines and they share the checking of every {@code CUresult}.
 *
 * <p>Size: one Panama binding per driver entry point the engine calls, each with its error translation; kept in one file so the whole boundary to {@code libcuda} is read and audited in one place.
 */
public final class CudaDriver {
    public static final String LIBRARY = "libcuda.so.1";

    public static final int CU_STREAM_NON_BLOCKING = 0x1;
    public static final int CU_EVENT_BLOCKING_SYNC = 0x1;
    public static final int CU_EVENT_DISABLE_TIMING = 0x2;
    public static final int CU_MEMHOSTREGISTER_PORTABLE = 0x1;
    public static final int CU_MEMHOSTREGISTER_DEVICEMAP = 0x2;
    public static final int ATTR_MULTIPROCESSOR_COUNT = 16;
    public static final int ATTR_UNIFIED_ADDRESSING = 41;
    public static final int ATTR_COMPUTE_CAPABILITY_MAJOR = 75;
    public static final int ATTR_COMPUTE_CAPABILITY_MINOR = 76;
    public static final int ATTR_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 91;
    public static final int CUDA_ERROR_INVALID_VALUE = 1;
    public static final int CUDA_ERROR_NOT_FOUND = 500;
    public static final int CUDA_ERROR_NOT_READY = 600;
    /** {@code CUipcMemHandle}: 64 opaque bytes, passed by value to {@code cuIpcOpenMemHandle}. */
    public static final MemoryLayout IPC_HANDLE = MemoryLayout.structLayout(MemoryLayout.sequenceLayout(64, JAVA_BYTE));

    private static final Object LOCK = new Object();
    private static volatile SymbolLookup lookup;
    private static volatile boolean loaded;
    private static volatile CudaException failure;

    private CudaDriver() {}

    /** True when {@code libcuda.so.1} loads and {@code cuInit} succeeds. */
    public static boolean available() {
        try {
            ensureLoaded();
            return true;
        } catch (CudaException e) {
            return false;
        }
    }

    /**
     * Opens the driver and runs {@code cuInit(0)} once; throws (always the same message) when
     * there is no usable driver, which is what a CPU-only machine gets.
     */
    public static void ensureLoaded() {
        if (loaded) {
            return;
        }
        synchronized (LOCK) {
            if (loaded) {
                return;
            }
            if (failure == null) {
                try {
                    Optional<SymbolLookup> lib = open(LIBRARY);
                    if (lib.isEmpty()) {
                        failure = new CudaException("CUDA is not available: the driver library " + LIBRARY
                                + " could not be opened (no NVIDIA driver on this machine, or it is not on the loader path);"
                                + " the engine runs with host copies, ask for CUDA copies only on a GPU host", -1);
                    } else {
                        lookup = lib.get();
                        int rc = H.call(H.cuInit, "cuInit(0)", 0);
                        if (rc != 0) {
                            failure = new CudaException("CUDA is not available: cuInit(0) failed with " + errorText(rc)
                                    + " (no usable GPU, or driver and device do not match)", rc);
                        } else {
                            loaded = true;
                            return;
                        }
                    }
                } catch (CudaException e) {
                    failure = e;
                } catch (Throwable t) {
                    failure = new CudaException("CUDA driver bindings failed to initialise: " + t, t);
                }
            }
            throw new CudaException(failure.getMessage(), failure.result());
        }
    }

    private static Optional<SymbolLookup> open(String name) {
        try {
            return Optional.of(SymbolLookup.libraryLookup(name, Arena.global()));
        } catch (IllegalArgumentException notFound) {
            return Optional.empty();
        }
    }

    // ---------------------------------------------------------------- bindings

    /** Handles, created when the library is known to load (class init runs after ensureLoaded). */
    private static final class H {
        static final Linker LINKER = Linker.nativeLinker();
        static final MethodHandle cuInit = bindRaw("cuInit", JAVA_INT);

        /** Binds the first of {@code name} and, for a versioned name, its unversioned base. */
        static MethodHandle bindRaw(String name, MemoryLayout... args) {
            return LINKER.downcallHandle(find(name), FunctionDescriptor.of(JAVA_INT, args));
        }

        static MemorySegment find(String name) {
            Optional<MemorySegment> sym = lookup.find(name);
            if (sym.isEmpty() && name.endsWith("_v2")) {
                sym = lookup.find(name.substring(0, name.length() - 3));
            }
            return sym.orElseThrow(() -> new CudaException("CUDA driver symbol '" + name + "' not found in "
                    + LIBRARY + "; the driver is older than this engine supports", -1));
        }

        static int call(MethodHandle h, String what, Object... args) {
            return Downcall.boxed(h, what, args);
        }
    }

    /** Bindings used after {@link #ensureLoaded()}: initialising this class binds every symbol. */
    private static final class B {
        static final MethodHandle cuDriverGetVersion = H.bindRaw("cuDriverGetVersion", ADDRESS);
        static final MethodHandle cuDeviceGetCount = H.bindRaw("cuDeviceGetCount", ADDRESS);
        static final MethodHandle cuDeviceGet = H.bindRaw("cuDeviceGet", ADDRESS, JAVA_INT);
        static final MethodHandle cuDeviceGetName = H.bindRaw("cuDeviceGetName", ADDRESS, JAVA_INT, JAVA_INT);
        static final MethodHandle cuDeviceGetAttribute = H.bindRaw("cuDeviceGetAttribute", ADDRESS, JAVA_INT, JAVA_INT);
        static final MethodHandle cuDeviceTotalMem = H.bindRaw("cuDeviceTotalMem_v2", ADDRESS, JAVA_INT);
        static final MethodHandle cuDevicePrimaryCtxRetain = H.bindRaw("cuDevicePrimaryCtxRetain", ADDRESS, JAVA_INT);
        static final MethodHandle cuDevicePrimaryCtxRelease = H.bindRaw("cuDevicePrimaryCtxRelease_v2", JAVA_INT);
        static final MethodHandle cuCtxSetCurrent = H.bindRaw("cuCtxSetCurrent", JAVA_LONG);
        static final MethodHandle cuStreamCreate = H.bindRaw("cuStreamCreate", ADDRESS, JAVA_INT);
        static final MethodHandle cuStreamDestroy = H.bindRaw("cuStreamDestroy_v2", JAVA_LONG);
        static final MethodHandle cuStreamSynchronize = H.bindRaw("cuStreamSynchronize", JAVA_LONG);
        static final MethodHandle cuStreamWaitEvent = H.bindRaw("cuStreamWaitEvent", JAVA_LONG, JAVA_LONG, JAVA_INT);
        static final MethodHandle cuEventCreate = H.bindRaw("cuEventCreate", ADDRESS, JAVA_INT);
        static final MethodHandle cuEventDestroy = H.bindRaw("cuEventDestroy_v2", JAVA_LONG);
        static final MethodHandle cuEventRecord = H.bindRaw("cuEventRecord", JAVA_LONG, JAVA_LONG);
        static final MethodHandle cuEventSynchronize = H.bindRaw("cuEventSynchronize", JAVA_LONG);
        static final MethodHandle cuEventQuery = H.bindRaw("cuEventQuery", JAVA_LONG);
        static final MethodHandle cuMemAlloc = H.bindRaw("cuMemAlloc_v2", ADDRESS, JAVA_LONG);
        static final MethodHandle cuMemFree = H.bindRaw("cuMemFree_v2", JAVA_LONG);
        static final MethodHandle cuMemGetAddressRange = H.bindRaw("cuMemGetAddressRange_v2", ADDRESS, ADDRESS, JAVA_LONG);
        static final MethodHandle cuMemAllocHost = H.bindRaw("cuMemAllocHost_v2", ADDRESS, JAVA_LONG);
        static final MethodHandle cuMemFreeHost = H.bindRaw("cuMemFreeHost", JAVA_LONG);
        static final MethodHandle cuMemHostRegister = H.bindRaw("cuMemHostRegister_v2", JAVA_LONG, JAVA_LONG, JAVA_INT);
        static final MethodHandle cuMemHostUnregister = H.bindRaw("cuMemHostUnregister", JAVA_LONG);
        static final MethodHandle cuMemHostGetDevicePointer = H.bindRaw("cuMemHostGetDevicePointer_v2", ADDRESS, JAVA_LONG, JAVA_INT);
        static final MethodHandle cuMemcpyHtoD = H.bindRaw("cuMemcpyHtoD_v2", JAVA_LONG, JAVA_LONG, JAVA_LONG);
        static final MethodHandle cuMemcpyDtoH = H.bindRaw("cuMemcpyDtoH_v2", JAVA_LONG, JAVA_LONG, JAVA_LONG);
        static final MethodHandle cuMemcpyHtoDAsync = H.bindRaw("cuMemcpyHtoDAsync_v2", JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG);
        static final MethodHandle cuMemcpy2DAsync = H.bindRaw("cuMemcpy2DAsync_v2", ADDRESS, JAVA_LONG);
        static final MethodHandle cuMemcpyDtoHAsync = H.bindRaw("cuMemcpyDtoHAsync_v2", JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG);
        static final MethodHandle cuMemcpyDtoDAsync = H.bindRaw("cuMemcpyDtoDAsync_v2", JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG);
        static final MethodHandle cuMemsetD8Async = H.bindRaw("cuMemsetD8Async", JAVA_LONG, JAVA_BYTE, JAVA_LONG, JAVA_LONG);
        static final MethodHandle cuModuleLoadData = H.bindRaw("cuModuleLoadData", ADDRESS, ADDRESS);
        static final MethodHandle cuModuleGetFunction = H.bindRaw("cuModuleGetFunction", ADDRESS, JAVA_LONG, ADDRESS);
        static final MethodHandle cuModuleUnload = H.bindRaw("cuModuleUnload", JAVA_LONG);
        static final MethodHandle cuLaunchKernel = H.bindRaw("cuLaunchKernel", JAVA_LONG, JAVA_INT, JAVA_INT, JAVA_INT,
                JAVA_INT, JAVA_INT, JAVA_INT, JAVA_INT, JAVA_LONG, ADDRESS, ADDRESS);
        static final MethodHandle cuGetErrorName = H.bindRaw("cuGetErrorName", JAVA_INT, ADDRESS);
        static final MethodHandle cuGetErrorString = H.bindRaw("cuGetErrorString", JAVA_INT, ADDRESS);
    }

    /** IPC bindings apart, so a driver without them still copies. */
    private static final class Ipc {
        static final MethodHandle cuIpcGetMemHandle = H.bindRaw("cuIpcGetMemHandle", ADDRESS, JAVA_LONG);
        static final MethodHandle cuIpcOpenMemHandle = H.bindRaw("cuIpcOpenMemHandle_v2", ADDRESS, IPC_HANDLE, JAVA_INT);
        static final MethodHandle cuIpcCloseMemHandle = H.bindRaw("cuIpcCloseMemHandle", JAVA_LONG);
    }

    /**
     * {@code cuMemcpyBatchAsync} (CUDA 12.8+) at the ABI of the driver present: CUDA 13 dropped
     * the {@code failIdx} argument, so the entry point is asked for through
     * {@code cuGetProcAddress} at the version this driver implements, and called with the
     * arguments of that version. Null where the driver predates it.
     */
    private static final class Batch {
        static final boolean FAIL_IDX;
        static final MethodHandle FN;

        static {
            MethodHandle fn = null;
            boolean failIdx = false;
            try (Arena a = Arena.ofConfined()) {
                int version = driverVersion();
                Optional<MemorySegment> gpa = lookup.find("cuGetProcAddress_v2");
                if (version >= 12080 && gpa.isPresent()) {
                    MethodHandle get = H.LINKER.downcallHandle(gpa.get(),
                            FunctionDescriptor.of(JAVA_INT, ADDRESS, ADDRESS, JAVA_INT, JAVA_LONG, ADDRESS));
                    failIdx = version < 13000;
                    MemorySegment pfn = a.allocate(ADDRESS);
                    int rc = H.call(get, "cuGetProcAddress", a.allocateFrom("cuMemcpyBatchAsync"), pfn,
                            failIdx ? 12080 : 13000, 0L, a.allocate(JAVA_INT));
                    MemorySegment f = pfn.get(ADDRESS, 0);
                    if (rc == 0 && !f.equals(MemorySegment.NULL)) {
                        fn = failIdx
                                ? H.LINKER.downcallHandle(f, FunctionDescriptor.of(JAVA_INT, JAVA_LONG, JAVA_LONG, JAVA_LONG,
                                        JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG))
                                : H.LINKER.downcallHandle(f, FunctionDescriptor.of(JAVA_INT, JAVA_LONG, JAVA_LONG, JAVA_LONG,
                                        JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG));
                    }
                }
            } catch (RuntimeException e) {
                fn = null;
            }
            FN = fn;
            FAIL_IDX = failIdx;
        }
    }

    /** {@code CUmemcpyAttributes}: srcAccessOrder, srcLocHint {type, id}, dstLocHint {type, id}, flags. */
    public static final long MEMCPY_ATTRIBUTES_BYTES = 24;
    public static final int CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = 1;

    /** True when the driver has {@code cuMemcpyBatchAsync} (CUDA 12.8 and later). */
    public static boolean hasMemcpyBatch() {
        ensureLoaded();
        return Batch.FN != null;
    }

    /**
     * One {@code cuMemcpyBatchAsync} of {@code count} copies whose destinations, sources and
     * sizes are the host arrays at {@code dsts}, {@code srcs} and {@code sizes} (u64 each, read
     * during the call), every copy under the one attribute at {@code attrs}.
     */
    public static void memcpyBatchAsync(long dsts, long srcs, long sizes, long count, long attrs, long attrIdx,
            long failIdx, long stream) {
        ensureLoaded();
        if (Batch.FN == null) {
            throw new CudaException("cuMemcpyBatchAsync is not in this CUDA driver (" + driverVersion() + "; needs 12.8)", -1);
        }
        int rc = Batch.FAIL_IDX
                ? Downcall.call(Batch.FN, "cuMemcpyBatchAsync", dsts, srcs, sizes, count, attrs, attrIdx, 1L, failIdx, stream)
                : Downcall.call(Batch.FN, "cuMemcpyBatchAsync", dsts, srcs, sizes, count, attrs, attrIdx, 1L, stream);
        if (rc != 0) {
            throw failure(rc, "cuMemcpyBatchAsync(count=" + count + ")");
        }
    }

    private static void check(int rc, String call) {
        if (rc != 0) {
            throw failure(rc, call);
        }
    }

    /**
     * The exception of a failed call. Calls made per copy test {@code rc} themselves and build
     * {@code call}'s text only on failure (through {@link Downcall}, which allocates nothing).
     */
    private static CudaException failure(int rc, String call) {
        return new CudaException(call + " failed: " + errorText(rc), rc);
    }

    /** Callers have run {@link #ensureLoaded()} before naming a handle of {@code B}. */
    private static int invoke(MethodHandle h, String call, Object... args) {
        return H.call(h, call, args);
    }

    /** {@code NAME (description)} for a CUresult, e.g. {@code CUDA_ERROR_OUT_OF_MEMORY (out of memory)}. */
    public static String errorText(int rc) {
        if (lookup == null) {
            return "CUresult " + rc;
        }
        try (Arena a = Arena.ofConfined()) {
            MemorySegment name = a.allocate(ADDRESS);
            MemorySegment text = a.allocate(ADDRESS);
            int r1 = H.call(B.cuGetErrorName, "cuGetErrorName", rc, name);
            int r2 = H.call(B.cuGetErrorString, "cuGetErrorString", rc, text);
            String n = r1 == 0 ? cString(name.get(ADDRESS, 0)) : "CUresult " + rc;
            String t = r2 == 0 ? cString(text.get(ADDRESS, 0)) : "unknown error";
            return n + " (" + t + ")";
        } catch (RuntimeException | Error e) {
            return "CUresult " + rc;
        }
    }

    private static String cString(MemorySegment p) {
        return p.equals(MemorySegment.NULL) ? "?" : p.reinterpret(4096).getString(0);
    }

    // ---------------------------------------------------------------- device and context

    public static int driverVersion() {
        ensureLoaded();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_INT);
            check(invoke(B.cuDriverGetVersion, "cuDriverGetVersion", out), "cuDriverGetVersion");
            return out.get(JAVA_INT, 0);
        }
    }

    public static int deviceCount() {
        ensureLoaded();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_INT);
            check(invoke(B.cuDeviceGetCount, "cuDeviceGetCount", out), "cuDeviceGetCount");
            return out.get(JAVA_INT, 0);
        }
    }

    public static int deviceGet(int ordinal) {
        ensureLoaded();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_INT);
            check(invoke(B.cuDeviceGet, "cuDeviceGet", out, ordinal), "cuDeviceGet(ordinal=" + ordinal + ")");
            return out.get(JAVA_INT, 0);
        }
    }

    public static String deviceName(int device) {
        ensureLoaded();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(256);
            check(invoke(B.cuDeviceGetName, "cuDeviceGetName", out, 256, device), "cuDeviceGetName(device=" + device + ")");
            return out.getString(0);
        }
    }

    public static int deviceAttribute(int attribute, int device) {
        ensureLoaded();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_INT);
            check(invoke(B.cuDeviceGetAttribute, "cuDeviceGetAttribute", out, attribute, device),
                    "cuDeviceGetAttribute(attribute=" + attribute + ", device=" + device + ")");
            return out.get(JAVA_INT, 0);
        }
    }

    public static long deviceTotalMem(int device) {
        ensureLoaded();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_LONG);
            check(invoke(B.cuDeviceTotalMem, "cuDeviceTotalMem", out, device), "cuDeviceTotalMem(device=" + device + ")");
            return out.get(JAVA_LONG, 0);
        }
    }

    public static long primaryCtxRetain(int device) {
        ensureLoaded();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_LONG);
            check(invoke(B.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", out, device),
                    "cuDevicePrimaryCtxRetain(device=" + device + ")");
            return out.get(JAVA_LONG, 0);
        }
    }

    public static void primaryCtxRelease(int device) {
        ensureLoaded();
        check(invoke(B.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", device), "cuDevicePrimaryCtxRelease(device=" + device + ")");
    }

    public static void ctxSetCurrent(long ctx) {
        ensureLoaded();
        int rc = Downcall.call(B.cuCtxSetCurrent, "cuCtxSetCurrent", ctx);
        if (rc != 0) {
            throw failure(rc, "cuCtxSetCurrent(ctx=0x" + Long.toHexString(ctx) + ")");
        }
    }

    // ---------------------------------------------------------------- streams and events

    public static long streamCreate(int flags) {
        ensureLoaded();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_LONG);
            check(invoke(B.cuStreamCreate, "cuStreamCreate", out, flags), "cuStreamCreate(flags=" + flags + ")");
            return out.get(JAVA_LONG, 0);
        }
    }

    public static void streamDestroy(long stream) {
        ensureLoaded();
        check(invoke(B.cuStreamDestroy, "cuStreamDestroy", stream), "cuStreamDestroy(stream=0x" + Long.toHexString(stream) + ")");
    }

    public static void streamSynchronize(long stream) {
        ensureLoaded();
        int rc = Downcall.call(B.cuStreamSynchronize, "cuStreamSynchronize", stream);
        if (rc != 0) {
            throw failure(rc, "cuStreamSynchronize(stream=0x" + Long.toHexString(stream) + ")");
        }
    }

    /** Makes {@code stream} wait for the work captured by {@code event} (no host blocking). */
    public static void streamWaitEvent(long stream, long event) {
        ensureLoaded();
        int rc = Downcall.call(B.cuStreamWaitEvent, "cuStreamWaitEvent", stream, event, 0);
        if (rc != 0) {
            throw failure(rc, "cuStreamWaitEvent(stream=0x" + Long.toHexString(stream) + ", event=0x" + Long.toHexString(event) + ")");
        }
    }

    public static long eventCreate(int flags) {
        ensureLoaded();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_LONG);
            check(invoke(B.cuEventCreate, "cuEventCreate", out, flags), "cuEventCreate(flags=" + flags + ")");
            return out.get(JAVA_LONG, 0);
        }
    }

    public static void eventDestroy(long event) {
        ensureLoaded();
        check(invoke(B.cuEventDestroy, "cuEventDestroy", event), "cuEventDestroy(event=0x" + Long.toHexString(event) + ")");
    }

    public static void eventRecord(long event, long stream) {
        ensureLoaded();
        int rc = Downcall.call(B.cuEventRecord, "cuEventRecord", event, stream);
        if (rc != 0) {
            throw failure(rc, "cuEventRecord(event=0x" + Long.toHexString(event) + ", stream=0x" + Long.toHexString(stream) + ")");
        }
    }

    public static void eventSynchronize(long event) {
        ensureLoaded();
        int rc = Downcall.call(B.cuEventSynchronize, "cuEventSynchronize", event);
        if (rc != 0) {
            throw failure(rc, "cuEventSynchronize(event=0x" + Long.toHexString(event) + ")");
        }
    }

    /** True when the event's work is done, false while pending. */
    public static boolean eventQuery(long event) {
        ensureLoaded();
        int rc = Downcall.call(B.cuEventQuery, "cuEventQuery", event);
        if (rc == CUDA_ERROR_NOT_READY) {
            return false;
        }
        if (rc != 0) {
            throw failure(rc, "cuEventQuery(event=0x" + Long.toHexString(event) + ")");
        }
        return true;
    }

    // ---------------------------------------------------------------- memory

    public static long memAlloc(long bytes) {
        ensureLoaded();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_LONG);
            check(invoke(B.cuMemAlloc, "cuMemAlloc", out, bytes), "cuMemAlloc(bytes=" + bytes + ")");
            return out.get(JAVA_LONG, 0);
        }
    }

    public static void memFree(long ptr) {
        ensureLoaded();
        check(invoke(B.cuMemFree, "cuMemFree", ptr), "cuMemFree(ptr=0x" + Long.toHexString(ptr) + ")");
    }

    /**
     * The CUDA allocation holding {@code ptr} as {@code {base, bytes}}, or {@code null} when
     * {@code ptr} is in none ({@code CUDA_ERROR_NOT_FOUND} or {@code CUDA_ERROR_INVALID_VALUE}:
     * host memory, unmapped, freed). For a virtual-memory mapping ({@code cuMemMap}, e.g.
     * PyTorch's expandable segments) it is the one mapped piece holding {@code ptr}. Needs a
     * current context.
     */
    public static long[] memGetAddressRange(long ptr) {
        ensureLoaded();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment base = a.allocate(JAVA_LONG);
            MemorySegment size = a.allocate(JAVA_LONG);
            int rc = invoke(B.cuMemGetAddressRange, "cuMemGetAddressRange", base, size, ptr);
            if (rc == CUDA_ERROR_NOT_FOUND || rc == CUDA_ERROR_INVALID_VALUE) {
                return null;
            }
            check(rc, "cuMemGetAddressRange(ptr=0x" + Long.toHexString(ptr) + ")");
            return new long[] {base.get(JAVA_LONG, 0), size.get(JAVA_LONG, 0)};
        }
    }

    /** Page-locked host memory from the driver (for small staging buffers). */
    public static long memAllocHost(long bytes) {
        ensureLoaded();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ADDRESS);
            check(invoke(B.cuMemAllocHost, "cuMemAllocHost", out, bytes), "cuMemAllocHost(bytes=" + bytes + ")");
            return out.get(ADDRESS, 0).address();
        }
    }

    public static void memFreeHost(long ptr) {
        ensureLoaded();
        check(invoke(B.cuMemFreeHost, "cuMemFreeHost", ptr), "cuMemFreeHost(ptr=0x" + Long.toHexString(ptr) + ")");
    }

    public static void memHostRegister(long addr, long bytes, int flags) {
        ensureLoaded();
        check(invoke(B.cuMemHostRegister, "cuMemHostRegister", addr, bytes, flags),
                "cuMemHostRegister(addr=0x" + Long.toHexString(addr) + ", bytes=" + bytes + ", flags=" + flags + ")");
    }

    public static void memHostUnregister(long addr) {
        ensureLoaded();
        check(invoke(B.cuMemHostUnregister, "cuMemHostUnregister", addr), "cuMemHostUnregister(addr=0x" + Long.toHexString(addr) + ")");
    }

    public static long memHostGetDevicePointer(long addr) {
        ensureLoaded();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_LONG);
            check(invoke(B.cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer", out, addr, 0),
                    "cuMemHostGetDevicePointer(addr=0x" + Long.toHexString(addr) + ")");
            return out.get(JAVA_LONG, 0);
        }
    }

    public static void memcpyHtoD(long dst, long src, long bytes) {
        ensureLoaded();
        check(invoke(B.cuMemcpyHtoD, "cuMemcpyHtoD", dst, src, bytes),
                "cuMemcpyHtoD(dst=0x" + Long.toHexString(dst) + ", src=0x" + Long.toHexString(src) + ", bytes=" + bytes + ")");
    }

    public static void memcpyDtoH(long dst, long src, long bytes) {
        ensureLoaded();
        check(invoke(B.cuMemcpyDtoH, "cuMemcpyDtoH", dst, src, bytes),
                "cuMemcpyDtoH(dst=0x" + Long.toHexString(dst) + ", src=0x" + Long.toHexString(src) + ", bytes=" + bytes + ")");
    }

    public static void memcpyHtoDAsync(long dst, long src, long bytes, long stream) {
        ensureLoaded();
        int rc = Downcall.call(B.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync", dst, src, bytes, stream);
        if (rc != 0) {
            throw failure(rc, "cuMemcpyHtoDAsync(dst=0x" + Long.toHexString(dst) + ", src=0x" + Long.toHexString(src) + ", bytes=" + bytes + ")");
        }
    }

    /** Bytes of {@code CUDA_MEMCPY2D}: sixteen 8-byte fields (the two memory types padded to 8). */
    public static final long MEMCPY2D_BYTES = 128;
    static final int CU_MEMORYTYPE_HOST = 1;
    static final int CU_MEMORYTYPE_DEVICE = 2;

    /**
     * One pitched copy from (registered) host memory to the device ({@code cuMemcpy2DAsync}):
     * {@code height} rows of {@code width} bytes, row i from {@code src + i * srcPitch} to
     * {@code dst + i * dstPitch}. {@code desc} is a {@link #MEMCPY2D_BYTES} scratch struct of
     * the caller's, read during the call.
     */
    public static void memcpy2DHtoDAsync(MemorySegment desc, long dst, long dstPitch, long src, long srcPitch, long width,
            long height, long stream) {
        ensureLoaded();
        desc.fill((byte) 0);
        desc.set(JAVA_INT, 16, CU_MEMORYTYPE_HOST); // srcMemoryType
        desc.set(JAVA_LONG, 24, src); // srcHost
        desc.set(JAVA_LONG, 48, srcPitch);
        desc.set(JAVA_INT, 72, CU_MEMORYTYPE_DEVICE); // dstMemoryType
        desc.set(JAVA_LONG, 88, dst); // dstDevice
        desc.set(JAVA_LONG, 104, dstPitch);
        desc.set(JAVA_LONG, 112, width);
        desc.set(JAVA_LONG, 120, height);
        int rc = Downcall.call(B.cuMemcpy2DAsync, "cuMemcpy2DAsync", desc, stream);
        if (rc != 0) {
            throw failure(rc, "cuMemcpy2DAsync(dst=0x" + Long.toHexString(dst)
                + ", dstPitch=" + dstPitch + ", src=0x" + Long.toHexString(src) + ", srcPitch=" + srcPitch + ", width="
                + width + ", height=" + height + ")");
        }
    }

    public static void memcpyDtoHAsync(long dst, long src, long bytes, long stream) {
        ensureLoaded();
        int rc = Downcall.call(B.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync", dst, src, bytes, stream);
        if (rc != 0) {
            throw failure(rc, "cuMemcpyDtoHAsync(dst=0x" + Long.toHexString(dst) + ", src=0x" + Long.toHexString(src) + ", bytes=" + bytes + ")");
        }
    }

    public static void memcpyDtoDAsync(long dst, long src, long bytes, long stream) {
        ensureLoaded();
        int rc = Downcall.call(B.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync", dst, src, bytes, stream);
        if (rc != 0) {
            throw failure(rc, "cuMemcpyDtoDAsync(dst=0x" + Long.toHexString(dst) + ", src=0x" + Long.toHexString(src) + ", bytes=" + bytes + ")");
        }
    }

    public static void memsetD8Async(long dst, byte value, long bytes, long stream) {
        ensureLoaded();
        check(invoke(B.cuMemsetD8Async, "cuMemsetD8Async", dst, value, bytes, stream),
                "cuMemsetD8Async(dst=0x" + Long.toHexString(dst) + ", value=" + value + ", bytes=" + bytes + ")");
    }

    // ---------------------------------------------------------------- modules and launches

    public static long moduleLoadData(byte[] image) {
        ensureLoaded();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_LONG);
            MemorySegment img = a.allocate(image.length + 1L, 16);
            MemorySegment.copy(image, 0, img, JAVA_BYTE, 0, image.length);
            check(invoke(B.cuModuleLoadData, "cuModuleLoadData", out, img), "cuModuleLoadData(" + image.length + " bytes)");
            return out.get(JAVA_LONG, 0);
        }
    }

    public static long moduleGetFunction(long module, String name) {
        ensureLoaded();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_LONG);
            check(invoke(B.cuModuleGetFunction, "cuModuleGetFunction", out, module, a.allocateFrom(name)),
                    "cuModuleGetFunction(name=" + name + ")");
            return out.get(JAVA_LONG, 0);
        }
    }

    public static void moduleUnload(long module) {
        ensureLoaded();
        check(invoke(B.cuModuleUnload, "cuModuleUnload", module), "cuModuleUnload(module=0x" + Long.toHexString(module) + ")");
    }

    /**
     * Launches {@code function} with a 1-D grid and block. {@code params} is the C array of
     * pointers to each argument's value ({@code void** kernelParams}).
     */
    public static void launchKernel(long function, int grid, int block, int sharedMem, long stream, MemorySegment params) {
        ensureLoaded();
        int rc = Downcall.launch(B.cuLaunchKernel, function, grid, 1, 1, block, 1, 1, sharedMem, stream, params, MemorySegment.NULL);
        if (rc != 0) {
            throw failure(rc, "cuLaunchKernel(grid=" + grid + ", block=" + block + ", stream=0x" + Long.toHexString(stream) + ")");
        }
    }

    // ---------------------------------------------------------------- IPC (for the server data path)

    /** Exports a device allocation as a 64-byte IPC handle another process can open. */
    public static byte[] ipcGetMemHandle(long devicePtr) {
        ensureLoaded();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(IPC_HANDLE);
            check(invoke(Ipc.cuIpcGetMemHandle, "cuIpcGetMemHandle", out, devicePtr),
                    "cuIpcGetMemHandle(ptr=0x" + Long.toHexString(devicePtr) + ")");
            return out.toArray(JAVA_BYTE);
        }
    }

    /** Opens another process's IPC handle (flag 1 = lazy peer access); returns the device pointer. */
    public static long ipcOpenMemHandle(byte[] handle) {
        ensureLoaded();
        if (handle.length != 64) {
            throw new IllegalArgumentException("IPC handle of " + handle.length + " bytes; expected 64");
        }
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_LONG);
            MemorySegment h = a.allocate(IPC_HANDLE);
            MemorySegment.copy(handle, 0, h, JAVA_BYTE, 0, 64);
            check(invoke(Ipc.cuIpcOpenMemHandle, "cuIpcOpenMemHandle", out, h, 1), "cuIpcOpenMemHandle");
            return out.get(JAVA_LONG, 0);
        }
    }

    public static void ipcCloseMemHandle(long devicePtr) {
        ensureLoaded();
        check(invoke(Ipc.cuIpcCloseMemHandle, "cuIpcCloseMemHandle", devicePtr), "cuIpcCloseMemHandle(ptr=0x" + Long.toHexString(devicePtr) + ")");
    }
}
