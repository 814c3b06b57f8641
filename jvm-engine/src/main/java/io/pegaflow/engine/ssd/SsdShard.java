package io.pegaflow.engine.ssd;

import com.sun.nio.file.ExtendedOpenOption;
import java.io.EOFException;
import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.OpenOption;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.FileAttribute;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.function.Consumer;

/**
 * One shard file: a ring of records. The file grows as records are appended until the next
 * record would pass the shard's capacity; writing then wraps to the first record position
 * and every record the new one overlaps is dropped from the index first (FIFO by position,
 * as the original's ring). The file is opened with {@code O_DIRECT} where the file system
 * allows it (buffers and offsets are page-aligned), else buffered, said once in the log.
 *
 * <p>Thread-safety: {@link #reserve} is synchronized; positional reads and writes run
 * concurrently on the channel.
 */
final class SsdShard implements AutoCloseable {
    static final long MIN_BYTES = 64 * 1024;
    private static final System.Logger LOG = System.getLogger(SsdShard.class.getName());

    /** A record's place: committed once its bytes are on the file, dropped once overwritten. */
    static final class Entry {
        final SsdShard shard;
        final SsdKey key;
        final long offset;
        final SsdRecord.Header header;
        volatile boolean committed;
        volatile boolean dropped;

        Entry(SsdShard shard, SsdKey key, long offset, SsdRecord.Header header) {
            this.shard = shard;
            this.key = key;
            this.offset = offset;
            this.header = header;
        }

        long recordBytes() {
            return header.recordBytes();
        }
    }

    final Path file;
    final int index;
    final boolean direct;
    private final FileChannel channel;
    // --- guarded by this ---
    private long capacity;
    private long head = SsdRecord.PAGE;
    private final TreeMap<Long, Entry> byOffset = new TreeMap<>();
    private boolean capped;

    private SsdShard(Path file, int index, long capacity, FileChannel channel, boolean direct) {
        this.file = file;
        this.index = index;
        this.capacity = capacity;
        this.channel = channel;
        this.direct = direct;
    }

    /**
     * Opens (creating if absent) shard {@code index} at {@code file}. An existing file that is
     * not a shard of this format is left untouched: returns null with the reason logged.
     * {@code found} receives every readable record of an existing shard.
     */
    static SsdShard open(Path file, int index, long capacity, MemorySegment page, List<Entry> found) throws IOException {
        boolean exists = Files.exists(file);
        if (exists && Files.size(file) >= SsdRecord.PAGE) {
            // Checked with a buffered read first: a foreign file is never opened for writing.
            try (FileChannel probe = FileChannel.open(file, StandardOpenOption.READ)) {
                readFully(probe, page, 0, SsdRecord.PAGE, file);
            }
            String problem = SsdRecord.fileProblem(page);
            if (problem != null) {
                LOG.log(System.Logger.Level.WARNING, "SSD shard " + file + " skipped: " + problem
                        + "; it is left as it is (move or delete it to let PegaFlow use this path)");
                return null;
            }
        } else if (exists && Files.size(file) > 0) {
            LOG.log(System.Logger.Level.WARNING, "SSD shard " + file + " skipped: " + Files.size(file)
                    + " bytes, shorter than a shard header; it is left as it is");
            return null;
        }
        boolean direct = true;
        FileChannel ch;
        // KV bytes are as private as the prompts they came from: a new shard is this user's alone (0600).
        FileAttribute<?> owner = PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rw-------"));
        Set<OpenOption> opts = Set.of(StandardOpenOption.READ, StandardOpenOption.WRITE, StandardOpenOption.CREATE,
                ExtendedOpenOption.DIRECT);
        try {
            ch = FileChannel.open(file, opts, owner);
        } catch (IOException | UnsupportedOperationException e) {
            LOG.log(System.Logger.Level.WARNING, "SSD shard " + file + ": direct I/O refused (" + e.getMessage()
                    + "); using buffered I/O");
            direct = false;
            ch = FileChannel.open(file, Set.of(StandardOpenOption.READ, StandardOpenOption.WRITE, StandardOpenOption.CREATE),
                    owner);
        }
        SsdShard shard = new SsdShard(file, index, capacity, ch, direct);
        try {
            if (!exists || ch.size() == 0) {
                SsdRecord.writeFileHeader(page, index, capacity);
                shard.writeFully(page, SsdRecord.PAGE, 0);
            } else {
                shard.scan(page, found);
            }
        } catch (IOException | RuntimeException e) {
            ch.close();
            throw e;
        }
        return shard;
    }

