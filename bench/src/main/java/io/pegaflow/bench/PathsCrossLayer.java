package io.pegaflow.bench;

import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.cuda.CudaDevice;
import io.pegaflow.engine.cuda.CudaOptions;
import io.pegaflow.engine.cuda.CudaTransferEngine;
import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.CopyBatch;
import java.lang.foreign.Arena;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * The KV cache as one tensor whose blocks hold every layer back to back, so a block is one
 * contiguous run instead of two pieces per layer: through an engine, and on the copy engine
 * alone by DMA or by the gather kernel, to tell which one such runs should take.
 */
final class PathsCrossLayer {
    private PathsCrossLayer() {}

    /** The same bytes as one tensor whose blocks hold every layer back to back: one run per block. */
    static void viaEngine(PathsCommand paths, PegaEngine engine, CudaDevice dev, Arena arena) {
        Kv one = Kv.allocateCrossLayer(dev, arena, paths.blockBytes, paths.cacheBlocks);
        String instance = "crosslayer-" + ProcessHandle.current().pid();
        PathsSaveLoad.register(paths, engine, instance, "paths-crosslayer-" + paths.blockBytes, one);
        Ids ids = new Ids(paths.cacheBlocks, 13);
        PathsSaveLoad.Rounds t = PathsSaveLoad.rounds(paths, engine, instance, one, ids, paths.blocks, r -> 777_000L + r);
        engine.unregisterInstance(instance);
        paths.report.put("crosslayer_save_gbps", paths.blocks * paths.blockBytes / Stats.median(t.save()) / 1e9);
        paths.report.put("crosslayer_load_gbps", paths.blocks * paths.blockBytes / Stats.median(t.load()) / 1e9);
        paths.report.put("crosslayer_verified", t.loaded());
        one.free();
    }

    /**
     * The cross-layer batch (one 2 MiB run per block) on the copy engine alone, through the
     * copy engine's DMA (one cuMemcpyAsync per run; all of them in cuMemcpyBatchAsync calls,
     * the default for runs of 1 MiB and more) and through the gather kernel: which one the
     * runs should take.
     */
    static void copyModes(PathsCommand paths, CudaDevice dev, Arena arena) {
        Kv one = Kv.allocateCrossLayer(dev, arena, paths.blockBytes, paths.cacheBlocks);
        long bytes = paths.blocks * paths.blockBytes;
        try {
            CudaOptions base = CudaOptions.defaults().withDevice(paths.device);
            Map<String, CudaOptions> modes = new LinkedHashMap<>();
            modes.put("dma", base.withDmaThreshold(1L << 20).withDmaBatch(false)); // one cuMemcpyAsync per run
            modes.put("batch", base.withDmaThreshold(1L << 20).withDmaBatch(true)); // cuMemcpyBatchAsync
            modes.put("kernel", base.withDmaThreshold(1L << 30).withBounce(0)); // the kernel over PCIe
            for (var mode : modes.entrySet()) {
                try (HostPool pool = HostPool.anonymous(bytes + (64L << 20));
                        CudaTransferEngine engine = CudaTransferEngine.create(pool, mode.getValue())) {
                    if (mode.getKey().equals("batch")) {
                        paths.report.put("engine_dma_batched", engine.dmaBatched());
                    }
                    Ids ids = new Ids(paths.cacheBlocks, 19);
                    double[] t = PathsEngineAlone.timeBatches(paths, engine,
                            one.batch(CopyBatch.Direction.TO_HOST, ids.take(paths.blocks)),
                            one.batch(CopyBatch.Direction.TO_DEVICE, ids.take(paths.blocks)));
                    paths.report.put("engine_crosslayer_" + mode.getKey() + "_save_gbps", bytes / t[0] / 1e9);
                    paths.report.put("engine_crosslayer_" + mode.getKey() + "_load_gbps", bytes / t[1] / 1e9);
                }
            }
        } finally {
            one.free();
        }
    }
}
