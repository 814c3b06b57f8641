package io.pegaflow.bench;

import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.cuda.CudaDevice;
import io.pegaflow.engine.cuda.CudaDriver;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.TimeUnit;

/**
 * The two-GPU case: two {@code paths-worker} processes as the TP ranks of one instance on the
 * run's server, as a vLLM launch's processes are, against the single-worker server figure; on
 * GPUs also the line with both GPUs copying at once, the most the case can reach.
 */
final class PathsTp2 {
    private PathsTp2() {}

    /**
     * Two worker processes, one per GPU, as the TP ranks 0 and 1 of one instance, save their
     * slots of the same blocks at once, then load their shares of one lease: aggregate GB/s
     * against the single-worker server figure of this run.
     */
    static void run(PathsCommand paths, PegaEngine parent, ServerProcess server) throws IOException, InterruptedException {
        String instance = "tp2-" + ProcessHandle.current().pid();
        parent.registerInstance(new InstanceSpec(instance, "paths-tp2-" + paths.layers + "x" + paths.pieceBytes, 2, 2));
        List<Worker> workers = new ArrayList<>();
        try {
            for (int r = 0; r < 2; r++) {
                ProcessBuilder child = new ProcessBuilder(paths.benchProcess(List.of(), "paths-worker", "--endpoint", server.endpoint,
                        "--instance", instance, "--rank", Integer.toString(r), "--copy", paths.copy,
                        "--device", Integer.toString(paths.cuda ? r : 0), "--layers", Integer.toString(paths.layers),
                        "--piece-bytes", Integer.toString(paths.pieceBytes), "--cache-blocks", Integer.toString(paths.cacheBlocks)))
                        .redirectError(ProcessBuilder.Redirect.INHERIT);
                // the ranks act for the instance this process registered, as a vLLM launch's processes do
                child.environment().put(ServerProcess.JOIN_SECRET_ENV, new String(paths.joinSecret, StandardCharsets.UTF_8));
                workers.add(new Worker(child.start()));
            }
            for (Worker w : workers) {
                w.await("ready");
            }
            if (!parent.isSealed(instance)) {
                throw new IllegalStateException("instance " + instance + " is not sealed after both ranks registered");
            }
            int blocks = paths.blocks;
            double[] save = new double[paths.repeat];
            double[] load = new double[paths.repeat];
            boolean ok = true;
            for (int r = 0; r < paths.repeat; r++) {
                long seed = 5000 + r;
                long t0 = System.nanoTime();
                ok &= Worker.all(workers, "save " + seed + " " + blocks);
                save[r] = (System.nanoTime() - t0) / 1e9;
                QueryResult q = parent.query(instance, Ids.hashes(blocks, seed));
                ok &= q.hitBlocks() == blocks;
                String lease = HexFormat.of().formatHex(q.lease().toBytes());
                t0 = System.nanoTime();
                ok &= Worker.all(workers, "load " + lease + " " + seed + " " + blocks);
                load[r] = (System.nanoTime() - t0) / 1e9;
            }
            double saveGbps = 2 * blocks * paths.blockBytes / Stats.median(save) / 1e9;
            double loadGbps = 2 * blocks * paths.blockBytes / Stats.median(load) / 1e9;
            paths.report.put("tp2_save_gbps", saveGbps);
            paths.report.put("tp2_load_gbps", loadGbps);
            paths.report.put("tp2_verified", ok);
            paths.report.put("tp2_aggregate_ratio", Math.min(saveGbps / (Double) paths.report.get("server_save_gbps"),
                    loadGbps / (Double) paths.report.get("server_load_gbps")));
            if (paths.cuda) {
                twoGpuLine(paths);
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
    private static void twoGpuLine(PathsCommand paths) throws InterruptedException {
        long bytes = 1L << 30;
        int repeat = paths.repeat;
        double[][] gbps = new double[2][repeat];
        for (int dir = 0; dir < 2; dir++) {
            for (int r = 0; r < repeat; r++) {
                CyclicBarrier go = new CyclicBarrier(2);
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
        paths.report.put("tp2_line_h2d_gbps", Stats.median(gbps[0]));
        paths.report.put("tp2_line_d2h_gbps", Stats.median(gbps[1]));
    }

    /** A paths-worker child and its command lines. */
    private static final class Worker implements AutoCloseable {
        final Process process;
        final BufferedReader out;
        final PrintStream in;

        Worker(Process process) {
            this.process = process;
            this.out = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
            this.in = new PrintStream(process.getOutputStream(), true, StandardCharsets.UTF_8);
        }

        /** {@code line} to every worker at once, then each one's answer: true when all verified. */
        static boolean all(List<Worker> workers, String line) throws IOException {
            for (Worker w : workers) {
                w.send(line);
            }
            boolean ok = true;
            for (Worker w : workers) {
                ok &= w.await("ok").endsWith("true");
            }
            return ok;
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
}
