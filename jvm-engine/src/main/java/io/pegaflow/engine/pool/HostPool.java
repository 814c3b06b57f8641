package io.pegaflow.engine.pool;

import io.pegaflow.engine.EngineClosedException;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.Sizes;
import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.channels.FileChannel;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.GroupPrincipal;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.List;
import java.util.Set;

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
    private final Path file;
    private final boolean deleteOnClose;
    private volatile boolean closed;

    private HostPool(Arena arena, MemorySegment segment, String description, Path file, boolean deleteOnClose) {
        this.arena = arena;
        this.segment = segment;
        this.address = segment.address();
        this.description = description;
        this.file = file;
        this.deleteOnClose = deleteOnClose;
    }

    /**
     * A pool that several processes share: a file (normally under {@code /dev/shm}) mapped
     * read-write. {@code create}: {@link #createShared(Path, long, GroupPrincipal)} with no group
     * (mode 0600). Otherwise (workers) the existing file is mapped; it must hold {@code bytes}.
     */
    public static HostPool shared(Path path, long bytes, boolean create) {
        if (create) {
            return createShared(path, bytes, null);
        }
        long size = Pages.of(path).round(alignedSize(bytes));
        Arena arena = Arena.ofShared();
        try (FileChannel ch = FileChannel.open(path, StandardOpenOption.READ, StandardOpenOption.WRITE)) {
            if (ch.size() < size) {
                throw new InvalidArgumentException("shared pool " + path + " holds " + ch.size() + " bytes; expected "
                        + size + " (a server of another size owns it)");
            }
            MemorySegment seg = ch.map(FileChannel.MapMode.READ_WRITE, 0, size, arena);
            adviseHugePages(seg.address(), seg.byteSize());
            return new HostPool(arena, seg, "shared " + Sizes.format(size) + " at " + path, path, false);
        } catch (IOException e) {
            arena.close();
            throw new InvalidArgumentException("cannot map shared pool " + path + " of " + Sizes.format(size) + ": " + e);
        } catch (RuntimeException e) {
            arena.close();
            throw e;
        }
    }

    /**
     * Creates the file of a shared pool and maps it; closing the pool deletes the file. The
     * file is created exclusively and never through a symbolic link (O_CREAT|O_EXCL|O_NOFOLLOW):
     * an existing file or link at {@code path} is refused, not reused (a server reclaims a stale
     * pool under its lock first, {@link PoolFiles}). Mode 0600, or 0660 owned by {@code group},
     * set after creation so the umask does not matter. Sparse: pages are committed as written.
     */
    public static HostPool createShared(Path path, long bytes, GroupPrincipal group) {
        long size = Pages.of(path).round(alignedSize(bytes));
        Arena arena = Arena.ofShared();
        boolean created = false;
        try (FileChannel ch = FileChannel.open(path, Set.of(StandardOpenOption.CREATE_NEW, StandardOpenOption.READ,
                StandardOpenOption.WRITE, LinkOption.NOFOLLOW_LINKS), PosixFilePermissions.asFileAttribute(PoolFiles.OWNER_RW))) {
            created = true;
            PoolFiles.setMode(path, group, LinkOption.NOFOLLOW_LINKS);
            // the mapping sizes the file (ftruncate): hugetlbfs takes no write()
            MemorySegment seg = ch.map(FileChannel.MapMode.READ_WRITE, 0, size, arena);
            adviseHugePages(seg.address(), seg.byteSize());
            return new HostPool(arena, seg, "shared " + Sizes.format(size) + " at " + path, path, true);
        } catch (FileAlreadyExistsException e) {
            arena.close();
            throw new InvalidArgumentException("shared pool " + path + " already exists (a file or a symbolic link); "
                    + "refusing to reuse or follow it");
        } catch (IOException | RuntimeException e) {
            arena.close();
            if (created) {
                try {
                    Files.deleteIfExists(path);
                } catch (IOException suppressed) {
                    e.addSuppressed(suppressed);
                }
            }
            if (e instanceof RuntimeException r) {
                throw r;
            }
            throw new InvalidArgumentException("cannot create shared pool " + path + " of " + Sizes.format(size) + ": " + e);
        }
    }

    /**
     * Asks for transparent huge pages on a mapping ({@code MADV_HUGEPAGE}): pages of a
     * tmpfs file are then faulted (and pinned) in 2 MiB steps where the kernel's
     * {@code shmem_enabled} is {@code advise} or {@code always} ({@link #shmemHugePages}),
     * those of the embedded (anonymous) pool where {@code transparent_hugepage/enabled} is
     * {@code advise} or {@code always}; otherwise nothing changes. System property
     * {@code pegaflow.pool.thp=false} turns it off for either kind (the attach benchmark
     * compares both; an embedded engine takes it through {@code JAVA_TOOL_OPTIONS}).
     */
    private static void adviseHugePages(long address, long bytes) {
        if (!"false".equals(System.getProperty("pegaflow.pool.thp"))) {
            LibC.madvise(address, bytes, LibC.MADV_HUGEPAGE);
        }
    }

    /**
     * The pages a shared pool file at a path gets, from the mount that holds it: 4 KiB on a
     * plain tmpfs such as {@code /dev/shm} (the default), 2 MiB (or the mount's size) on
     * hugetlbfs, and transparent huge pages on a tmpfs mounted with {@code huge=always} or
     * {@code within_size} ({@code advise}: through {@link #adviseHugePages}). Pinning a pool for
     * CUDA pays per page, so a worker pins a pool on huge pages of either kind several times
     * faster than one on 4 KiB pages (docs/gpu.md, "Pool attach").
     *
     * @param fs        the file system type ({@code tmpfs}, {@code hugetlbfs}, ...; "unknown" when not found)
     * @param mount     its mount point
     * @param hugeBytes the huge page size the pool's pages come in, 0 for base pages
     */
    public record Pages(String fs, String mount, long hugeBytes) {
        /** Rounds a pool size up to whole pages of the mount (hugetlbfs maps only whole huge pages). */
        public long round(long bytes) {
            return hugeBytes == 0 ? bytes : (bytes + hugeBytes - 1) / hugeBytes * hugeBytes;
        }

        /** e.g. {@code hugetlbfs at /mnt/huge, 2 MiB pages} or {@code tmpfs at /dev/shm, 4 KiB pages}. */
        public String describe() {
            return fs + " at " + mount + ", " + (hugeBytes == 0 ? "4 KiB pages" : Sizes.format(hugeBytes) + " pages");
        }

        /** The mount that holds {@code path} (an existing file or a file to be made in an existing directory). */
        public static Pages of(Path path) {
            String real;
            try {
                Path p = path.toAbsolutePath();
                real = p.getParent().toRealPath().resolve(p.getFileName()).toString();
            } catch (IOException | RuntimeException e) {
                real = path.toAbsolutePath().toString();
            }
            try {
                return fromMounts(real, Files.readAllLines(Path.of("/proc/self/mounts")));
            } catch (IOException | RuntimeException e) {
                return new Pages("unknown", "?", 0);
            }
        }

        /** {@link #of} on the lines of a mount table ({@code /proc/self/mounts}) for an absolute, resolved path. */
        static Pages fromMounts(String real, List<String> mounts) {
            String best = null;
            String[] bestFields = null;
            for (String line : mounts) {
                String[] f = line.split(" ");
                if (f.length < 4) {
                    continue;
                }
                String mount = f[1].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\");
                boolean under = real.equals(mount) || real.startsWith(mount.endsWith("/") ? mount : mount + "/");
                if (under && (best == null || mount.length() >= best.length())) {
                    best = mount;
                    bestFields = f;
                }
            }
            if (bestFields == null) {
                return new Pages("unknown", "?", 0);
            }
            String fs = bestFields[2];
            String options = "," + bestFields[3] + ",";
            if (fs.equals("hugetlbfs")) {
                java.util.regex.Matcher m = java.util.regex.Pattern.compile(",pagesize=([0-9]+[kKmMgG]?)").matcher(options);
                return new Pages(fs, best, m.find() ? Sizes.parse(m.group(1)) : defaultHugePage());
            }
            if (fs.equals("tmpfs") && (options.contains(",huge=always,") || options.contains(",huge=within_size,")
                    || (options.contains(",huge=advise,") && !"false".equals(System.getProperty("pegaflow.pool.thp"))))) {
                return new Pages(fs, best, 2L << 20);
            }
            return new Pages(fs, best, 0);
        }

        private static long defaultHugePage() {
            try {
                for (String line : Files.readAllLines(Path.of("/proc/meminfo"))) {
                    if (line.startsWith("Hugepagesize:")) {
                        return Long.parseLong(line.replaceAll("[^0-9]", "")) * 1024;
                    }
                }
            } catch (IOException | RuntimeException e) {
                // fall through
            }
            return 2L << 20;
        }
    }

    /** The kernel's policy for huge pages on shared memory (the selected word of {@code shmem_enabled}), or "unknown". */
    public static String shmemHugePages() {
        try {
            String s = Files.readString(Path.of("/sys/kernel/mm/transparent_hugepage/shmem_enabled")).trim();
            int a = s.indexOf('[');
            int b = s.indexOf(']');
            return a >= 0 && b > a ? s.substring(a + 1, b) : s;
        } catch (IOException | RuntimeException e) {
            return "unknown";
        }
    }

    private static long alignedSize(long bytes) {
        if (bytes < ALIGNMENT) {
            throw new InvalidArgumentException("pool size " + bytes + " bytes is too small; expected at least "
                    + ALIGNMENT + " bytes (e.g. 64mb)");
        }
        return (bytes + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT;
    }

    /** The file behind a shared pool (null for a private one). */
    public Path file() {
        return file;
    }

    /** Maps an anonymous region of {@code bytes} (rounded up to {@link #ALIGNMENT}). */
    public static HostPool anonymous(long bytes) {
        long size = alignedSize(bytes);
        long addr = LibC.mmapAnonymous(size);
        adviseHugePages(addr, size);
        Arena arena = Arena.ofShared();
        MemorySegment seg = MemorySegment.ofAddress(addr).reinterpret(size, arena, s -> LibC.munmap(addr, size));
        return new HostPool(arena, seg, "anonymous " + Sizes.format(size), null, false);
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

    /** Unmaps the region (and deletes the file of a pool this process created). Callers must have stopped every copy. */
    @Override
    public synchronized void close() {
        if (!closed) {
            closed = true;
            arena.close();
            if (deleteOnClose && file != null) {
                try {
                    Files.deleteIfExists(file);
                } catch (IOException ignored) {
                    // a leftover file is reclaimed by the next server on the same path
                }
            }
        }
    }
}
