package io.pegaflow.engine.ssd;

import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.Sizes;
import io.pegaflow.engine.metrics.Counter;
import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.BiConsumer;
import java.util.function.Consumer;
import java.util.zip.CRC32C;

/**
 * The SSD tier: sealed blocks written behind the host pool into shard files, an index of
 * what is on disk (rebuilt from the files at start), and reads back with every byte checked.
 * It never touches the pool's index: the store offers blocks ({@link #offer}) and asks for
 * reads ({@link #read}); both complete on this tier's threads.
 *
 * <ul>
 *   <li>Write-behind: {@link #offer} never blocks. A full queue drops the block from the disk
 *       path (it stays in DRAM), counted as {@link Counter#SSD_WRITE_QUEUE_FULL}.</li>
 *   <li>Integrity: each record carries its key, slot geometry and a CRC32C of its payload;
 *       a read whose header, geometry or checksum does not match is a miss, never bytes.</li>
 *   <li>Failures (a full disk, a truncated or unreadable file) drop the records involved,
 *       log one line and count; the tier keeps working with what it has.</li>
 * </ul>
 *
 * <p>Size: the write queue, the read-back and the index rebuilt at start share one index and one lock; the shard files' format is in {@code SsdShard}.
 */
public final class SsdTier implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(SsdTier.class.getName());

    /** Copies a block's slots, in slot order, into {@code dst}; false when the block is gone. */
    @FunctionalInterface
    public interface Source {
        boolean fill(MemorySegment dst);
    }

    /** What a read delivered. */
    public enum ReadOutcome { OK, GONE, CORRUPT, IO_ERROR, GEOMETRY }

    private record Job(SsdKey key, int slots, long[] runs, long payloadBytes, Source source) {}

    /** The destination of a read in flight: {@code [start, end)} of native memory, for the key being read. */
    private record InFlight(long end, SsdKey key) {}

    private final SsdConfig config;
    private final BiConsumer<Counter, Long> counter;
    private final List<SsdShard> shards = new ArrayList<>();
    private final Map<SsdKey, SsdShard.Entry> index = new ConcurrentHashMap<>();
    /** Keys queued or being written, so a block is not queued twice. */
    private final Map<SsdKey, Boolean> queued = new ConcurrentHashMap<>();
    private final BlockingQueue<Job> queue;
    private final ExecutorService writers;
    private final ExecutorService readers;
    private final Arena arena = Arena.ofShared();
    private final ThreadLocal<MemorySegment[]> staging = ThreadLocal.withInitial(() -> new MemorySegment[1]);
    private final AtomicInteger nextShard = new AtomicInteger();
    private final AtomicLong storedBytes = new AtomicLong();
    private final AtomicLong seq = new AtomicLong();
    private final AtomicInteger busyWriters = new AtomicInteger();
    /** Told of every record indexed and dropped (the store's KV events); any thread, never blocking. */
    private volatile Listener listener = Listener.NONE;

    /** What happens to records: one indexed after its write, one dropped (overwritten by the ring, forgotten). */
    public interface Listener {
        Listener NONE = new Listener() {
            @Override
            public void stored(String namespace, byte[] hash) {}

            @Override
            public void removed(String namespace, byte[] hash) {}
        };

        void stored(String namespace, byte[] hash);

        void removed(String namespace, byte[] hash);
    }

    /** Sets who is told of records stored and removed from now on. */
    public void listen(Listener l) {
        listener = l == null ? Listener.NONE : l;
    }
    /**
     * Destinations of the reads queued or running, by start address (disjoint ranges, guarded
     * by itself). A read costs one uncontended lock and an O(log n) floor lookup, n the reads in
     * flight (the store keeps at most its prefetch budget): negligible next to reading a page or
     * more from disk, so the whole range is checked, not only the start address (an O(1) map of
     * starts would miss a destination sliced at another offset).
     */
    private final TreeMap<Long, InFlight> inFlight = new TreeMap<>();
    /** Tests only: runs on the reader thread between a straight read into the destination and its checksum. */
    volatile Consumer<MemorySegment> afterStraightRead;
    private volatile boolean closed;

    private SsdTier(SsdConfig config, BiConsumer<Counter, Long> counter) {
        this.config = config;
        this.counter = counter;
        this.queue = new ArrayBlockingQueue<>(config.writeQueueBlocks());
        this.writers = Executors.newFixedThreadPool(config.writeThreads(), named("pegaflow-ssd-writer"));
        this.readers = Executors.newFixedThreadPool(config.readThreads(), named("pegaflow-ssd-reader"));
    }

    /**
     * Opens every shard under the configured paths (creating directories and files as
     * needed) and rebuilds the index from the records found. Files that are not shards of
     * this format are skipped with a warning and left untouched.
     *
     * @throws InvalidArgumentException when a path cannot be used (not a directory, not writable)
     */
    public static SsdTier open(SsdConfig config, BiConsumer<Counter, Long> counter) {
        SsdTier tier = new SsdTier(config, counter == null ? (c, d) -> {} : counter);
        try {
            tier.openShards();
        } catch (RuntimeException | Error e) {
            tier.close();
            throw e;
        }
        for (int i = 0; i < config.writeThreads(); i++) {
            tier.writers.execute(tier::writeLoop);
        }
        return tier;
    }

    private void openShards() {
        long perShard = config.capacityBytes() / ((long) config.paths().size() * config.shardsPerPath());
        perShard = perShard / SsdRecord.PAGE * SsdRecord.PAGE;
        MemorySegment page = SsdShard.buffer(arena, SsdRecord.PAGE);
        List<SsdShard.Entry> found = new ArrayList<>();
        int skipped = 0;
        for (Path dir : config.paths()) {
            try {
                Files.createDirectories(dir);
            } catch (IOException e) {
                throw new InvalidArgumentException("SSD cache path " + dir + ": " + e + "; expected a writable directory");
            }
            if (!Files.isDirectory(dir) || !Files.isWritable(dir)) {
                throw new InvalidArgumentException("SSD cache path " + dir + " is not a writable directory");
            }
            for (int s = 0; s < config.shardsPerPath(); s++) {
                Path file = dir.resolve("pegaflow-ssd-" + s + ".shard");
                try {
                    SsdShard shard = SsdShard.open(file, s, perShard, page, found);
                    if (shard == null) {
                        skipped++;
                    } else {
                        shards.add(shard);
                    }
                } catch (IOException e) {
                    skipped++;
                    LOG.log(System.Logger.Level.WARNING, "SSD shard " + file + " not used: " + e);
                }
            }
        }
        // Newest record of each key wins; the rest stay on disk as unindexed bytes.
        Map<SsdKey, SsdShard.Entry> newest = new HashMap<>();
        for (SsdShard.Entry e : found) {
            newest.merge(e.key, e, (a, b) -> a.header.seq() >= b.header.seq() ? a : b);
        }
        Map<SsdShard, List<SsdShard.Entry>> perShardKept = new HashMap<>();
        long maxSeq = -1;
        for (SsdShard.Entry e : newest.values()) {
            perShardKept.computeIfAbsent(e.shard, k -> new ArrayList<>()).add(e);
            index.put(e.key, e);
            storedBytes.addAndGet(e.recordBytes());
            maxSeq = Math.max(maxSeq, e.header.seq());
        }
        perShardKept.forEach(SsdShard::adopt);
        seq.set(maxSeq + 1);
        if (shards.isEmpty()) {
            LOG.log(System.Logger.Level.WARNING, "SSD tier has no usable shard (" + skipped + " skipped): blocks stay in DRAM only");
        } else {
            LOG.log(System.Logger.Level.INFO, "SSD tier: " + shards.size() + " shard(s) of " + Sizes.format(perShard)
                    + (shards.getFirst().direct ? ", direct I/O" : ", buffered I/O") + "; " + index.size()
                    + " block(s) found on disk (" + Sizes.format(storedBytes.get()) + ")"
                    + (skipped > 0 ? "; " + skipped + " shard file(s) skipped" : ""));
        }
    }

    // ---------------------------------------------------------------- write-behind

    /**
     * Offers a sealed block for writing. Returns at once: false (and counted) when the queue
     * is full, the tier has no shard, or the block is already on disk or queued.
     *
     * @param slotBytes each slot's size, in slot order; the payload is their concatenation
     */
    public boolean offer(String namespace, byte[] hash, long[] slotBytes, Source source) {
        if (closed || shards.isEmpty()) {
            return false;
        }
        SsdKey key = new SsdKey(namespace, hash.clone());
        if (index.containsKey(key) || queued.putIfAbsent(key, Boolean.TRUE) != null) {
            return false;
        }
        long payload = 0;
        for (long b : slotBytes) {
            payload += b;
        }
        long[] runs = SsdRecord.runs(slotBytes);
        if (!SsdRecord.fits(namespace, key.hash(), runs)) {
            queued.remove(key);
            count(Counter.SSD_WRITE_SKIPPED, 1);
            return false;
        }
        if (!queue.offer(new Job(key, slotBytes.length, runs, payload, source))) {
            queued.remove(key);
            count(Counter.SSD_WRITE_QUEUE_FULL, 1);
            return false;
        }
        return true;
    }

    private void writeLoop() {
        while (!closed) {
            Job job;
            try {
                job = queue.poll(200, TimeUnit.MILLISECONDS);
            } catch (InterruptedException e) {
                return;
            }
            if (job == null) {
                continue;
            }
            busyWriters.incrementAndGet();
            try {
                write(job);
            } catch (RuntimeException e) {
                LOG.log(System.Logger.Level.WARNING, "SSD write of " + job.key + " failed: " + e);
                count(Counter.SSD_WRITE_ERRORS, 1);
            } finally {
                queued.remove(job.key);
                busyWriters.decrementAndGet();
            }
        }
    }

    private void write(Job job) {
        MemorySegment buf = stagingFor(SsdRecord.PAGE + job.payloadBytes);
        MemorySegment payload = buf.asSlice(SsdRecord.PAGE, job.payloadBytes);
        if (!job.source.fill(payload)) {
            count(Counter.SSD_WRITE_SKIPPED, 1); // evicted from DRAM before its turn came
            return;
        }
        long padded = SsdRecord.roundUp(job.payloadBytes);
        if (padded > job.payloadBytes) {
            buf.asSlice(SsdRecord.PAGE + job.payloadBytes, padded - job.payloadBytes).fill((byte) 0);
        }
        int crc = SsdRecord.crc(payload, 0, job.payloadBytes);
        SsdRecord.Header h = new SsdRecord.Header(seq.getAndIncrement(), job.payloadBytes, crc, job.key.namespace(),
                job.key.hash(), job.slots, job.runs);
        SsdRecord.writeHeader(buf, h);
        int n = shards.size();
        for (int attempt = 0; attempt < n; attempt++) {
            SsdShard shard = shards.get(Math.floorMod(nextShard.getAndIncrement(), n));
            SsdShard.Entry e = shard.reserve(job.key, h, this::dropped);
            if (e == null) {
                continue; // larger than this shard
            }
            try {
                shard.writeFully(buf, h.recordBytes(), e.offset);
            } catch (IOException ex) {
                shard.forget(e);
                writeFailed(shard, e, ex);
                return;
            }
            // offer() let only one write of a key in, and only while it was not indexed
            if (!shard.commit(e, () -> {
                index.put(job.key, e);
                storedBytes.addAndGet(h.recordBytes());
            })) {
                return; // overwritten by a wrap before it landed (a ring far smaller than the writes in flight)
            }
            count(Counter.SSD_WRITE_BLOCKS, 1);
            count(Counter.SSD_WRITE_BYTES, job.payloadBytes);
            listener.stored(job.key.namespace(), job.key.hash());
            return;
        }
        count(Counter.SSD_WRITE_SKIPPED, 1); // larger than every shard
    }

    private void writeFailed(SsdShard shard, SsdShard.Entry e, IOException ex) {
        count(Counter.SSD_WRITE_ERRORS, 1);
        String msg = String.valueOf(ex.getMessage());
        if (msg.contains("No space left")) {
            count(Counter.SSD_DISK_FULL, 1);
            if (shard.capAt(e.offset)) {
                LOG.log(System.Logger.Level.WARNING, "SSD shard " + shard.file + ": disk full at " + Sizes.format(e.offset)
                        + " (" + msg + "); the shard now wraps there. Blocks that did not fit stay in DRAM only.");
            }
        } else {
            LOG.log(System.Logger.Level.WARNING, "SSD write to " + shard.file + " at " + e.offset + " failed: " + ex
                    + "; the block stays in DRAM only");
        }
    }

    private void dropped(SsdShard.Entry e) {
        if (e.committed && index.remove(e.key, e)) {
            storedBytes.addAndGet(-e.recordBytes());
            count(Counter.SSD_OVERWRITTEN_BLOCKS, 1);
            listener.removed(e.key.namespace(), e.key.hash());
        }
    }

    // ---------------------------------------------------------------- reads

    /** Whether the block is on disk (committed). */
    public boolean contains(String namespace, byte[] packed, int offset, int length) {
        SsdShard.Entry e = index.get(new SsdKey(namespace, Arrays.copyOfRange(packed, offset, offset + length)));
        return e != null && e.committed && !e.dropped;
    }

    /**
     * Reads a block into {@code dst} (its slots in slot order) on a reader thread, then calls
     * {@code done}. {@code dst} holds the block only when the outcome is {@link ReadOutcome#OK}:
     * the record matched {@code slotBytes} and its checksum. Otherwise {@code dst} may hold
     * anything, and a record that failed leaves the index (so it is not read again).
     *
     * <p>The caller owns {@code dst} exclusively from this call until {@code done} runs: nothing
     * else may write it, another read of this tier included (the disk's bytes land there before
     * they are checked, so a write meanwhile would make a good record look damaged). A read whose
     * destination overlaps one still in flight is refused. Once {@code done} is called the tier
     * no longer touches {@code dst}, so the caller may give its memory to the next read.
     *
     * @throws InvalidArgumentException when {@code dst} (native memory) overlaps the destination
     *     of a read still in flight; {@code done} is not called then
     */
    public void read(String namespace, byte[] hash, long[] slotBytes, MemorySegment dst, Consumer<ReadOutcome> done) {
        SsdKey key = new SsdKey(namespace, hash.clone());
        long claimed = claim(key, dst);
        try {
            readers.execute(() -> {
                ReadOutcome outcome;
                try {
                    outcome = readNow(key, slotBytes, dst);
                } catch (RuntimeException e) {
                    // whatever went wrong, the caller hears of it (its reservation must be released)
                    LOG.log(System.Logger.Level.WARNING, "SSD read of " + key.namespace() + "/" + hex(key.hash())
                            + " failed: " + e + "; served as a miss");
                    count(Counter.SSD_READ_ERRORS, 1);
                    outcome = ReadOutcome.IO_ERROR;
                } finally {
                    unclaim(claimed); // before done: it may hand the same memory to the next read
                }
                done.accept(outcome);
            });
        } catch (java.util.concurrent.RejectedExecutionException e) {
            unclaim(claimed);
            done.accept(ReadOutcome.GONE); // closing
        }
    }

    /**
     * Records {@code dst} as the destination of a read in flight; its start address, or -1 when
     * it is not tracked (heap memory has no address of its own to compare; an empty one is never
     * written).
     */
    private long claim(SsdKey key, MemorySegment dst) {
        if (!dst.isNative() || dst.byteSize() == 0) {
            return -1;
        }
        long start = dst.address();
        long end = start + dst.byteSize();
        synchronized (inFlight) {
            // The ranges are disjoint, so the one starting last before our end is the only candidate.
            Map.Entry<Long, InFlight> before = inFlight.lowerEntry(end);
            if (before != null && before.getValue().end() > start) {
                throw new InvalidArgumentException("SSD read of " + key.namespace() + "/" + hex(key.hash()) + " into "
                        + range(start, end) + " overlaps the destination " + range(before.getKey(), before.getValue().end())
                        + " of the read of " + before.getValue().key().namespace() + "/" + hex(before.getValue().key().hash())
                        + " still in flight; expected a destination nothing else writes until the read completes");
            }
            inFlight.put(start, new InFlight(end, key));
        }
        return start;
    }

    private void unclaim(long start) {
        if (start != -1) {
            synchronized (inFlight) {
                inFlight.remove(start);
            }
        }
    }

    private static String range(long start, long end) {
        return "[0x" + Long.toHexString(start) + ", 0x" + Long.toHexString(end) + ")";
    }

    private ReadOutcome readNow(SsdKey key, long[] slotBytes, MemorySegment dst) {
        SsdShard.Entry e = index.get(key);
        if (e == null || !e.committed || e.dropped) {
            return ReadOutcome.GONE;
        }
        SsdRecord.Header h = e.header;
        if (!Arrays.equals(h.runs(), SsdRecord.runs(slotBytes)) || h.payloadBytes() != dst.byteSize()) {
            discard(e); // else every later query would queue the same read again
            count(Counter.SSD_GEOMETRY_MISMATCH, 1);
            return ReadOutcome.GEOMETRY;
        }
        // Straight into the destination when direct I/O allows it (page-aligned address and
        // length): the block is not visible until the check below passes, so a bad record's
        // bytes are never served. Else through a staging buffer, with the header re-read.
        long n = h.payloadBytes();
        boolean straight = n % SsdRecord.PAGE == 0 && (!e.shard.direct || dst.address() % SsdRecord.PAGE == 0);
        ReadOutcome failed;
        if (straight) {
            if ((failed = fetch(e, dst, e.offset + SsdRecord.PAGE, n)) != null) {
                return failed;
            }
            if (e.dropped) {
                return ReadOutcome.GONE; // overwritten while it was being read: the bytes may be torn
            }
            Consumer<MemorySegment> hook = afterStraightRead;
            if (hook != null) {
                hook.accept(dst);
            }
            if (SsdRecord.crc(dst, 0, n) == h.payloadCrc()) {
                count(Counter.SSD_READ_BLOCKS, 1);
                count(Counter.SSD_READ_BYTES, n);
                return ReadOutcome.OK;
            }
            // Not evidence enough to drop the record: the caller's memory may have been written
            // while the disk filled it (read's contract forbids it, but the check cannot see
            // every writer). Read it again, header included, into staging, which only this
            // thread touches: only a record that fails there too is damaged.
        }
        MemorySegment buf = stagingFor(h.recordBytes());
        if ((failed = fetch(e, buf, e.offset, h.recordBytes())) != null) {
            return failed;
        }
        if (e.dropped) {
            return ReadOutcome.GONE; // overwritten while it was being read: the bytes may be torn
        }
        String problem = SsdRecord.problem(buf);
        SsdRecord.Header onDisk = problem == null ? SsdRecord.readHeader(buf) : null;
        if (problem == null && (onDisk.seq() != h.seq() || !Arrays.equals(onDisk.hash(), key.hash()))) {
            problem = "header changed";
        }
        MemorySegment payload = buf.asSlice(SsdRecord.PAGE, n);
        if (problem == null && SsdRecord.crc(payload, 0, n) != h.payloadCrc()) {
            problem = "payload checksum mismatch";
        }
        if (problem != null) {
            discard(e);
            count(Counter.SSD_CHECKSUM_FAILURES, 1);
            LOG.log(System.Logger.Level.WARNING, "SSD record " + key.namespace() + "/" + hex(key.hash()) + " in "
                    + e.shard.file + " at " + e.offset + " failed its check ("
                    + (straight ? "payload checksum mismatch in the destination, then " + problem + " through staging" : problem)
                    + "); served as a miss");
            return ReadOutcome.CORRUPT;
        }
        MemorySegment.copy(payload, 0, dst, 0, n);
        if (straight) {
            count(Counter.SSD_READ_RETRIES, 1);
            LOG.log(System.Logger.Level.WARNING, "SSD record " + key.namespace() + "/" + hex(key.hash()) + " in "
                    + e.shard.file + " at " + e.offset + " failed its checksum in the destination and passed when read"
                    + " again through staging: something wrote the destination during the read (the caller must own it"
                    + " until the read completes); served, the record kept");
        }
        count(Counter.SSD_READ_BLOCKS, 1);
        count(Counter.SSD_READ_BYTES, n);
        return ReadOutcome.OK;
    }

    /**
     * Reads {@code length} bytes at {@code position} of the record's shard into {@code buf};
     * null when they arrived, else the outcome to return (a failed read drops the record).
     */
    private ReadOutcome fetch(SsdShard.Entry e, MemorySegment buf, long position, long length) {
        try {
            e.shard.readFully(buf, position, length);
            return null;
        } catch (IOException ex) {
            if (e.dropped) {
                return ReadOutcome.GONE;
            }
            discard(e);
            count(Counter.SSD_READ_ERRORS, 1);
            LOG.log(System.Logger.Level.WARNING, "SSD read of " + e.key.namespace() + "/" + hex(e.key.hash()) + " from "
                    + e.shard.file + " failed: " + ex + "; served as a miss");
            return ReadOutcome.IO_ERROR;
        }
    }

    /**
     * Forgets every committed record of {@code namespace} (null: of every namespace), as an
     * operator's clear asks; the number forgotten. Reads of them answer as misses. The records
     * stay in the shard files until the ring overwrites them, so a server restarted on the same
     * path indexes them again.
     */
    public long forget(String namespace) {
        long n = 0;
        for (SsdShard.Entry e : index.values()) {
            if (e.committed && !e.dropped && (namespace == null || namespace.equals(e.key.namespace())) && discard(e)) {
                n++;
            }
        }
        return n;
    }

    /** Whether any committed record of {@code namespace} is indexed (a walk of the index: for the operator's calls). */
    public boolean holds(String namespace) {
        for (SsdShard.Entry e : index.values()) {
            if (e.committed && !e.dropped && e.key.namespace().equals(namespace)) {
                return true;
            }
        }
        return false;
    }

    /** Drops the record from the index and its shard; false when another thread dropped it first. */
    private boolean discard(SsdShard.Entry e) {
        boolean removed = index.remove(e.key, e);
        if (removed) {
            storedBytes.addAndGet(-e.recordBytes());
            listener.removed(e.key.namespace(), e.key.hash());
        }
        e.shard.forget(e);
        return removed;
    }

    private MemorySegment stagingFor(long bytes) {
        MemorySegment[] holder = staging.get();
        if (holder[0] == null || holder[0].byteSize() < bytes) {
            // Thread-confined buffers in the tier's arena, freed with it; they grow to the largest record.
            holder[0] = SsdShard.buffer(arena, Math.max(bytes, holder[0] == null ? 0 : holder[0].byteSize() * 2));
        }
        return holder[0];
    }

    // ---------------------------------------------------------------- state

    /** Blocks indexed on disk. */
    public long blocks() {
        return index.size();
    }

    /** Disk bytes those blocks' records take. */
    public long bytes() {
        return storedBytes.get();
    }

    public int shardCount() {
        return shards.size();
    }

    public SsdConfig config() {
        return config;
    }

    /** Waits until the write queue is empty and no write is in progress (tests, benchmarks). */
    public boolean awaitWritten(long timeoutMillis) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMillis);
        while (!queue.isEmpty() || busyWriters.get() > 0 || !queued.isEmpty()) {
            if (System.nanoTime() > deadline) {
                return false;
            }
            Thread.sleep(2);
        }
        return true;
    }

    /** Stops the threads (queued writes are dropped: those blocks were only in DRAM) and closes the files. */
    @Override
    public void close() {
        if (closed) {
            return;
        }
        closed = true;
        queue.clear();
        // No interrupts: an interrupted FileChannel call closes the channel under the others.
        writers.shutdown();
        readers.shutdown();
        try {
            writers.awaitTermination(30, TimeUnit.SECONDS);
            readers.awaitTermination(30, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        for (SsdShard s : shards) {
            try {
                s.close();
            } catch (IOException ignored) {
                // closing a file we only read and wrote through positional calls
            }
        }
        arena.close();
    }

    private void count(Counter c, long delta) {
        counter.accept(c, delta);
    }

    private static String hex(byte[] b) {
        return java.util.HexFormat.of().formatHex(b, 0, Math.min(b.length, 8));
    }

    private static java.util.concurrent.ThreadFactory named(String name) {
        AtomicInteger n = new AtomicInteger();
        return r -> {
            Thread t = new Thread(r, name + "-" + n.incrementAndGet());
            t.setDaemon(true);
            return t;
        };
    }
}
