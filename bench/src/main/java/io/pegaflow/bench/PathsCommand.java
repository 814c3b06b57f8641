package io.pegaflow.bench;

import io.pegaflow.client.EngineClient;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.CopyResult;
import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.Sizes;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.cuda.CudaDevice;
import io.pegaflow.engine.cuda.CudaDriver;
import io.pegaflow.engine.cuda.CudaOptions;
import io.pegaflow.engine.cuda.CudaTransferEngine;
import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.CopyBatch;
import io.pegaflow.engine.transfer.HostTransferEngine;
import io.pegaflow.engine.transfer.TransferEngine;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.Callable;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

/**
 * The product's save and load paths side by side in one run, on the same blocks: the copy
 * engine alone (a prepared batch), an embedded {@link PegaEngine}, and server mode (a
 * pegaflow-server process as control plane, this process attached to its shared pool and
 * copying itself) with per-layer tensors and with one cross-layer tensor; a 10K-token restore
 * (query to load complete) in server mode; the first timed server operation against the
 * steady median. With {@code --copy cuda} it also measures the PCIe line; with
 * {@code --copy host} the copies are memcpy and, with small pieces, what is left is the
 * control plane's cost per operation (the figure CPU CI checks).
 */
@Command(name = "paths", mixinStandardHelpOptions = true,
        description = "Save/load of the copy engine alone, embedded and server mode, side by side (JSON).")
final class PathsCommand implements Callable<Integer> {
    @Option(names = "--copy", defaultValue = "cuda", description = "cuda (GPU memory, the H200 run) or host (memcpy; control-plane cost)")
    String copy;

    @Option(names = "--device", defaultValue = "0")
    int device;

    @Option(names = "--layers", defaultValue = "32")
    int layers;

    @Option(names = "--piece-bytes", defaultValue = "32768", description = "one layer's K (or V) of one block")
    int pieceBytes;

    @Option(names = "--cache-blocks", defaultValue = "8192", description = "blocks in the KV cache the ids scatter over")
    int cacheBlocks;

    @Option(names = "--blocks", defaultValue = "2048", description = "blocks per operation (the large case)")
    int blocks;

    @Option(names = "--small-blocks", defaultValue = "256", description = "blocks per operation (the small case)")
    int smallBlocks;

    @Option(names = "--restore-blocks", defaultValue = "625", description = "the restore case: 10K tokens of 16-token blocks")
    int restoreBlocks;

    @Option(names = "--repeat", defaultValue = "9", description = "timed operations per case; the median is reported")
    int repeat;

    @Option(names = "--pool-size", description = "pool of each engine and of the server (default: what the cases need + 1 GiB)")
    String poolSize;

    @Option(names = "--java", description = "java launcher for the server and worker processes (default: this JVM's)")
    String javaLauncher;

    @Option(names = "--attach-pool-size", defaultValue = "60gb",
            description = "shared pool the attach case maps and pins, under several settings (0: skip; cuda only)")
    String attachPoolSize;

    @Option(names = "--prefault-threads", defaultValue = "16", description = "threads committing the pool in the pre-faulted attach cases")
    int prefaultThreads;

    @Option(names = "--tp2", defaultValue = "auto",
            description = "two worker processes on GPUs 0 and 1 as TP ranks of one instance: auto (when 2 GPUs), on, off")
    String tp2;

    @Option(names = "--attach-settings", defaultValue = "all", split = ",",
            description = "attach settings to run (all, or names: 4k_all, thp_all, background, two_at_once, prefaulted_all, prefaulted_background, prefaulted_two_at_once)")
    List<String> attachSettings;

    @Option(names = "--server-pool-dir", description = "where the pegaflow-server of the run keeps its pool file (default /dev/shm;"
            + " a huge-page mount is the placement docs/gpu.md recommends for GPU hosts)")
    Path serverPoolDir;

    @Option(names = "--server-busy-poll-us", defaultValue = "0",
            description = "pegaflow-server --busy-poll-us for the run's server (default ${DEFAULT-VALUE}: off)")
    long serverBusyPollUs;

    @Option(names = "--attach-huge-dir", description = "a directory on a huge-page mount (tmpfs huge=always, or hugetlbfs):"
            + " the pre-faulted attach settings are measured there too (huge_prefaulted_all, huge_prefaulted_two_at_once)")
    Path attachHugeDir;

    @Option(names = "--bounce-mib", split = ",", description = "bounce buffers (MiB per lane, or MiB x slots, e.g. 64x4) to "
            + "measure the copy engine alone with besides the default and 0 (off): engine_bounce_<MiB>mib[_<slots>slots]_* keys")
    List<String> bounceMib = new ArrayList<>();

    @Option(names = "--cases", defaultValue = "all", description = "all, or attach (the attach settings alone)")
    String cases;

    @Option(names = "--json", defaultValue = "out/paths.json")
    Path json;

    private boolean cuda;
    private long blockBytes;
    private final Map<String, Object> report = new LinkedHashMap<>();
    /** Per-operation seconds, in order, of the cases whose first operation is judged. */
    private final Map<String, double[]> each = new LinkedHashMap<>();

