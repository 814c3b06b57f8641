package io.pegaflow.engine.cuda;

import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/** Copies listed for one {@code cuMemcpyBatchAsync}: destinations, sources, sizes (host arrays, read during the call). */
final class CopyRunList {
private final Arena arena;
    private MemorySegment dst;
    private MemorySegment src;
    private MemorySegment len;
    private final MemorySegment attr;
    private final MemorySegment attrIdx;
    private final MemorySegment failIdx;
    int count;

    CopyRunList(Arena arena) {
        this.arena = arena;
        dst = arena.allocate(JAVA_LONG, 64);
        src = arena.allocate(JAVA_LONG, 64);
        len = arena.allocate(JAVA_LONG, 64);
        attr = arena.allocate(CudaDriver.MEMCPY_ATTRIBUTES_BYTES, 8);
        attrIdx = arena.allocate(JAVA_LONG);
        failIdx = arena.allocate(JAVA_LONG);
        attr.set(JAVA_INT, 0, CudaDriver.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM); // location hints: none; flags: 0
    }

    void add(long from, long to, long bytes) {
        if (count == len.byteSize() / 8) { // bounded: a list is flushed at MAX_RUNS
            dst = grow(dst);
            src = grow(src);
            len = grow(len);
        }
        dst.setAtIndex(JAVA_LONG, count, to);
        src.setAtIndex(JAVA_LONG, count, from);
        len.setAtIndex(JAVA_LONG, count, bytes);
        count++;
    }

    private MemorySegment grow(MemorySegment old) {
        MemorySegment m = arena.allocate(JAVA_LONG, 2L * count);
        m.copyFrom(old);
        return m;
    }

    /** Queues the listed copies on {@code stream} in one call. */
    void flush(long stream) {
        if (count == 0) {
            return;
        }
        int n = count;
        count = 0;
        CudaDriver.memcpyBatchAsync(dst.address(), src.address(), len.address(), n, attr.address(), attrIdx.address(),
                failIdx.address(), stream);
    }

    void clear() {
        count = 0;
    }
}