    /** Walks the records; a page that is not a valid header is skipped page by page (torn or overwritten). */
    private void scan(MemorySegment page, List<Entry> found) throws IOException {
        long size = channel.size();
        long pos = SsdRecord.PAGE;
        long garbage = 0;
        while (pos + SsdRecord.PAGE <= size) {
            readFully(channel, page, pos, SsdRecord.PAGE, file);
            String problem = SsdRecord.problem(page);
            SsdRecord.Header h = problem == null ? SsdRecord.readHeader(page) : null;
            if (h == null || h.payloadBytes() < 0 || pos + h.recordBytes() > size) {
                garbage++;
                pos += SsdRecord.PAGE;
                continue;
            }
            found.add(new Entry(this, new SsdKey(h.namespace(), h.hash()), pos, h));
            pos += h.recordBytes();
        }
        if (garbage > 0) {
            LOG.log(System.Logger.Level.DEBUG, "SSD shard " + file + ": " + garbage + " pages hold no record (overwritten or torn)");
        }
    }

    /** After a scan: the kept records in seq order; writing continues after the newest. */
    synchronized void adopt(List<Entry> kept) {
        Entry newest = null;
        for (Entry e : kept) {
            e.committed = true;
            byOffset.put(e.offset, e);
            if (newest == null || e.header.seq() > newest.header.seq()) {
                newest = e;
            }
        }
        if (newest != null) {
            head = newest.offset + newest.recordBytes();
        }
    }

    /**
     * Claims the ring space for a record; every record it overlaps is passed to
     * {@code dropped} (and must leave the index). Null when the record cannot fit this shard.
     */
    synchronized Entry reserve(SsdKey key, SsdRecord.Header header, Consumer<Entry> dropped) {
        long bytes = header.recordBytes();
        if (bytes > capacity - SsdRecord.PAGE) {
            return null;
        }
        if (head + bytes > capacity) {
            head = SsdRecord.PAGE;
        }
        long end = head + bytes;
        Map.Entry<Long, Entry> before = byOffset.lowerEntry(head);
        if (before != null && before.getKey() + before.getValue().recordBytes() > head) {
            drop(before.getValue(), dropped);
        }
        for (Entry e : new ArrayList<>(byOffset.subMap(head, end).values())) {
            drop(e, dropped);
        }
        Entry e = new Entry(this, key, head, header);
        byOffset.put(head, e);
        head = end;
        return e;
    }

    /**
     * Marks a record as landed and runs {@code publish} (which puts it in the index), unless a
     * wrap dropped it while it was being written. Under this shard's lock, as drops are, so a
     * record is never indexed after its drop was handled.
     */
    synchronized boolean commit(Entry e, Runnable publish) {
        if (e.dropped) {
            return false;
        }
        e.committed = true;
        publish.run();
        return true;
    }

    /** Forgets one record (overwritten, failed, or unreadable). */
    synchronized void forget(Entry e) {
        byOffset.remove(e.offset, e);
        e.dropped = true;
    }

    private void drop(Entry e, Consumer<Entry> dropped) {
        byOffset.remove(e.offset);
        e.dropped = true;
        dropped.accept(e);
    }

    /**
     * After a write past the end of the disk's space: this shard now ends where that write
     * started, so the ring wraps there from now on. Returns false if it was already capped lower.
     */
    synchronized boolean capAt(long offset) {
        long cap = Math.max(offset, SsdRecord.PAGE + MIN_BYTES);
        if (capped && cap >= capacity) {
            return false;
        }
        capped = true;
        capacity = Math.min(capacity, cap);
        head = SsdRecord.PAGE;
        return true;
    }

    synchronized long capacity() {
        return capacity;
    }

    void writeFully(MemorySegment buf, long length, long position) throws IOException {
        var bb = buf.asSlice(0, length).asByteBuffer();
        while (bb.hasRemaining()) {
            channel.write(bb, position + bb.position());
        }
    }

    void readFully(MemorySegment buf, long position, long length) throws IOException {
        readFully(channel, buf, position, length, file);
    }

    private static void readFully(FileChannel ch, MemorySegment buf, long position, long length, Path file)
            throws IOException {
        var bb = buf.asSlice(0, length).asByteBuffer();
        while (bb.hasRemaining()) {
            int n = ch.read(bb, position + bb.position());
            if (n < 0) {
                throw new EOFException("shard " + file + " ends at " + ch.size() + " bytes; the record at " + position
                        + " needs " + length + " (file truncated?)");
            }
        }
    }

    /** A page-aligned buffer for this shard's direct I/O. */
    static MemorySegment buffer(Arena arena, long bytes) {
        return arena.allocate(SsdRecord.roundUp(Math.max(bytes, 1)), SsdRecord.PAGE);
    }

    @Override
    public void close() throws IOException {
        channel.close();
    }
}