    @Override
    public Integer call() throws Exception {
        cuda = switch (copy) {
            case "cuda" -> true;
            case "host" -> false;
            default -> throw new IllegalArgumentException("--copy " + copy + "; expected cuda or host");
        };
        if (blocks < 1 || smallBlocks < 1 || restoreBlocks < 1 || 2 * Math.max(blocks, restoreBlocks) > cacheBlocks) {
            throw new IllegalArgumentException("--blocks " + blocks + ", --small-blocks " + smallBlocks + ", --restore-blocks "
                    + restoreBlocks + " with --cache-blocks " + cacheBlocks + "; expected >= 1 each and twice the largest <= the cache");
        }
        blockBytes = 2L * layers * pieceBytes;
        // Room for four large operations and the restore prefix: later saves evict earlier
        // blocks, as they do in a full pool, and eviction is part of what is timed.
        long need = poolSize != null ? Sizes.parse(poolSize)
                : 4L * blocks * blockBytes + (long) restoreBlocks * blockBytes + (1L << 30);
        report.put("copy", copy);
        report.put("layers", layers);
        report.put("piece_bytes", pieceBytes);
        report.put("block_bytes", blockBytes);
        report.put("cache_blocks", cacheBlocks);
        report.put("pool_bytes", need);
        report.put("repeat", repeat);
        report.put("cpus", Runtime.getRuntime().availableProcessors());
        if (!cases.equals("all") && !cases.equals("attach")) {
            throw new IllegalArgumentException("--cases " + cases + "; expected all or attach");
        }
        if (cases.equals("attach")) {
            if (!cuda) {
                throw new IllegalArgumentException("--cases attach needs --copy cuda");
            }
            attach(Sizes.parse(attachPoolSize));
            Json.writeFile(json, report);
            print();
            return 0;
        }
        CudaDevice dev = cuda ? CudaDevice.open(device) : null;
        try (Arena arena = Arena.ofShared()) {
            if (dev != null) {
                report.put("gpu", dev.name());
                report.put("driver_version", CudaDriver.driverVersion());
            }
            Kv kv = Kv.allocate(dev, arena, layers, pieceBytes, cacheBlocks);
            Function<HostPool, TransferEngine> transfer = cuda
                    ? p -> CudaTransferEngine.create(p, CudaOptions.defaults().withDevice(device))
                    : p -> new HostTransferEngine(p, 2);
            engineAlone(kv, need, transfer, "engine");
            if (cuda) {
                report.put("engine_bounce_bytes", CudaOptions.defaults().bounceBytes());
                report.put("engine_bounce_slots", CudaOptions.defaults().bounceSlots());
                // the same without the bounce path: the kernel reads and writes the pool over PCIe itself
                engineAlone(kv, need, p -> CudaTransferEngine.create(p, CudaOptions.defaults().withDevice(device).withBounce(0)),
                        "engine_direct");
                for (String b : bounceMib) {
                    String[] parts = b.split("x");
                    long mib = Long.parseLong(parts[0]);
                    CudaOptions o = CudaOptions.defaults().withDevice(device);
                    o = parts.length > 1 ? o.withBounce(mib << 20, Integer.parseInt(parts[1])) : o.withBounce(mib << 20);
                    CudaOptions chosen = o;
                    engineAlone(kv, need, p -> CudaTransferEngine.create(p, chosen),
                            "engine_bounce_" + mib + "mib" + (parts.length > 1 ? "_" + parts[1] + "slots" : ""));
                }
                crossLayerEngines(dev, arena);
            }
            try (io.pegaflow.engine.LocalStore store = new io.pegaflow.engine.LocalStore(
                    EngineConfig.builder().poolBytes(need).build(), need)) {
                controlPlane("embedded", store);
            }
            try (PegaEngine embedded = PegaEngine.create(EngineConfig.builder().poolBytes(need).transfer(transfer).prefault(true).build())) {
                cases("embedded", embedded, kv, false);
            }
            try (ServerProcess server = ServerProcess.start(javaLauncher, need, serverPoolDir, serverBusyPollUs)) {
                report.put("server_start_s", server.startSeconds);
                report.put("server_busy_poll_us", serverBusyPollUs);
                report.put("server_pool_pages", HostPool.Pages.of(server.poolPath).describe());
                try (io.pegaflow.client.RemoteStore store = io.pegaflow.client.RemoteStore.connect(server.endpoint, 30_000)) {
                    controlPlane("server", store);
                }
                long t0 = System.nanoTime();
                // the worker's copy engine, its batches' submit and completion times recorded for the timelines below
                Function<HostPool, TransferEngine> timed = p -> new TimedTransfer(transfer.apply(p), timeline);
                try (PegaEngine attached = attachTimed(server.endpoint, timed)) {
                    report.put("server_attach_s", (System.nanoTime() - t0) / 1e9);
                    cases("server", attached, kv, true);
                    crossLayer(attached, dev, arena);
                    kv.free();
                    if (tp2Wanted()) {
                        try {
                            tp2(attached, server);
                        } catch (Exception e) {
                            // the other figures of the run are still reported; the run fails (tp2_verified)
                            report.put("tp2_error", String.valueOf(e));
                            report.put("tp2_verified", false);
                            System.err.println("paths: the two-GPU case failed: " + e);
                        }
                    }
                }
            }
            if (cuda && Sizes.parse(attachPoolSize) > 0) {
                try {
                    attach(Sizes.parse(attachPoolSize));
                } catch (Exception e) {
                    report.put("attach_error", String.valueOf(e));
                    System.err.println("paths: the attach case failed: " + e);
                }
            }
        } finally {
            if (dev != null) {
                dev.close();
            }
        }
        derive();
        Json.writeFile(json, report);
        print();
        return Boolean.TRUE.equals(report.get("verified")) ? 0 : 1;
    }

    // ------------------------------------------------------------------ the cases

    /** Save then load of `blocks` and `smallBlocks`, and the restore, through one engine. */
    private void cases(String name, PegaEngine engine, Kv kv, boolean recordFirst) {
        String instance = name + "-" + ProcessHandle.current().pid();
        engine.registerInstance(new InstanceSpec(instance, "paths-" + name + "-" + layers + "x" + pieceBytes, 1, 1));
        engine.registerWorker(instance, new WorkerSpec(0, 0, cuda ? device : -1, kv.regions()));
        Ids ids = new Ids(cacheBlocks, 11);
        boolean ok = true;
        for (int n : new int[] {blocks, smallBlocks}) {
            String suffix = n == blocks ? "" : "_" + n;
            double[] save = new double[repeat];
            double[] load = new double[repeat];
            String[] saveLines = new String[repeat];
            String[] loadLines = new String[repeat];
            for (int r = 0; r < repeat; r++) {
                long[] src = ids.take(n);
                long[] dst = ids.take(n);
                BlockHashes h = hashes(n, name.hashCode() * 1000L + r * 7L + n);
                kv.fill(src, r);
                timeline.clear();
                long t0 = System.nanoTime();
                CopyResult saved = engine.save(instance, 0, src, h).join();
                save[r] = (System.nanoTime() - t0) / 1e9;
                saveLines[r] = timeline.since(t0, System.nanoTime());
                ok &= saved.blocks() == n;
                kv.clear(dst);
                // the worker path: its share of a lease the scheduler took (the restore below times both)
                QueryResult q = engine.query(instance, h);
                timeline.clear();
                t0 = System.nanoTime();
                engine.load(instance, 0, q.lease(), dst).join();
                load[r] = (System.nanoTime() - t0) / 1e9;
                loadLines[r] = timeline.since(t0, System.nanoTime());
                ok &= q.hitBlocks() == n && kv.check(dst, r);
            }
            if (recordFirst && n == blocks) {
                report.put(name + "_first_save_s", save[0]);
                report.put(name + "_first_load_s", load[0]);
                each.put(name + "_save", save);
                each.put(name + "_load", load);
                report.put(name + "_save_s_each", round(save));
                report.put(name + "_load_s_each", round(load));
            }
            if (name.equals("server")) {
                // where the time of the median operation went: each batch's submit and copy end, then the caller's
                // return, in µs from the call (submit@, done@ per batch; end@)
                report.put("server_timeline_save_us" + suffix, saveLines[medianIndex(save)]);
                report.put("server_timeline_load_us" + suffix, loadLines[medianIndex(load)]);
                // and of the first (first_op_ratio)
                report.put("server_timeline_first_save_us" + suffix, saveLines[0]);
                report.put("server_timeline_first_load_us" + suffix, loadLines[0]);
            }
            report.put(name + "_save_gbps" + suffix, n * blockBytes / median(save) / 1e9);
            report.put(name + "_load_gbps" + suffix, n * blockBytes / median(load) / 1e9);
            report.put(name + "_save_ms" + suffix, median(save) * 1e3);
            report.put(name + "_load_ms" + suffix, median(load) * 1e3);
        }
        // Restore: a saved prefix, then query + load into other blocks, timed together.
        long[] src = ids.take(restoreBlocks);
        BlockHashes h = hashes(restoreBlocks, name.hashCode() * 31L + 5);
        kv.fill(src, 99);
        engine.save(instance, 0, src, h).join();
        double[] restore = new double[repeat];
        for (int r = 0; r < repeat; r++) {
            long[] dst = ids.take(restoreBlocks);
            long t0 = System.nanoTime();
            QueryResult q = engine.query(instance, h);
            engine.load(instance, 0, q.lease(), dst).join();
            restore[r] = (System.nanoTime() - t0) / 1e9;
            ok &= q.hitBlocks() == restoreBlocks && kv.check(dst, 99);
        }
        report.put(name + "_restore_" + restoreBlocks + "_ms_p50", median(restore) * 1e3);
        engine.unregisterInstance(instance);
        report.put(name + "_verified", ok);
    }

