package io.pegaflow.bench;

import io.pegaflow.client.RemoteStore;
import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.store.LocalStore;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.Sizes;
import io.pegaflow.engine.cuda.CudaDevice;
import io.pegaflow.engine.cuda.CudaDriver;
import io.pegaflow.engine.cuda.CudaOptions;
import io.pegaflow.engine.cuda.CudaTransferEngine;
import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.HostTransferEngine;
import io.pegaflow.engine.transfer.TransferEngine;
import java.lang.foreign.Arena;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.Callable;
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
 *
 * <p>This class holds the options, the order of the cases and the report; each case lives in
 * its own class of this package ({@link PathsEngineAlone}, {@link PathsSaveLoad},
 * {@link PathsControlPlane}, {@link PathsCrossLayer}, {@link PathsTp2}, {@link PathsAttach}).
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

    /** From {@code --copy}: the KV cache in GPU memory and CUDA copies, else host memory and memcpy. */
    boolean cuda;
    /** One block of every layer, K and V. */
    long blockBytes;
    /** The figures of the run, in the order they are printed and written. */
    final Map<String, Object> report = new LinkedHashMap<>();
    /** Per-operation seconds, in order, of the cases whose first operation is judged. */
    final Map<String, double[]> each = new LinkedHashMap<>();
    /** The server-mode worker's batches and calls to the server, recorded while a timed operation runs. */
    final Timeline timeline = new Timeline();
    /**
     * The join secret this run's server clients present, its worker processes too: the
     * inherited {@code $PEGAFLOW_JOIN_SECRET}, else one drawn for the run.
     */
    final byte[] joinSecret = ServerProcess.joinSecret();

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
            PathsAttach.run(this, Sizes.parse(attachPoolSize));
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
            PathsEngineAlone.run(this, kv, need, transfer, "engine");
            if (cuda) {
                PathsEngineAlone.cudaSettings(this, kv, need);
                PathsCrossLayer.copyModes(this, dev, arena);
            }
            try (LocalStore store = new LocalStore(EngineConfig.builder().poolBytes(need).build(), need)) {
                PathsControlPlane.run(this, "embedded", store);
            }
            try (PegaEngine embedded = PegaEngine.create(EngineConfig.builder().poolBytes(need).transfer(transfer).prefault(true).build())) {
                PathsSaveLoad.run(this, "embedded", embedded, kv, false);
            }
            try (ServerProcess server = ServerProcess.start(java(), need, serverPoolDir, serverBusyPollUs)) {
                report.put("server_start_s", server.startSeconds);
                report.put("server_busy_poll_us", serverBusyPollUs);
                report.put("server_pool_pages", HostPool.Pages.of(server.poolPath).describe());
                try (RemoteStore store = RemoteStore.connect(server.endpoint, 30_000)) {
                    PathsControlPlane.run(this, "server", store);
                }
                long t0 = System.nanoTime();
                // the worker's copy engine, its batches' submit and completion times recorded for the timelines
                Function<HostPool, TransferEngine> timed = p -> new TimedTransfer(transfer.apply(p), timeline);
                try (PegaEngine attached = server.attachTimed(timed, timeline, joinSecret)) {
                    report.put("server_attach_s", (System.nanoTime() - t0) / 1e9);
                    PathsSaveLoad.run(this, "server", attached, kv, true);
                    PathsCrossLayer.viaEngine(this, attached, dev, arena);
                    kv.free();
                    if (tp2Wanted()) {
                        try {
                            PathsTp2.run(this, attached, server);
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
                    PathsAttach.run(this, Sizes.parse(attachPoolSize));
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

    /**
     * One case's medians over {@code bytes}: {@code <key>_save_gbps<suffix>},
     * {@code _load_gbps}, {@code _save_ms} and {@code _load_ms}.
     */
    void putRates(String key, String suffix, long bytes, double saveSeconds, double loadSeconds) {
        report.put(key + "_save_gbps" + suffix, bytes / saveSeconds / 1e9);
        report.put(key + "_load_gbps" + suffix, bytes / loadSeconds / 1e9);
        report.put(key + "_save_ms" + suffix, saveSeconds * 1e3);
        report.put(key + "_load_ms" + suffix, loadSeconds * 1e3);
    }

    private boolean tp2Wanted() {
        return switch (tp2) {
            case "on" -> true;
            case "off" -> false;
            case "auto" -> cuda && CudaDriver.deviceCount() >= 2;
            default -> throw new IllegalArgumentException("--tp2 " + tp2 + "; expected auto, on or off");
        };
    }

    /** The java launcher of the server and worker processes: {@code --java}, else this JVM's. */
    String java() {
        return javaLauncher != null ? javaLauncher : ProcessHandle.current().info().command().orElse("java");
    }

    /** This JVM's launcher and class path running a bench subcommand, with extra JVM options first. */
    List<String> benchProcess(List<String> jvmOptions, String... args) {
        List<String> cmd = new ArrayList<>();
        cmd.add(java());
        cmd.add("--enable-native-access=ALL-UNNAMED");
        cmd.addAll(jvmOptions);
        cmd.addAll(List.of("-cp", System.getProperty("java.class.path"), "io.pegaflow.bench.BenchMain"));
        cmd.addAll(List.of(args));
        return cmd;
    }

    // ------------------------------------------------------------------ the report

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
            double saveRatio = s[0] / Stats.median(Arrays.copyOfRange(s, 1, s.length));
            double loadRatio = l[0] / Stats.median(Arrays.copyOfRange(l, 1, l.length));
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
}
