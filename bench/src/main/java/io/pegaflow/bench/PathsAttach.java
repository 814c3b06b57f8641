package io.pegaflow.bench;

import io.pegaflow.engine.cuda.CudaDriver;
import io.pegaflow.engine.pool.HostPool;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * The pool-attach probe: how long a worker process waits to map and pin a large shared pool
 * before it can copy, under the page sizes, pinning orders and pre-faulting the server can
 * choose, one worker or two at once ({@code attach} children; GPU only).
 */
final class PathsAttach {
    private PathsAttach() {}

    /**
     * Attach of a shared pool of {@code bytes} by a worker process (map + pin), created fresh
     * for each setting: 4 KiB pages pinned on one thread (the old attach), on
     * {@code --attach-threads}, with transparent huge pages asked for on the mapping, the pool
     * pre-faulted by its creator first, and two workers attaching at once.
     */
    static void run(PathsCommand paths, long bytes) throws IOException, InterruptedException {
        Map<String, Object> report = paths.report;
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
        Path hugeDir = paths.attachHugeDir;
        if (hugeDir != null) {
            settings.add(new Setting("huge_prefaulted_all", true, false, true, 1, false, true));
            settings.add(new Setting("huge_prefaulted_two_at_once", true, false, false, 2, true, true));
        }
        List<String> wanted = paths.attachSettings;
        if (!wanted.contains("all")) {
            List<String> known = settings.stream().map(Setting::name).toList();
            for (String n : wanted) {
                if (!known.contains(n)) {
                    throw new IllegalArgumentException("--attach-settings " + n + "; expected all or some of " + known);
                }
            }
            settings = new ArrayList<>(settings.stream().filter(st -> wanted.contains(st.name())
                    || st.huge() && wanted.contains(st.name().substring("huge_".length()))).toList());
        }
        Path shm = Path.of(Files.isDirectory(Path.of("/dev/shm")) ? "/dev/shm" : System.getProperty("java.io.tmpdir"),
                "pegaflow-attach-" + ProcessHandle.current().pid() + ".pool");
        HostPool pool = null;
        try {
            for (Setting st : settings) {
                System.setProperty("pegaflow.pool.thp", Boolean.toString(st.thp()));
                Path path = st.huge() ? hugeDir.resolve(shm.getFileName()) : shm;
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
                    report.put("attach_prefault_s", pool.prefault(paths.prefaultThreads) / 1e9);
                }
                List<Process> ps = new ArrayList<>();
                for (int w = 0; w < st.workers(); w++) {
                    ps.add(new ProcessBuilder(paths.benchProcess(List.of("-Dpegaflow.pool.thp=" + st.thp()), "attach",
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
}