    /**
     * The control plane alone, per call, on the same geometry (regions that are never read):
     * a save's plan and end, a query, a load's plan and end, for the large and the small
     * operation. In server mode each is a round trip to the server process.
     */
    private void controlPlane(String name, io.pegaflow.engine.BlockStore store) {
        String instance = name + "-control-" + ProcessHandle.current().pid();
        store.registerInstance(new InstanceSpec(instance, "paths-control-" + layers + "x" + pieceBytes, 1, 1));
        List<LayerRegion> regions = new ArrayList<>();
        long layerBytes = 2L * cacheBlocks * pieceBytes;
        for (int l = 0; l < layers; l++) {
            regions.add(new LayerRegion(String.format(Locale.ROOT, "layers.%03d", l), KvLayout.SPLIT_KV,
                    (1L << 44) + l * layerBytes, layerBytes, cacheBlocks, pieceBytes, pieceBytes, (long) cacheBlocks * pieceBytes));
        }
        store.registerWorker(instance, new WorkerSpec(0, 0, -1, regions));
        Ids ids = new Ids(cacheBlocks, 23);
        for (int n : new int[] {blocks, smallBlocks}) {
            String suffix = n == blocks ? "" : "_" + n;
            int rounds = Math.max(repeat, 15);
            double[][] t = new double[5][rounds];
            for (int r = -3; r < rounds; r++) { // three untimed rounds: the client's paths compiled
                BlockHashes h = hashes(n, 900_000L + n * 100L + r);
                long t0 = System.nanoTime();
                io.pegaflow.engine.CopyPlan save = store.reserveSave(instance, 0, null, ids.take(n), h);
                long t1 = System.nanoTime();
                store.endCopy(instance, save.id(), true, n * blockBytes, 1);
                long t2 = System.nanoTime();
                QueryResult q = store.query(instance, h);
                long t3 = System.nanoTime();
                io.pegaflow.engine.CopyPlan load = store.beginLoad(instance, 0, q.lease(), ids.take(n));
                long t4 = System.nanoTime();
                store.endCopy(instance, load.id(), true, n * blockBytes, 1);
                long t5 = System.nanoTime();
                if (r >= 0) {
                    long[] at = {t0, t1, t2, t3, t4, t5};
                    for (int k = 0; k < 5; k++) {
                        t[k][r] = (at[k + 1] - at[k]) / 1e6;
                    }
                }
            }
            String[] keys = {"reserve_save", "end_save", "query", "begin_load", "end_load"};
            for (int k = 0; k < 5; k++) {
                report.put(name + "_control_" + keys[k] + "_ms" + suffix, median(t[k]));
            }
        }
        store.unregisterInstance(instance);
    }

    /** The same bytes as one tensor whose blocks hold every layer back to back: one run per block. */
    private void crossLayer(PegaEngine engine, CudaDevice dev, Arena arena) {
        Kv one = Kv.allocateCrossLayer(dev, arena, blockBytes, cacheBlocks);
        String instance = "crosslayer-" + ProcessHandle.current().pid();
        engine.registerInstance(new InstanceSpec(instance, "paths-crosslayer-" + blockBytes, 1, 1));
        engine.registerWorker(instance, new WorkerSpec(0, 0, cuda ? device : -1, one.regions()));
        Ids ids = new Ids(cacheBlocks, 13);
        double[] save = new double[repeat];
        double[] load = new double[repeat];
        boolean ok = true;
        for (int r = 0; r < repeat; r++) {
            long[] src = ids.take(blocks);
            long[] dst = ids.take(blocks);
            BlockHashes h = hashes(blocks, 777_000L + r);
            one.fill(src, r);
            long t0 = System.nanoTime();
            engine.save(instance, 0, src, h).join();
            save[r] = (System.nanoTime() - t0) / 1e9;
            one.clear(dst);
            QueryResult q = engine.query(instance, h);
            t0 = System.nanoTime();
            engine.load(instance, 0, q.lease(), dst).join();
            load[r] = (System.nanoTime() - t0) / 1e9;
            ok &= q.hitBlocks() == blocks && one.check(dst, r);
        }
        engine.unregisterInstance(instance);
        report.put("crosslayer_save_gbps", blocks * blockBytes / median(save) / 1e9);
        report.put("crosslayer_load_gbps", blocks * blockBytes / median(load) / 1e9);
        report.put("crosslayer_verified", ok);
        one.free();
    }

