package io.pegaflow.bench;

import io.pegaflow.engine.cuda.CudaDriver;
import io.pegaflow.engine.cuda.CudaOptions;
import io.pegaflow.engine.cuda.CudaTransferEngine;
import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.CopyBatch;
import io.pegaflow.engine.transfer.TransferEngine;
import java.util.function.Function;

/**
 * The copy engine alone on prepared batches, no control plane: the floor the embedded and
 * server paths of {@code pegaflow-bench paths} are measured against. On a GPU also the PCIe
 * line itself and the CUDA engine under other bounce settings.
 */
final class PathsEngineAlone {
    private PathsEngineAlone() {}

    /** The copy engine alone on prepared batches, its figures under {@code key}{@code _save_gbps} etc.; the line with the first. */
    static void run(PathsCommand paths, Kv kv, long poolBytes, Function<HostPool, TransferEngine> transfer, String key) {
        long bytes = paths.blocks * paths.blockBytes;
        try (HostPool pool = HostPool.anonymous(Math.max(bytes, poolBytes / 4) + (64L << 20));
                TransferEngine engine = transfer.apply(pool)) {
            Ids ids = new Ids(paths.cacheBlocks, 17);
            long[] src = ids.take(paths.blocks);
            long[] dst = ids.take(paths.blocks);
            if (engine instanceof CudaTransferEngine c) {
                c.awaitFullyPinned(); // the line below copies without the engine's own pinning check
            }
            double[] t = timeBatches(paths, engine, kv.batch(CopyBatch.Direction.TO_HOST, src),
                    kv.batch(CopyBatch.Direction.TO_DEVICE, dst));
            paths.putRates(key, "", bytes, t[0], t[1]);
            int smallBlocks = paths.smallBlocks;
            long smallBytes = smallBlocks * paths.blockBytes;
            double[] small = timeBatches(paths, engine, kv.batch(CopyBatch.Direction.TO_HOST, ids.take(smallBlocks)),
                    kv.batch(CopyBatch.Direction.TO_DEVICE, ids.take(smallBlocks)));
            paths.putRates(key, "_" + smallBlocks, smallBytes, small[0], small[1]);
            if (engine instanceof CudaTransferEngine c && key.equals("engine")) {
                long lineBytes = Math.min(2L << 30, pool.size());
                double[] line = lineSeconds(c, pool, lineBytes, paths.repeat);
                paths.report.put("line_bytes", lineBytes);
                paths.report.put("line_h2d_gbps", lineBytes / line[0] / 1e9);
                paths.report.put("line_d2h_gbps", lineBytes / line[1] / 1e9);
            }
        }
    }

    /**
     * The CUDA engine alone under other settings than the default: without the bounce path
     * ({@code engine_direct}) and with each {@code --bounce-mib} ({@code engine_bounce_*}).
     */
    static void cudaSettings(PathsCommand paths, Kv kv, long poolBytes) {
        paths.report.put("engine_bounce_bytes", CudaOptions.defaults().bounceBytes());
        paths.report.put("engine_bounce_slots", CudaOptions.defaults().bounceSlots());
        // the same without the bounce path: the kernel reads and writes the pool over PCIe itself
        run(paths, kv, poolBytes, p -> CudaTransferEngine.create(p, CudaOptions.defaults().withDevice(paths.device).withBounce(0)),
                "engine_direct");
        for (String b : paths.bounceMib) {
            String[] parts = b.split("x");
            long mib = Long.parseLong(parts[0]);
            CudaOptions o = CudaOptions.defaults().withDevice(paths.device);
            o = parts.length > 1 ? o.withBounce(mib << 20, Integer.parseInt(parts[1])) : o.withBounce(mib << 20);
            CudaOptions chosen = o;
            run(paths, kv, poolBytes, p -> CudaTransferEngine.create(p, chosen),
                    "engine_bounce_" + mib + "mib" + (parts.length > 1 ? "_" + parts[1] + "slots" : ""));
        }
    }

    /** Median seconds of {@code save} and of {@code load} on the engine alone, after one untimed round of each. */
    static double[] timeBatches(PathsCommand paths, TransferEngine engine, CopyBatch save, CopyBatch load) {
        double[] s = new double[paths.repeat];
        double[] l = new double[paths.repeat];
        engine.submit(save).join(); // the kernel's first launch and the lanes' buffers
        engine.submit(load).join();
        for (int r = 0; r < paths.repeat; r++) {
            long t0 = System.nanoTime();
            engine.submit(save).join();
            s[r] = (System.nanoTime() - t0) / 1e9;
            t0 = System.nanoTime();
            engine.submit(load).join();
            l[r] = (System.nanoTime() - t0) / 1e9;
        }
        return new double[] {Stats.median(s), Stats.median(l)};
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
            return new double[] {Stats.median(h2d), Stats.median(d2h)};
        } finally {
            CudaDriver.streamDestroy(stream);
            CudaDriver.memFree(gpu);
        }
    }
}
