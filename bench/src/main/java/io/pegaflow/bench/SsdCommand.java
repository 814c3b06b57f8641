package io.pegaflow.bench;

import com.sun.nio.file.ExtendedOpenOption;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.store.LocalStore;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.Sizes;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.ssd.SsdConfig;
import io.pegaflow.engine.ssd.SsdRecord;
import io.pegaflow.engine.ssd.SsdTier;
import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

/**
 * The SSD tier against the disk it sits on, in one run: raw direct-I/O write and read of the
 * same bytes in record-sized pieces on the same number of threads (the ceiling), the tier's
 * write-behind and read-back (staging copy, CRC32C, headers included), the index rebuild
 * after a restart, and the time from a query to a {@code --blocks} prefix read back into the
 * pool. JSON keys: write_gbps, read_gbps, raw_write_gbps, raw_read_gbps, write_ratio,
 * read_ratio, prefetch_2048_ms_p50 (for --blocks 2048), rebuild_ms.
 */
@Command(name = "ssd", mixinStandardHelpOptions = true,
        description = "SSD tier write/read GB/s against raw direct I/O on the same file system, and prefix read-back latency.")
final class SsdCommand implements Callable<Integer> {
    @Option(names = "--path", defaultValue = "out/ssd-bench", description = "directory on the disk to measure (emptied of our files)")
    Path dir;

    @Option(names = "--blocks", defaultValue = "2048", description = "blocks written and read (default ${DEFAULT-VALUE})")
    int blocks;

    @Option(names = "--block-size", defaultValue = "2mb",
            description = "bytes of one block: 32 layers x 1 slot (default ${DEFAULT-VALUE}: Llama-3.1-8B, 16 tokens, bf16)")
    String blockSize;

    @Option(names = "--write-threads", defaultValue = "" + SsdConfig.DEFAULT_WRITE_THREADS)
    int writeThreads;

    @Option(names = "--read-threads", defaultValue = "" + SsdConfig.DEFAULT_READ_THREADS)
    int readThreads;

    @Option(names = "--repeats", defaultValue = "5", description = "prefix read-backs timed (default ${DEFAULT-VALUE})")
    int repeats;

    @Option(names = "--rounds", defaultValue = "5", description = "raw/tier alternations; medians reported (default ${DEFAULT-VALUE})")
    int rounds;

    @Option(names = "--json", defaultValue = "out/ssd.json")
    Path json;

    private static final int LAYERS = 32;
    private static final String NS = "bench-ssd";