    /** The copy engine alone on prepared batches, its figures under {@code key}{@code _save_gbps} etc.; the line with the first. */
    private void engineAlone(Kv kv, long poolBytes, Function<HostPool, TransferEngine> transfer, String key) {
        long bytes = blocks * blockBytes;
        try (HostPool pool = HostPool.anonymous(Math.max(bytes, poolBytes / 4) + (64L << 20));
                TransferEngine engine = transfer.apply(pool)) {
            Ids ids = new Ids(cacheBlocks, 17);
            long[] src = ids.take(blocks);
            long[] dst = ids.take(blocks);
            if (engine instanceof CudaTransferEngine c) {
                c.awaitFullyPinned(); // the line below copies without the engine's own pinning check
            }
            double[] t = timeBatches(engine, kv.batch(CopyBatch.Direction.TO_HOST, src),
                    kv.batch(CopyBatch.Direction.TO_DEVICE, dst));
            report.put(key + "_save_gbps", bytes / t[0] / 1e9);
            report.put(key + "_load_gbps", bytes / t[1] / 1e9);
            report.put(key + "_save_ms", t[0] * 1e3);
            report.put(key + "_load_ms", t[1] * 1e3);
            long smallBytes = smallBlocks * blockBytes;
            double[] small = timeBatches(engine, kv.batch(CopyBatch.Direction.TO_HOST, ids.take(smallBlocks)),
                    kv.batch(CopyBatch.Direction.TO_DEVICE, ids.take(smallBlocks)));
            report.put(key + "_save_gbps_" + smallBlocks, smallBytes / small[0] / 1e9);
            report.put(key + "_load_gbps_" + smallBlocks, smallBytes / small[1] / 1e9);
            report.put(key + "_save_ms_" + smallBlocks, small[0] * 1e3);
            report.put(key + "_load_ms_" + smallBlocks, small[1] * 1e3);
            if (engine instanceof CudaTransferEngine c && key.equals("engine")) {
                long lineBytes = Math.min(2L << 30, pool.size());
                double[] line = lineSeconds(c, pool, lineBytes, repeat);
                report.put("line_bytes", lineBytes);
                report.put("line_h2d_gbps", lineBytes / line[0] / 1e9);
                report.put("line_d2h_gbps", lineBytes / line[1] / 1e9);
            }
        }
    }

    /**
     * The cross-layer batch (one 2 MiB run per block) on the copy engine alone, through the
     * copy engine's DMA (one cuMemcpyAsync per run; all of them in cuMemcpyBatchAsync calls,
     * the default for runs of 1 MiB and more) and through the gather kernel: which one the
     * runs should take.
     */
    private void crossLayerEngines(CudaDevice dev, Arena arena) {
        Kv one = Kv.allocateCrossLayer(dev, arena, blockBytes, cacheBlocks);
        try {
            CudaOptions base = CudaOptions.defaults().withDevice(device);
            Map<String, CudaOptions> modes = new java.util.LinkedHashMap<>();
            modes.put("dma", base.withDmaThreshold(1L << 20).withDmaBatch(false)); // one cuMemcpyAsync per run
            modes.put("batch", base.withDmaThreshold(1L << 20).withDmaBatch(true)); // cuMemcpyBatchAsync
            modes.put("kernel", base.withDmaThreshold(1L << 30).withBounce(0)); // the kernel over PCIe
            for (var mode : modes.entrySet()) {
                try (HostPool pool = HostPool.anonymous(blocks * blockBytes + (64L << 20));
                        CudaTransferEngine engine = CudaTransferEngine.create(pool, mode.getValue())) {
                    if (mode.getKey().equals("batch")) {
                        report.put("engine_dma_batched", engine.dmaBatched());
                    }
                    Ids ids = new Ids(cacheBlocks, 19);
                    double[] t = timeBatches(engine, one.batch(CopyBatch.Direction.TO_HOST, ids.take(blocks)),
                            one.batch(CopyBatch.Direction.TO_DEVICE, ids.take(blocks)));
                    report.put("engine_crosslayer_" + mode.getKey() + "_save_gbps", blocks * blockBytes / t[0] / 1e9);
                    report.put("engine_crosslayer_" + mode.getKey() + "_load_gbps", blocks * blockBytes / t[1] / 1e9);
                }
            }
        } finally {
            one.free();
        }
    }

    /** Median seconds of {@code save} and of {@code load} on the engine alone, after one untimed round of each. */
    private double[] timeBatches(TransferEngine engine, CopyBatch save, CopyBatch load) {
        double[] s = new double[repeat];
        double[] l = new double[repeat];
        engine.submit(save).join(); // the kernel's first launch and the lanes' buffers
        engine.submit(load).join();
        for (int r = 0; r < repeat; r++) {
            long t0 = System.nanoTime();
            engine.submit(save).join();
            s[r] = (System.nanoTime() - t0) / 1e9;
            t0 = System.nanoTime();
            engine.submit(load).join();
            l[r] = (System.nanoTime() - t0) / 1e9;
        }
        return new double[] {median(s), median(l)};
    }

    /**
     * The PCIe line: one large contiguous pinned copy of {@code bytes} each way, one
     * cuMemcpyAsync per pinned chunk (a copy may not span two), median of {@code repeat}
     * after one untimed round. Returns seconds {h2d, d2h}. Also used by {@code transfer}.
     */
    static double[] lineSeconds(CudaTransferEngine copies, HostPool pool, long bytes, int repeat) {
        long gpu = CudaDriver.memAlloc(bytes);
        long stream = CudaDriver.streamCreate(CudaDriver.CU_STREAM_NON_BLOCKING);
        try {
            double[] h2d = new double[repeat];
            double[] d2h = new double[repeat];
            for (int r = -1; r < repeat; r++) {
                long t0 = System.nanoTime();
                for (long off = 0; off < bytes; off += copies.bytesToChunkEnd(pool.address() + off)) {
                    long len = Math.min(bytes - off, copies.bytesToChunkEnd(pool.address() + off));
                    CudaDriver.memcpyHtoDAsync(gpu + off, pool.address() + off, len, stream);
                }
                CudaDriver.streamSynchronize(stream);
                long t1 = System.nanoTime();
                for (long off = 0; off < bytes; off += copies.bytesToChunkEnd(pool.address() + off)) {
                    long len = Math.min(bytes - off, copies.bytesToChunkEnd(pool.address() + off));
                    CudaDriver.memcpyDtoHAsync(pool.address() + off, gpu + off, len, stream);
                }
                CudaDriver.streamSynchronize(stream);
                if (r >= 0) {
                    h2d[r] = (t1 - t0) / 1e9;
                    d2h[r] = (System.nanoTime() - t1) / 1e9;
                }
            }
            return new double[] {median(h2d), median(d2h)};
        } finally {
            CudaDriver.streamDestroy(stream);
            CudaDriver.memFree(gpu);
        }
    }

    private boolean tp2Wanted() {
        return switch (tp2) {
            case "on" -> true;
            case "off" -> false;
            case "auto" -> cuda && CudaDriver.deviceCount() >= 2;
            default -> throw new IllegalArgumentException("--tp2 " + tp2 + "; expected auto, on or off");
        };
    }

    /** This JVM's launcher and class path running a bench subcommand, with extra JVM options first. */
    private List<String> benchProcess(List<String> jvmOptions, String... args) {
        List<String> cmd = new ArrayList<>();
        cmd.add(javaLauncher != null ? javaLauncher : ProcessHandle.current().info().command().orElse("java"));
        cmd.add("--enable-native-access=ALL-UNNAMED");
        cmd.addAll(jvmOptions);
        cmd.addAll(List.of("-cp", System.getProperty("java.class.path"), "io.pegaflow.bench.BenchMain"));
        cmd.addAll(List.of(args));
        return cmd;
    }

