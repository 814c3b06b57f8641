package io.pegaflow.engine.pool;

import io.pegaflow.engine.EngineClosedException;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.Sizes;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * One large native region that holds every cached KV byte: allocated once, sub-allocated by
 * offset ({@link OffsetAllocator}), never freed piecemeal. This class is the single owner of
 * the region's {@link Arena}; everything else holds offsets or the arena-scoped
 * {@link #segment()} view, so {@link #close()} invalidates all of them at once and a late
 * access fails with an exception instead of touching unmapped memory.
 *
 * <p>The embedded pool is an anonymous private mapping with lazily committed pages and
 * transparent huge pages requested ({@code MADV_HUGEPAGE}): a 30 GiB pool costs nothing until
 * it is written, and first-touch faults come in 2 MiB steps where the kernel allows.
 */
public final class HostPool implements AutoCloseable {
    /** Offsets and sizes handed out are multiples of this (O_DIRECT and 16-byte vector copies). */
    public static final long ALIGNMENT = 512;

    private final Arena arena;
    private final MemorySegment segment;
    private final long address;
    private final String description;
    private volatile boolean closed;

    private HostPool(Arena arena, MemorySegment segment, String description) {
        this.arena = arena;
        this.segment = segment;
        this.address = segment.address();
        this.description = description;
    }

    /** Maps an anonymous region of {@code bytes} (rounded up to {@link #ALIGNMENT}). */
    public static HostPool anonymous(long bytes) {
        if (bytes < ALIGNMENT) {
            throw new InvalidArgumentException("pool size " + bytes + " bytes is too small; expected at least "
                    + ALIGNMENT + " bytes (e.g. 64mb)");
        }
        long size = (bytes + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT;
        long addr = LibC.mmapAnonymous(size);
        LibC.madvise(addr, size, LibC.MADV_HUGEPAGE);
        Arena arena = Arena.ofShared();
        MemorySegment seg = MemorySegment.ofAddress(addr).reinterpret(size, arena, s -> LibC.munmap(addr, size));
        return new HostPool(arena, seg, "anonymous " + Sizes.format(size));
    }

    /**
     * Commits every page now (one write per 4 KiB page, split across {@code threads}) so the
     * first saves do not pay page faults. Returns the nanoseconds it took. Pinning the pool
     * for CUDA commits the pages anyway; this is for host-only pools.
     */
    public long prefault(int threads) {
        MemorySegment seg = segment();
        long size = seg.byteSize();
        long start = System.nanoTime();
        int n = Math.max(1, threads);
        Thread[] workers = new Thread[n];
        for (int t = 0; t < n; t++) {
            long from = size * t / n / 4096 * 4096;
            long to = t == n - 1 ? size : size * (t + 1) / n / 4096 * 4096;
            workers[t] = Thread.ofPlatform().name("pegaflow-prefault-" + t).start(() -> {
                for (long off = from; off < to; off += 4096) {
                    seg.set(java.lang.foreign.ValueLayout.JAVA_BYTE, off, (byte) 0);
                }
            });
        }
        for (Thread w : workers) {
            try {
                w.join();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IllegalStateException("interrupted while pre-faulting the pool", e);
            }
        }
        return System.nanoTime() - start;
    }

    /** Size of the region in bytes. */
    public long size() {
        return segment.byteSize();
    }

    /** Base address of the region (host virtual address). */
    public long address() {
        return address;
    }

    /**
     * The region as a segment scoped to the pool's arena: any access after {@link #close()}
     * throws {@link IllegalStateException}. Copies should go through this view.
     */
    public MemorySegment segment() {
        if (closed) {
            throw new EngineClosedException("host pool (" + description + ") is closed");
        }
        return segment;
    }

    public String description() {
        return description;
    }

    public boolean isClosed() {
        return closed;
    }

    /** Unmaps the region. Callers must have stopped every copy into or out of it. */
    @Override
    public synchronized void close() {
        if (!closed) {
            closed = true;
            arena.close();
        }
    }
}