    @Override
    public Integer call() throws Exception {
        long blockBytes = Sizes.parse(blockSize);
        if (blockBytes % (LAYERS * 2L * 512) != 0 || blocks < 1) {
            throw new IllegalArgumentException("--block-size " + blockSize + " and --blocks " + blocks
                    + "; expected a multiple of " + LAYERS * 2 * 512 + " bytes and >= 1 block");
        }
        Files.createDirectories(dir);
        Path tierDir = dir.resolve("tier");
        deleteTier(tierDir);
        long[] slotBytes = new long[LAYERS];
        Arrays.fill(slotBytes, blockBytes / LAYERS);
        long recordBytes = SsdRecord.recordBytes(blockBytes);
        long total = blockBytes * blocks;
        byte[][] hashes = new byte[blocks][];
        Random rnd = new Random(42);
        for (int i = 0; i < blocks; i++) {
            hashes[i] = new byte[32];
            rnd.nextBytes(hashes[i]);
        }
        Map<String, Object> report = new LinkedHashMap<>();
        report.put("path", dir.toAbsolutePath().toString());
        report.put("file_system", fileSystem(dir));
        report.put("blocks", blocks);
        report.put("block_bytes", blockBytes);
        report.put("write_threads", writeThreads);
        report.put("read_threads", readThreads);

        try (Arena arena = Arena.ofShared()) {
            // A ring of 32 source/destination blocks: the data moved is blocks x block size, the memory 64 MiB.
            int ring = Math.min(32, blocks);
            MemorySegment src = arena.allocate(ring * blockBytes, SsdRecord.PAGE);
            for (long at = 0; at + 8 <= src.byteSize(); at += 8) {
                src.set(ValueLayout.JAVA_LONG_UNALIGNED, at, at * 0x9E3779B97F4A7C15L);
            }
            MemorySegment dst = arena.allocate(ring * blockBytes, SsdRecord.PAGE);

            SsdConfig config = new SsdConfig(List.of(tierDir), recordBytes * blocks + (64L << 20), 1, blocks,
                    writeThreads, readThreads, Math.max(1, Math.min(blocks, SsdConfig.DEFAULT_MAX_PREFETCH_BLOCKS)));
            // Raw and tier alternate, round after round, each read right after its own write and
            // the order swapped every round: a shared virtual disk drifts and caches recent
            // writes, and the ratio should compare the two under the same conditions. Medians
            // are reported.
            List<Double> rawW = new ArrayList<>();
            List<Double> rawR = new ArrayList<>();
            List<Double> tierW = new ArrayList<>();
            List<Double> tierR = new ArrayList<>();
            for (int round = 0; round < rounds; round++) {
                for (int k = 0; k < 2; k++) {
                    if ((k == 0) == (round % 2 == 0)) {
                        rawW.add(rawDirect(dir.resolve("raw.bin"), blockBytes, blocks, writeThreads, arena, true));
                        rawR.add(rawDirect(dir.resolve("raw.bin"), blockBytes, blocks, readThreads, arena, false));
                        Files.deleteIfExists(dir.resolve("raw.bin"));
                    } else {
                        deleteTier(tierDir);
                        tierW.add(tierWrite(config, blocks, blockBytes, slotBytes, hashes, src, ring));
                        tierR.add(tierRead(config, blocks, blockBytes, slotBytes, hashes, src, dst, ring, report,
                                System.nanoTime()));
                    }
                }
                System.err.printf(Locale.ROOT, "round %d: raw write %.3f, tier write %.3f, raw read %.3f, tier read %.3f GB/s%n",
                        round, rawW.getLast(), tierW.getLast(), rawR.getLast(), tierR.getLast());
            }
            double write = median(tierW);
            double read = median(tierR);
            report.put("raw_write_gbps", round(median(rawW)));
            report.put("raw_read_gbps", round(median(rawR)));
            report.put("write_gbps", round(write));
            report.put("read_gbps", round(read));
            report.put("write_ratio", round(write / median(rawW)));
            report.put("read_ratio", round(read / median(rawR)));
            report.put("rounds", Map.of("raw_write_gbps", rounded(rawW), "write_gbps", rounded(tierW),
                    "raw_read_gbps", rounded(rawR), "read_gbps", rounded(tierR)));

            List<Double> prefetchMs = new ArrayList<>();
            for (int rep = 0; rep < repeats; rep++) {
                prefetchMs.add(prefetchMillis(config, blocks, blockBytes, hashes));
                System.err.printf(Locale.ROOT, "prefix of %d blocks read back in %.1f ms%n", blocks, prefetchMs.getLast());
            }
            double p50 = median(prefetchMs);
            report.put("prefetch_" + blocks + "_ms_p50", round(p50));
            report.put("prefetch_ms_all", rounded(prefetchMs)); // in run order
            report.put("prefetch_gbps", round(total / (p50 / 1e3) / 1e9));
        } finally {
            deleteTier(tierDir);
            Files.deleteIfExists(dir.resolve("raw.bin"));
        }
        report.put("command", "pegaflow-bench ssd --path " + dir + " --blocks " + blocks + " --block-size " + blockSize);
        System.out.println(Json.write(report));
        if (json.getParent() != null) {
            Files.createDirectories(json.getParent());
        }
        Json.writeFile(json, report);
        return 0;
    }

    /** The tier's write-behind of every block (staging copy, CRC32C, header): GB/s of payload. */
    private static double tierWrite(SsdConfig config, int blocks, long blockBytes, long[] slotBytes, byte[][] hashes,
            MemorySegment src, int ring) throws InterruptedException {
        try (SsdTier tier = SsdTier.open(config, null)) {
            long t0 = System.nanoTime();
            for (int i = 0; i < blocks; i++) {
                MemorySegment from = src.asSlice((i % ring) * blockBytes, blockBytes);
                long id = i;
                if (!tier.offer(NS, hashes[i], slotBytes, d -> {
                    MemorySegment.copy(from, 0, d, 0, blockBytes);
                    stamp(d, id);
                    return true;
                })) {
                    throw new IllegalStateException("block " + i + " was not queued");
                }
            }
            if (!tier.awaitWritten(600_000)) {
                throw new IllegalStateException("writes did not finish in 10 minutes");
            }
            long t1 = System.nanoTime();
            if (tier.blocks() != blocks) {
                throw new IllegalStateException(tier.blocks() + " of " + blocks + " blocks reached the disk");
            }
            return blockBytes * (double) blocks / ((t1 - t0) / 1e9) / 1e9;
        }
    }