    /**
     * Two worker processes, one per GPU, as the TP ranks 0 and 1 of one instance, save their
     * slots of the same blocks at once, then load their shares of one lease: aggregate GB/s
     * against the single-worker server figure of this run.
     */
    private void tp2(PegaEngine parent, ServerProcess server) throws IOException, InterruptedException {
        String instance = "tp2-" + ProcessHandle.current().pid();
        parent.registerInstance(new InstanceSpec(instance, "paths-tp2-" + layers + "x" + pieceBytes, 2, 2));
        List<Worker> workers = new ArrayList<>();
        try {
            for (int r = 0; r < 2; r++) {
                ProcessBuilder child = new ProcessBuilder(benchProcess(List.of(), "paths-worker", "--endpoint", server.endpoint,
                        "--instance", instance, "--rank", Integer.toString(r), "--copy", copy,
                        "--device", Integer.toString(cuda ? r : 0), "--layers", Integer.toString(layers),
                        "--piece-bytes", Integer.toString(pieceBytes), "--cache-blocks", Integer.toString(cacheBlocks)))
                        .redirectError(ProcessBuilder.Redirect.INHERIT);
                // the ranks act for the instance this process registered, as a vLLM launch's processes do
                child.environment().put(JOIN_SECRET_ENV, new String(joinSecret, StandardCharsets.UTF_8));
                workers.add(new Worker(child.start()));
            }
            for (Worker w : workers) {
                w.await("ready");
            }
            if (!parent.isSealed(instance)) {
                throw new IllegalStateException("instance " + instance + " is not sealed after both ranks registered");
            }
            double[] save = new double[repeat];
            double[] load = new double[repeat];
            boolean ok = true;
            for (int r = 0; r < repeat; r++) {
                long seed = 5000 + r;
                long t0 = System.nanoTime();
                for (Worker w : workers) {
                    w.send("save " + seed + " " + blocks);
                }
                for (Worker w : workers) {
                    ok &= w.await("ok").endsWith("true");
                }
                save[r] = (System.nanoTime() - t0) / 1e9;
                QueryResult q = parent.query(instance, hashes(blocks, seed));
                ok &= q.hitBlocks() == blocks;
                String lease = java.util.HexFormat.of().formatHex(q.lease().toBytes());
                t0 = System.nanoTime();
                for (Worker w : workers) {
                    w.send("load " + lease + " " + seed + " " + blocks);
                }
                for (Worker w : workers) {
                    ok &= w.await("ok").endsWith("true");
                }
                load[r] = (System.nanoTime() - t0) / 1e9;
            }
            double saveGbps = 2 * blocks * blockBytes / median(save) / 1e9;
            double loadGbps = 2 * blocks * blockBytes / median(load) / 1e9;
            report.put("tp2_save_gbps", saveGbps);
            report.put("tp2_load_gbps", loadGbps);
            report.put("tp2_verified", ok);
            report.put("tp2_aggregate_ratio", Math.min(saveGbps / (Double) report.get("server_save_gbps"),
                    loadGbps / (Double) report.get("server_load_gbps")));
            if (cuda) {
                twoGpuLine();
            }
        } finally {
            for (Worker w : workers) {
                w.close();
            }
            try {
                parent.unregisterInstance(instance);
            } catch (RuntimeException e) {
                System.err.println("paths: unregistering " + instance + ": " + e); // do not hide the case's own failure
            }
        }
    }

    /**
     * The line with both GPUs at once: each copies 1 GiB between its own pinned host buffer and
     * its memory, both directions in turn, started together; the aggregate is what the two-GPU
     * case can reach on this machine (both GPUs may share a PCIe uplink).
     */
    private void twoGpuLine() throws InterruptedException {
        long bytes = 1L << 30;
        double[][] gbps = new double[2][repeat];
        for (int dir = 0; dir < 2; dir++) {
            for (int r = 0; r < repeat; r++) {
                java.util.concurrent.CyclicBarrier go = new java.util.concurrent.CyclicBarrier(2);
                long[] end = new long[2];
                long[] start = new long[2];
                int d = dir;
                Thread[] ts = new Thread[2];
                for (int g = 0; g < 2; g++) {
                    int gpu = g;
                    ts[g] = Thread.ofPlatform().start(() -> {
                        try (CudaDevice dev = CudaDevice.open(gpu)) {
                            dev.makeCurrent();
                            long host = CudaDriver.memAllocHost(bytes);
                            long mem = CudaDriver.memAlloc(bytes);
                            long stream = CudaDriver.streamCreate(CudaDriver.CU_STREAM_NON_BLOCKING);
                            try {
                                go.await();
                                start[gpu] = System.nanoTime();
                                if (d == 0) {
                                    CudaDriver.memcpyHtoDAsync(mem, host, bytes, stream);
                                } else {
                                    CudaDriver.memcpyDtoHAsync(host, mem, bytes, stream);
                                }
                                CudaDriver.streamSynchronize(stream);
                                end[gpu] = System.nanoTime();
                            } finally {
                                CudaDriver.streamDestroy(stream);
                                CudaDriver.memFree(mem);
                                CudaDriver.memFreeHost(host);
                            }
                        } catch (Exception e) {
                            throw new IllegalStateException(e);
                        }
                    });
                }
                for (Thread t : ts) {
                    t.join();
                }
                gbps[dir][r] = 2.0 * bytes / ((Math.max(end[0], end[1]) - Math.min(start[0], start[1])) / 1e9) / 1e9;
            }
        }
        report.put("tp2_line_h2d_gbps", median(gbps[0]));
        report.put("tp2_line_d2h_gbps", median(gbps[1]));
    }

    /** A paths-worker child and its command lines. */
    private static final class Worker implements AutoCloseable {
        final Process process;
        final BufferedReader out;
        final java.io.PrintStream in;

        Worker(Process process) {
            this.process = process;
            this.out = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
            this.in = new java.io.PrintStream(process.getOutputStream(), true, StandardCharsets.UTF_8);
        }

        void send(String line) {
            in.println(line);
        }

        /** The next line starting with {@code word} (other output is passed through). */
        String await(String word) throws IOException {
            String line;
            while ((line = out.readLine()) != null) {
                if (line.startsWith(word)) {
                    return line;
                }
                System.err.println("[worker] " + line);
            }
            throw new IOException("paths-worker exited (status " + process.exitValue() + ") before answering '" + word + "'");
        }

        @Override
        public void close() throws InterruptedException {
            in.println("quit");
            if (!process.waitFor(30, TimeUnit.SECONDS)) {
                process.destroyForcibly();
            }
        }
    }