    /**
     * A restarted tier (index rebuilt) reading every block back, checked: GB/s of payload.
     * Block i lands in ring slot i % ring, and a slot takes its next read only once the last
     * one completed (the tier's contract: a read's destination is the caller's alone until it
     * completes). That keeps {@code ring} reads queued for the reader threads, as many as the
     * ring has slots: more than the threads, so the readers never wait for the benchmark.
     */
    private static double tierRead(SsdConfig config, int blocks, long blockBytes, long[] slotBytes, byte[][] hashes,
            MemorySegment src, MemorySegment dst, int ring, Map<String, Object> report, long r0) throws InterruptedException {
        try (SsdTier tier = SsdTier.open(config, null)) {
            report.put("rebuild_ms", round((System.nanoTime() - r0) / 1e6));
            CountDownLatch done = new CountDownLatch(blocks);
            AtomicInteger bad = new AtomicInteger();
            Semaphore[] free = new Semaphore[ring];
            for (int k = 0; k < ring; k++) {
                free[k] = new Semaphore(1);
            }
            long s0 = System.nanoTime();
            for (int i = 0; i < blocks; i++) {
                Semaphore slot = free[i % ring];
                slot.acquire(); // block i - ring, read into this slot, has completed
                tier.read(NS, hashes[i], slotBytes, dst.asSlice((i % ring) * blockBytes, blockBytes), o -> {
                    if (o != SsdTier.ReadOutcome.OK) {
                        bad.incrementAndGet();
                    }
                    slot.release();
                    done.countDown();
                });
            }
            done.await();
            double gbps = blockBytes * (double) blocks / ((System.nanoTime() - s0) / 1e9) / 1e9;
            if (bad.get() > 0) {
                throw new IllegalStateException(bad.get() + " blocks failed to read back");
            }
            // Every read is checked against its CRC; this checks the bytes landed where asked, too.
            int first = Math.max(0, blocks - ring);
            CountDownLatch check = new CountDownLatch(blocks - first);
            for (int i = first; i < blocks; i++) { // the last ring blocks: one slot each
                tier.read(NS, hashes[i], slotBytes, dst.asSlice((i % ring) * blockBytes, blockBytes), o -> {
                    if (o != SsdTier.ReadOutcome.OK) {
                        bad.incrementAndGet();
                    }
                    check.countDown();
                });
            }
            check.await();
            if (bad.get() > 0) {
                throw new IllegalStateException(bad.get() + " blocks failed their second read back");
            }
            for (int i = first; i < blocks; i++) {
                MemorySegment got = dst.asSlice((i % ring) * blockBytes, blockBytes);
                stamp(got, -1 - i); // undoes the block's stamp (xor), leaving the ring's bytes
                if (got.mismatch(src.asSlice((i % ring) * blockBytes, blockBytes)) != -1) {
                    throw new IllegalStateException("block " + i + ": read-back bytes differ from what was written");
                }
            }
            return gbps;
        }
    }

    /**
     * Makes every 4 KiB page of block {@code id} distinct (an xor into its first word), on
     * both sides: a virtual disk that deduplicates or compresses would otherwise store the
     * repeated pages of the source ring cheaper than real KV. {@code -1 - id} undoes it.
     */
    private static void stamp(MemorySegment block, long id) {
        long key = id < 0 ? -1 - id : id;
        for (long at = 0; at + 8 <= block.byteSize(); at += 4096) {
            long v = block.get(ValueLayout.JAVA_LONG_UNALIGNED, at);
            block.set(ValueLayout.JAVA_LONG_UNALIGNED, at, v ^ ((key + 1) * 0x9E3779B97F4A7C15L + at));
        }
    }

    private static double median(List<Double> xs) {
        return Stats.median(xs.stream().mapToDouble(Double::doubleValue).toArray());
    }

    private static List<Double> rounded(List<Double> xs) {
        return xs.stream().map(SsdCommand::round).toList();
    }