    /**
     * Attach of a shared pool of {@code bytes} by a worker process (map + pin), created fresh
     * for each setting: 4 KiB pages pinned on one thread (the old attach), on
     * {@code --attach-threads}, with transparent huge pages asked for on the mapping, the pool
     * pre-faulted by its creator first, and two workers attaching at once.
     */
    private void attach(long bytes) throws IOException, InterruptedException {
        report.put("attach_pool_bytes", bytes);
        report.put("shmem_enabled", HostPool.shmemHugePages());
        int devices = CudaDriver.deviceCount();
        // prefault: the creator commits the pages first (pegaflow-server --prefault-threads);
        // same pool: this setting measures on the previous setting's pool, whose pages exist
        // background: the first chunk pinned at creation, the rest behind it (the default)
        // huge: the pool on --attach-huge-dir (huge pages) instead of /dev/shm (4 KiB pages)
        record Setting(String name, boolean thp, boolean background, boolean prefault, int workers, boolean samePool,
                boolean huge) {}
        List<Setting> settings = new ArrayList<>(List.of(new Setting("4k_all", false, false, false, 1, false, false),
                new Setting("thp_all", true, false, false, 1, false, false),
                new Setting("background", true, true, false, 1, false, false),
                new Setting("two_at_once", true, true, false, 2, false, false),
                new Setting("prefaulted_all", true, false, true, 1, false, false),
                new Setting("prefaulted_background", true, true, false, 1, true, false),
                new Setting("prefaulted_two_at_once", true, true, false, 2, true, false)));
        if (attachHugeDir != null) {
            settings.add(new Setting("huge_prefaulted_all", true, false, true, 1, false, true));
            settings.add(new Setting("huge_prefaulted_two_at_once", true, false, false, 2, true, true));
        }
        if (!attachSettings.contains("all")) {
            List<String> known = settings.stream().map(Setting::name).toList();
            for (String n : attachSettings) {
                if (!known.contains(n)) {
                    throw new IllegalArgumentException("--attach-settings " + n + "; expected all or some of " + known);
                }
            }
            settings = new ArrayList<>(settings.stream().filter(st -> attachSettings.contains(st.name())
                    || st.huge() && attachSettings.contains(st.name().substring("huge_".length()))).toList());
        }
        Path shm = Path.of(Files.isDirectory(Path.of("/dev/shm")) ? "/dev/shm" : System.getProperty("java.io.tmpdir"),
                "pegaflow-attach-" + ProcessHandle.current().pid() + ".pool");
        HostPool pool = null;
        try {
            for (Setting st : settings) {
                System.setProperty("pegaflow.pool.thp", Boolean.toString(st.thp()));
                Path path = st.huge() ? attachHugeDir.resolve(shm.getFileName()) : shm;
                if (st.huge() && !st.samePool()) {
                    report.put("attach_huge_pages", HostPool.Pages.of(path).describe());
                }
                if (!st.samePool() || pool == null || !pool.file().equals(path)) {
                    if (pool != null) {
                        pool.close();
                    }
                    pool = HostPool.createShared(path, bytes, null);
                }
                if (st.prefault()) {
                    report.put("attach_prefault_s", pool.prefault(prefaultThreads) / 1e9);
                }
                List<Process> ps = new ArrayList<>();
                for (int w = 0; w < st.workers(); w++) {
                    ps.add(new ProcessBuilder(benchProcess(List.of("-Dpegaflow.pool.thp=" + st.thp()), "attach",
                            "--pool-path", path.toString(), "--pool-bytes", Long.toString(bytes),
                            "--device", Integer.toString(w % devices), st.background() ? "--pin-in-background" : "--no-pin-in-background"))
                            .redirectError(ProcessBuilder.Redirect.INHERIT).start());
                }
                double ready = 0;
                double all = 0;
                for (Process p : ps) {
                    String line = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8).lines()
                            .filter(l -> l.startsWith("attach ")).findFirst()
                            .orElseThrow(() -> new IOException("attach child printed no result (status " + p.exitValue() + ")"));
                    p.waitFor();
                    String[] f = line.split(" ");
                    ready = Math.max(ready, Double.parseDouble(f[3]));
                    all = Math.max(all, Double.parseDouble(f[4]));
                }
                report.put("attach_" + st.name() + "_s", ready);
                report.put("attach_" + st.name() + "_pinned_s", all);
            }
        } finally {
            System.clearProperty("pegaflow.pool.thp");
            if (pool != null) {
                pool.close();
            }
        }
        // What a worker waits for against a server that pre-faulted its pool (--prefault-threads,
        // the recommended setting for GPU hosts), two workers at once included.
        // On a huge-page mount where one was given (the recommended setting for GPU hosts).
        for (String prefix : new String[] {"attach_prefaulted_", "attach_huge_prefaulted_"}) {
            if (report.get(prefix + "all_s") instanceof Double one && report.get(prefix + "two_at_once_s") instanceof Double two) {
                report.put("attach_60gb_s", Math.max(one, two));
                report.put("attach_60gb_s_setting", prefix.contains("huge") ? "huge pages: " + report.get("attach_huge_pages")
                        : "4 KiB pages, pre-faulted by the server");
            }
        }
    }

    /** Ratios the acceptance reads, computed from the figures of this run. */
    private void derive() {
        boolean ok = true;
        for (String k : new String[] {"embedded_verified", "server_verified", "crosslayer_verified", "tp2_verified"}) {
            ok &= !report.containsKey(k) || Boolean.TRUE.equals(report.get(k));
        }
        report.put("verified", ok);
        ratio("server_save_of_engine", "server_save_gbps", "engine_save_gbps");
        ratio("server_load_of_engine", "server_load_gbps", "engine_load_gbps");
        double[] s = each.get("server_save");
        double[] l = each.get("server_load");
        if (s != null && s.length > 1) {
            // the first save against the median of the later ones, and the same for loads: the worse
            double saveRatio = s[0] / median(Arrays.copyOfRange(s, 1, s.length));
            double loadRatio = l[0] / median(Arrays.copyOfRange(l, 1, l.length));
            report.put("first_op_ratio", Math.max(saveRatio, loadRatio));
        }
        report.put("restore_10k_ms_p50", report.get("server_restore_" + restoreBlocks + "_ms_p50"));
        // Control-plane cost per operation: the path's time minus the copy engine's on the same bytes.
        for (String path : new String[] {"embedded", "server"}) {
            for (String dir : new String[] {"save", "load"}) {
                Object p = report.get(path + "_" + dir + "_ms");
                Object e = report.get("engine_" + dir + "_ms");
                if (p instanceof Double pm && e instanceof Double em) {
                    report.put(path + "_" + dir + "_overhead_ms", pm - em);
                }
            }
        }
    }

    private void ratio(String key, String num, String den) {
        if (report.get(num) instanceof Double n && report.get(den) instanceof Double d && d > 0) {
            report.put(key, n / d);
        }
    }

    private void print() {
        StringBuilder sb = new StringBuilder();
        for (var e : report.entrySet()) {
            if (e.getValue() instanceof List<?>) {
                continue;
            }
            Object v = e.getValue();
            sb.append(String.format(Locale.ROOT, "  %-32s %s%n", e.getKey(),
                    v instanceof Double d ? String.format(Locale.ROOT, "%.3f", d) : v));
        }
        System.out.print(sb);
        System.out.println("  report: " + json);
    }

    // ------------------------------------------------------------------ helpers

    static BlockHashes hashes(int n, long seed) {
        byte[] packed = new byte[n * 32];
        new Random(seed).nextBytes(packed);
        return new BlockHashes(packed, 32);
    }

    static double median(double[] t) {
        double[] s = t.clone();
        Arrays.sort(s);
        return s[s.length / 2];
    }

    private static List<Double> round(double[] t) {
        List<Double> out = new ArrayList<>();
        for (double v : t) {
            out.add(Math.round(v * 1e6) / 1e6);
        }
        return out;
    }

    /** The environment variable a vLLM launch's processes share their join secret through. */
    static final String JOIN_SECRET_ENV = "PEGAFLOW_JOIN_SECRET";

    /**
     * The join secret this run's server clients present, its worker processes too: the
     * inherited {@code $PEGAFLOW_JOIN_SECRET}, else one drawn for the run.
     */
    private final byte[] joinSecret = joinSecret();

    static byte[] joinSecret() {
        String s = System.getenv(JOIN_SECRET_ENV);
        if (s != null && !s.isEmpty()) {
            return s.getBytes(StandardCharsets.UTF_8);
        }
        byte[] raw = new byte[16];
        new java.security.SecureRandom().nextBytes(raw);
        return java.util.HexFormat.of().formatHex(raw).getBytes(StandardCharsets.UTF_8);
    }

    /** Scattered block ids of the cache, handed out in a shuffled cycle. */
    private final Timeline timeline = new Timeline();

    /**
     * {@link EngineClient#connect} with the worker's calls to the server timed into the
     * timeline too (each copy-plan call's start and return, by name).
     */
    private PegaEngine attachTimed(String endpoint, Function<HostPool, TransferEngine> transfer) {
        return EngineClient.open(io.pegaflow.client.RemoteStore.connect(endpoint, 30_000, true, joinSecret), transfer,
                store -> (io.pegaflow.engine.BlockStore) java.lang.reflect.Proxy.newProxyInstance(
                        io.pegaflow.engine.BlockStore.class.getClassLoader(), new Class<?>[] {io.pegaflow.engine.BlockStore.class},
                        (proxy, method, args) -> {
                            boolean copyCall = switch (method.getName()) {
                                case "reserveSave", "beginLoad", "planRest", "endCopy" -> true;
                                default -> false;
                            };
                            if (copyCall) {
                                timeline.add(method.getName(), 0);
                            }
                            try {
                                return method.invoke(store, args);
                            } catch (java.lang.reflect.InvocationTargetException e) {
                                throw e.getCause();
                            } finally {
                                if (copyCall) {
                                    timeline.add("/" + method.getName(), 0);
                                }
                            }
                        })).engine();
    }

    private static int medianIndex(double[] x) {
        Integer[] order = new Integer[x.length];
        for (int i = 0; i < x.length; i++) {
            order[i] = i;
        }
        java.util.Arrays.sort(order, (a, b) -> Double.compare(x[a], x[b]));
        return order[x.length / 2];
    }

    /** Submit and completion times of the worker's batches and its calls to the store (recorded while a timed operation runs). */
    static final class Timeline {
        private record Event(long nanos, String what, long batchBytes) {}

        private final java.util.concurrent.ConcurrentLinkedQueue<Event> events = new java.util.concurrent.ConcurrentLinkedQueue<>();

        void clear() {
            events.clear();
        }

        /** {@code what}: "submit" (a batch of {@code batchBytes}), "done", or a store call's name ("/" before it: returned). */
        void add(String what, long batchBytes) {
            events.add(new Event(System.nanoTime(), what, batchBytes));
        }

        /** e.g. {@code reserveSave 41, /reserveSave 627, submit 697 (32 MiB), done 1587, ..., end 12096} in µs from t0. */
        String since(long t0, long end) {
            StringBuilder b = new StringBuilder();
            events.stream().sorted(java.util.Comparator.comparingLong(Event::nanos)).forEach(e -> b.append(e.what()).append(' ')
                    .append((e.nanos() - t0) / 1000).append(e.what().equals("submit") ? " (" + (e.batchBytes() >> 20) + " MiB)" : "")
                    .append(", "));
            return b.append("end ").append((end - t0) / 1000).toString();
        }
    }

    /** A copy engine that records when each batch is submitted and when its copy completes. */
    record TimedTransfer(TransferEngine delegate, Timeline timeline) implements TransferEngine {
        @Override
        public io.pegaflow.engine.transfer.TransferFuture submit(CopyBatch batch) {
            timeline.add("submit", batch.totalBytes());
            // recorded before anything that waits on the copy runs (the store's end, the caller)
            return io.pegaflow.engine.transfer.TransferFuture.following(delegate.submit(batch), () -> timeline.add("done", 0));
        }

        @Override
        public void checkRegion(LayerRegion region) {
            delegate.checkRegion(region);
        }

        @Override
        public String name() {
            return delegate.name();
        }

        @Override
        public void close() {
            delegate.close();
        }
    }

    static final class Ids {
        private final List<Long> order = new ArrayList<>();
        private int next;

        Ids(int cacheBlocks, long seed) {
            for (long b = 0; b < cacheBlocks; b++) {
                order.add(b);
            }
            Collections.shuffle(order, new Random(seed));
        }

        long[] take(int n) {
            long[] out = new long[n];
            for (int i = 0; i < n; i++) {
                out[i] = order.get(next);
                next = (next + 1) % order.size();
            }
            return out;
        }
    }

    /**
     * A KV cache: per-layer {@code [2, cacheBlocks, piece]} tensors (vLLM's K/V split), or one
     * tensor of whole blocks; in GPU memory ({@code dev} given) or host memory.
     */
    record Kv(CudaDevice dev, MemorySegment scratch, long base, int layers, int segments, long pieceBytes,
            int cacheBlocks) {
        static Kv allocate(CudaDevice dev, Arena arena, int layers, long pieceBytes, int cacheBlocks) {
            long bytes = (long) layers * 2 * cacheBlocks * pieceBytes;
            return make(dev, arena, bytes, layers, 2, pieceBytes, cacheBlocks);
        }

        static Kv allocateCrossLayer(CudaDevice dev, Arena arena, long blockBytes, int cacheBlocks) {
            return make(dev, arena, blockBytes * cacheBlocks, 1, 1, blockBytes, cacheBlocks);
        }

        private static Kv make(CudaDevice dev, Arena arena, long bytes, int layers, int segments, long pieceBytes,
                int cacheBlocks) {
            if (dev != null) {
                dev.makeCurrent();
                return new Kv(dev, arena.allocate(8, 8), CudaDriver.memAlloc(bytes), layers, segments, pieceBytes, cacheBlocks);
            }
            MemorySegment m = arena.allocate(bytes, 4096);
            return new Kv(null, null, m.address(), layers, segments, pieceBytes, cacheBlocks);
        }

        long layerBytes() {
            return segments * cacheBlocks * pieceBytes;
        }

        long address(int layer, int seg, long block) {
            return base + layer * layerBytes() + (seg * cacheBlocks + block) * pieceBytes;
        }

        List<LayerRegion> regions() {
            List<LayerRegion> out = new ArrayList<>();
            for (int l = 0; l < layers; l++) {
                out.add(new LayerRegion(String.format(Locale.ROOT, "layers.%03d", l),
                        segments == 2 ? KvLayout.SPLIT_KV : KvLayout.COMBINED, base + l * layerBytes(), layerBytes(),
                        cacheBlocks, pieceBytes, pieceBytes, segments == 2 ? cacheBlocks * pieceBytes : 0));
            }
            return out;
        }

        /** Block-major pieces, each block's slots contiguous in the pool, as the engine lays them out. */
        CopyBatch batch(CopyBatch.Direction dir, long[] ids) {
            CopyBatch b = new CopyBatch(dir, ids.length * layers * segments);
            long host = 0;
            for (long block : ids) {
                for (int l = 0; l < layers; l++) {
                    for (int s = 0; s < segments; s++) {
                        b.add(address(l, s, block), host, pieceBytes);
                        host += pieceBytes;
                    }
                }
            }
            return b;
        }

        /**
         * The first and last 8 bytes of each piece of a sample of the blocks (about 32, first
         * and last included) hold a value of (position in the list, layer, segment, round): a
         * load into other ids is checked by position, and stale bytes of an earlier round differ.
         */
        void fill(long[] ids, int round) {
            probes(ids, round, (addr, v) -> write(addr, v));
        }

        boolean check(long[] ids, int round) {
            boolean[] ok = {true};
            probes(ids, round, (addr, v) -> ok[0] &= read(addr) == v);
            return ok[0];
        }

        void clear(long[] ids) {
            probes(ids, 0, (addr, v) -> write(addr, 0));
        }

        private interface Probe {
            void at(long address, long value);
        }

        private void probes(long[] ids, int round, Probe p) {
            int step = Math.max(1, ids.length / 32);
            for (int i = 0; i < ids.length; i = i == ids.length - 1 ? ids.length : Math.min(i + step, ids.length - 1)) {
                for (int l = 0; l < layers; l++) {
                    for (int s = 0; s < segments; s++) {
                        long v = ((long) round << 40) ^ ((long) i << 16) ^ (l << 2) ^ s ^ 0x5a5a_0000_0000_0000L;
                        p.at(address(l, s, ids[i]), v);
                        p.at(address(l, s, ids[i]) + pieceBytes - 8, ~v);
                    }
                }
            }
        }

        private void write(long address, long value) {
            if (dev == null) {
                MemorySegment.ofAddress(address).reinterpret(8).set(ValueLayout.JAVA_LONG, 0, value);
            } else {
                scratch.set(ValueLayout.JAVA_LONG, 0, value);
                CudaDriver.memcpyHtoD(address, scratch.address(), 8);
            }
        }

        private long read(long address) {
            if (dev == null) {
                return MemorySegment.ofAddress(address).reinterpret(8).get(ValueLayout.JAVA_LONG, 0);
            }
            CudaDriver.memcpyDtoH(scratch.address(), address, 8);
            return scratch.get(ValueLayout.JAVA_LONG, 0);
        }

        void free() {
            if (dev != null) {
                CudaDriver.memFree(base);
            }
        }
    }

    /** A pegaflow-server in its own process, on a free port, its pool in /dev/shm. */
    static final class ServerProcess implements AutoCloseable {
        final Process process;
        final String endpoint;
        final double startSeconds;
        final Path dir;
        final Path poolPath;

        private ServerProcess(Process process, String endpoint, double startSeconds, Path dir, Path poolPath) {
            this.poolPath = poolPath;
            this.process = process;
            this.endpoint = endpoint;
            this.startSeconds = startSeconds;
            this.dir = dir;
        }

        static ServerProcess start(String javaCmd, long poolBytes, Path poolDir, long busyPollUs)
                throws IOException, InterruptedException {
            String javaBin = javaCmd != null ? javaCmd : ProcessHandle.current().info().command().orElse("java");
            Path dir = Files.createTempDirectory("pegaflow-paths");
            int port;
            try (java.net.ServerSocket s = new java.net.ServerSocket(0)) {
                port = s.getLocalPort();
            }
            int http;
            try (java.net.ServerSocket s = new java.net.ServerSocket(0)) {
                http = s.getLocalPort();
            }
            Path shm = Path.of("/dev/shm");
            Path poolPath = (poolDir != null ? poolDir : Files.isDirectory(shm) ? shm : dir).resolve("pegaflow-paths-" + port + ".pool");
            List<String> cmd = new ArrayList<>(List.of(javaBin, "--enable-native-access=ALL-UNNAMED",
                    "-cp", System.getProperty("java.class.path"), "io.pegaflow.server.ServerMain",
                    "--addr", "127.0.0.1:" + port, "--http-addr", "127.0.0.1:" + http,
                    "--pool-size", Long.toString(poolBytes), "--pool-path", poolPath.toString(),
                    "--busy-poll-us", Long.toString(busyPollUs),
                    "--owner-pid", Long.toString(ProcessHandle.current().pid())));
            long t0 = System.nanoTime();
            Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
            BufferedReader out = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8));
            String line;
            StringBuilder seen = new StringBuilder();
            while ((line = out.readLine()) != null) {
                seen.append(line).append('\n');
                if (line.startsWith("pegaflow-server ") && line.contains(" ready ")) {
                    break;
                }
            }
            if (line == null) {
                throw new IOException("pegaflow-server exited before it listened:\n" + seen);
            }
            double startSeconds = (System.nanoTime() - t0) / 1e9;
            Thread.ofPlatform().daemon().start(() -> out.lines().forEach(l -> System.err.println("[server] " + l)));
            return new ServerProcess(p, "127.0.0.1:" + port, startSeconds, dir, poolPath);
        }

        @Override
        public void close() throws InterruptedException {
            process.destroy();
            if (!process.waitFor(20, TimeUnit.SECONDS)) {
                process.destroyForcibly();
            }
        }
    }
}