    /**
     * A fresh store on the tier's files (index rebuilt, DRAM empty), a query for the whole
     * prefix, polled until it is not "not yet": milliseconds from the first query to the
     * answer with every block resident.
     */
    private static double prefetchMillis(SsdConfig config, int blocks, long blockBytes, byte[][] hashes) {
        long pool = 2 * blocks * blockBytes + (16L << 20); // answers are capped at half the pool
        try (Arena arena = Arena.ofShared()) {
            MemorySegment poolMemory = arena.allocate(pool, SsdRecord.PAGE);
            LocalStore store = new LocalStore(EngineConfig.builder().poolBytes(pool).build(), pool);
            try {
                store.attachSsd(config, poolMemory);
                store.registerInstance(new InstanceSpec("bench", NS, 1, 1));
                List<LayerRegion> regions = new ArrayList<>();
                long slot = blockBytes / LAYERS;
                long base = 1L << 40; // addresses the control plane records but never touches
                for (int l = 0; l < LAYERS; l++) {
                    regions.add(new LayerRegion(String.format(Locale.ROOT, "layer.%02d", l), KvLayout.SPLIT_KV, base,
                            slot * blocks, blocks, slot, slot / 2, slot / 2));
                    base += slot * blocks;
                }
                store.registerWorker("bench", new WorkerSpec(0, 0, 0, regions));
                BlockHashes query = BlockHashes.of(hashes);
                long t0 = System.nanoTime();
                QueryResult q;
                while ((q = store.query("bench", query)).pending()) {
                    // vLLM asks again at its next scheduler step; 0.1 ms is a fast step
                    java.util.concurrent.locks.LockSupport.parkNanos(100_000);
                }
                double ms = (System.nanoTime() - t0) / 1e6;
                if (q.hitBlocks() != blocks) {
                    throw new IllegalStateException("read back " + q.hitBlocks() + " of " + blocks + " blocks");
                }
                store.release("bench", q.lease());
                return ms;
            } finally {
                store.close();
            }
        }
    }

    /** Raw direct-I/O write (or read back) of {@code blocks} record-sized pieces: GB/s of block payload, as the tier counts. */
    private static double rawDirect(Path file, long blockBytes, int blocks, int threads, Arena arena, boolean write)
            throws Exception {
        if (write) {
            Files.deleteIfExists(file);
        }
        long recordBytes = SsdRecord.recordBytes(blockBytes);
        try (FileChannel ch = FileChannel.open(file, StandardOpenOption.CREATE, StandardOpenOption.READ,
                StandardOpenOption.WRITE, ExtendedOpenOption.DIRECT)) {
            ExecutorService pool = Executors.newFixedThreadPool(threads);
            AtomicInteger next = new AtomicInteger();
            List<Future<?>> fs = new ArrayList<>();
            List<MemorySegment> bufs = new ArrayList<>();
            for (int t = 0; t < threads; t++) {
                // Incompressible bytes, as the tier writes: a virtual disk may store constant pages cheaper.
                MemorySegment buf = arena.allocate(recordBytes, SsdRecord.PAGE);
                for (long at = 0; at + 8 <= recordBytes; at += 8) {
                    buf.set(ValueLayout.JAVA_LONG_UNALIGNED, at, (at + t * recordBytes + 1) * 0xC2B2AE3D27D4EB4FL);
                }
                bufs.add(buf);
            }
            long t0 = System.nanoTime();
            for (MemorySegment buf : bufs) {
                fs.add(pool.submit(() -> {
                    int i;
                    while ((i = next.getAndIncrement()) < blocks) {
                        if (write) {
                            stamp(buf, i);
                        }
                        var bb = buf.asByteBuffer();
                        long pos = (long) i * recordBytes;
                        while (bb.hasRemaining()) {
                            int n = write ? ch.write(bb, pos + bb.position()) : ch.read(bb, pos + bb.position());
                            if (n < 0) {
                                throw new IOException("short raw file");
                            }
                        }
                    }
                    return null;
                }));
            }
            for (Future<?> f : fs) {
                f.get();
            }
            double gbps = blockBytes * (double) blocks / ((System.nanoTime() - t0) / 1e9) / 1e9;
            pool.shutdown();
            pool.awaitTermination(1, TimeUnit.MINUTES);
            return gbps;
        }
    }

    private static void deleteTier(Path tierDir) throws IOException {
        if (Files.isDirectory(tierDir)) {
            try (var files = Files.list(tierDir)) {
                for (Path p : files.toList()) {
                    if (p.getFileName().toString().startsWith("pegaflow-ssd-")) {
                        Files.delete(p);
                    }
                }
            }
        }
    }

    private static String fileSystem(Path dir) {
        try {
            var store = Files.getFileStore(dir);
            return store.type() + " (" + store.name() + ")";
        } catch (IOException e) {
            return "unknown";
        }
    }

    private static double round(double v) {
        return Math.round(v * 1000) / 1000.0;
    }
}
