package io.pegaflow.bench;

import io.pegaflow.engine.Sizes;
import io.pegaflow.engine.cuda.CudaDevice;
import io.pegaflow.engine.cuda.CudaDriver;
import io.pegaflow.engine.cuda.CudaOptions;
import io.pegaflow.engine.cuda.CudaTransferEngine;
import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.CopyBatch;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
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
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

/**
 * GPU <-> pinned pool bandwidth of the CUDA copy engine on vLLM-shaped blocks, against the
 * large-contiguous-copy line measured in the same run. Saves (D2H) and loads (H2D) move
 * {@code --blocks} blocks whose ids are scattered over a larger KV cache, one piece per
 * layer and K/V, exactly as the engine builds its batches (block-major, each block's slots
 * contiguous in the pool). Also measured: the same pieces with one cuMemcpyAsync each (the
 * "direct" path) and MLA-shaped pieces. {@code pegaflow-bench transfer} from Python adds a
 * PyTorch per-piece baseline to the same report.
 */
@Command(name = "transfer", mixinStandardHelpOptions = true,
        description = "CUDA copy engine bandwidth on Llama- and MLA-shaped blocks vs the large-copy line (GPU host).")
final class TransferCommand implements Callable<Integer> {
    @Option(names = "--device", defaultValue = "0")
    int device;

    @Option(names = "--blocks", defaultValue = "1024", description = "blocks moved per direction (Llama: 2 MiB each)")
    int blocks;

    @Option(names = "--cache-blocks", defaultValue = "4096", description = "blocks in the GPU KV cache the ids scatter over")
    int cacheBlocks;

    @Option(names = "--layers", defaultValue = "32")
    int layers;

    @Option(names = "--piece-bytes", defaultValue = "32768", description = "one layer's K (or V) of one block")
    int pieceBytes;

    @Option(names = "--mla-layers", defaultValue = "61")
    int mlaLayers;

    @Option(names = "--mla-piece-bytes", defaultValue = "18432", description = "one layer's latent of one block (DeepSeek-V3)")
    int mlaPieceBytes;

    @Option(names = "--repeat", defaultValue = "7", description = "timed repetitions; the median is reported")
    int repeat;

    @Option(names = "--lanes", defaultValue = "2")
    int lanes;

    @Option(names = "--host-descriptors", negatable = true, defaultValue = "true",
            description = "kernel reads descriptors from pinned host memory (default ${DEFAULT-VALUE}); --no-host-descriptors uploads them")
    boolean hostDescriptors;

    @Option(names = "--json", defaultValue = "out/transfer.json")
    Path json;

    @Override
    public Integer call() throws Exception {
        Map<String, Object> report = new LinkedHashMap<>();
        long llamaBlockBytes = 2L * layers * pieceBytes;
        long mlaBlocks = Math.max(1, (2L << 30) / ((long) mlaLayers * mlaPieceBytes) + 1);
        long poolBytes = Math.max(blocks * llamaBlockBytes, mlaBlocks * mlaLayers * (long) mlaPieceBytes) + (64L << 20);
        try (CudaDevice dev = CudaDevice.open(device);
                HostPool pool = HostPool.anonymous(poolBytes);
                Arena arena = Arena.ofConfined()) {
            CudaOptions options = CudaOptions.defaults().withDevice(device).withLanes(lanes).withHostDescriptors(hostDescriptors);
            report.put("host_descriptors", hostDescriptors);
            report.put("gpu", dev.name());
            report.put("sm", dev.arch());
            report.put("driver_version", CudaDriver.driverVersion());
            long t0 = System.nanoTime();
            try (CudaTransferEngine copies = CudaTransferEngine.create(pool, options)) {
                copies.awaitFullyPinned(); // the line copies without the engine's own pinning check
                report.put("engine_create_seconds", (System.nanoTime() - t0) / 1e9);
                report.put("pool_bytes", pool.size());
                report.put("pool_register_seconds", copies.registrationNanos() / 1e9);
                dev.makeCurrent();

                // --- the line: one large contiguous copy each way
                long lineBytes = Math.min(blocks * llamaBlockBytes, pool.size());
                double[] line = PathsEngineAlone.lineSeconds(copies, pool, lineBytes, repeat);
                double lineH2dGbps = lineBytes / line[0] / 1e9;
                double lineD2hGbps = lineBytes / line[1] / 1e9;
                long stream = CudaDriver.streamCreate(CudaDriver.CU_STREAM_NON_BLOCKING);
                report.put("line_bytes", lineBytes);
                report.put("line_h2d_gbps", lineH2dGbps);
                report.put("line_d2h_gbps", lineD2hGbps);
                report.put("line_gbps", (lineH2dGbps + lineD2hGbps) / 2);

                // --- Llama-3.1-8B: per layer a [2, cacheBlocks, piece] tensor; kernel path
                Shape llama = new Shape(layers, 2, pieceBytes, cacheBlocks, blocks);
                Map<String, Double> l = measure(copies, llama, stream, arena, repeat);
                report.put("save_gbps", l.get("save"));
                report.put("load_gbps", l.get("load"));
                report.put("save_fraction_of_line", l.get("save") / lineD2hGbps);
                report.put("load_fraction_of_line", l.get("load") / lineH2dGbps);
                report.put("bytes_per_direction", llama.bytes());
                report.put("pieces_per_direction", llama.pieces());
                report.put("piece_bytes", pieceBytes);
                report.put("verified", l.get("verified") > 0);

                // --- MLA (DeepSeek-V3): per layer a [cacheBlocks, piece] latent tensor
                int mlaCache = (int) Math.max(mlaBlocks * 2, 4096);
                Shape mla = new Shape(mlaLayers, 1, mlaPieceBytes, mlaCache, (int) mlaBlocks);
                Map<String, Double> m = measure(copies, mla, stream, arena, repeat);
                report.put("mla_save_gbps", m.get("save"));
                report.put("mla_load_gbps", m.get("load"));
                report.put("mla_save_fraction_of_line", m.get("save") / lineD2hGbps);
                report.put("mla_load_fraction_of_line", m.get("load") / lineH2dGbps);
                report.put("mla_bytes_per_direction", mla.bytes());
                report.put("mla_piece_bytes", mlaPieceBytes);
                CudaDriver.streamDestroy(stream);
            }
            // --- baseline: the same Llama pieces, one cuMemcpyAsync each (no kernel)
            try (CudaTransferEngine direct = CudaTransferEngine.create(pool,
                    CudaOptions.defaults().withDevice(device).withLanes(lanes).withDmaThreshold(4096))) {
                dev.makeCurrent();
                long stream = CudaDriver.streamCreate(CudaDriver.CU_STREAM_NON_BLOCKING);
                Map<String, Double> d = measure(direct, new Shape(layers, 2, pieceBytes, cacheBlocks, blocks), stream, arena,
                        Math.min(repeat, 3));
                report.put("direct_save_gbps", d.get("save"));
                report.put("direct_load_gbps", d.get("load"));
                CudaDriver.streamDestroy(stream);
            }
        }
        report.put("repeat", repeat);
        report.put("lanes", lanes);
        Json.writeFile(json, report);
        System.out.printf(Locale.ROOT, "%s: line %.1f GB/s H2D, %.1f GB/s D2H%n", report.get("gpu"),
                report.get("line_h2d_gbps"), report.get("line_d2h_gbps"));
        System.out.printf(Locale.ROOT, "  Llama pieces (%s per direction, %d x %d B): save %.1f GB/s (%.0f%%), load %.1f GB/s (%.0f%%)%n",
                Sizes.format((Long) report.get("bytes_per_direction")), report.get("pieces_per_direction"), pieceBytes,
                report.get("save_gbps"), 100 * (Double) report.get("save_fraction_of_line"),
                report.get("load_gbps"), 100 * (Double) report.get("load_fraction_of_line"));
        System.out.printf(Locale.ROOT, "  MLA pieces (%d B): save %.1f GB/s, load %.1f GB/s; one cuMemcpyAsync per piece: save %.1f, load %.1f GB/s%n",
                mlaPieceBytes, report.get("mla_save_gbps"), report.get("mla_load_gbps"),
                report.get("direct_save_gbps"), report.get("direct_load_gbps"));
        System.out.println("  report: " + json);
        return Boolean.TRUE.equals(report.get("verified")) ? 0 : 1;
    }

    /** layers x segments pieces of pieceBytes per block; `moved` of `cacheBlocks` blocks, scattered. */
    private record Shape(int layers, int segments, int pieceBytes, int cacheBlocks, int moved) {
        long bytes() {
            return (long) moved * layers * segments * pieceBytes;
        }

        int pieces() {
            return moved * layers * segments;
        }

        long layerBytes() {
            return (long) segments * cacheBlocks * pieceBytes;
        }

        /** Device address of (layer, segment, block) in per-layer [segments, cacheBlocks, piece] tensors. */
        long device(long base, int layer, int seg, long block) {
            return base + layer * layerBytes() + ((long) seg * cacheBlocks + block) * pieceBytes;
        }
    }

    private static Map<String, Double> measure(CudaTransferEngine copies, Shape s, long stream, Arena arena, int repeat) {
        long gpu = CudaDriver.memAlloc(s.layers() * s.layerBytes());
        try {
            List<Integer> ids = new ArrayList<>();
            for (int b = 0; b < s.cacheBlocks(); b++) {
                ids.add(b);
            }
            Collections.shuffle(ids, new Random(7));
            int[] src = ids.subList(0, s.moved()).stream().mapToInt(Integer::intValue).toArray();
            int[] dst = ids.subList(s.moved(), Math.min(s.cacheBlocks(), 2 * s.moved())).stream().mapToInt(Integer::intValue).toArray();
            if (dst.length < s.moved()) {
                dst = src; // cache too small for disjoint destinations: load back in place
            }
            // Each layer's tensor holds the byte (layer + 1): loaded bytes prove where they came from.
            for (int l = 0; l < s.layers(); l++) {
                CudaDriver.memsetD8Async(gpu + l * s.layerBytes(), (byte) (l + 1), s.layerBytes(), stream);
            }
            CudaDriver.streamSynchronize(stream);
            CopyBatch save = batch(CopyBatch.Direction.TO_HOST, s, gpu, src);
            CopyBatch load = batch(CopyBatch.Direction.TO_DEVICE, s, gpu, dst);
            double saveSec = median(repeat, () -> copies.submit(save).join());
            for (int l = 0; l < s.layers(); l++) {
                CudaDriver.memsetD8Async(gpu + l * s.layerBytes(), (byte) 0, s.layerBytes(), stream);
            }
            CudaDriver.streamSynchronize(stream);
            double loadSec = median(repeat, () -> copies.submit(load).join());
            // Check: every loaded piece of a sample holds its layer's byte, first and last.
            MemorySegment probe = arena.allocate(s.pieceBytes());
            boolean ok = true;
            for (int i = 0; i < dst.length && ok; i += Math.max(1, dst.length / 16)) {
                for (int l = 0; l < s.layers() && ok; l += Math.max(1, s.layers() / 4)) {
                    CudaDriver.memcpyDtoH(probe.address(), s.device(gpu, l, s.segments() - 1, dst[i]), s.pieceBytes());
                    ok = probe.get(ValueLayout.JAVA_BYTE, 0) == (byte) (l + 1)
                            && probe.get(ValueLayout.JAVA_BYTE, s.pieceBytes() - 1) == (byte) (l + 1);
                }
            }
            Map<String, Double> out = new LinkedHashMap<>();
            out.put("save", s.bytes() / saveSec / 1e9);
            out.put("load", s.bytes() / loadSec / 1e9);
            out.put("verified", ok ? 1.0 : 0.0);
            return out;
        } finally {
            CudaDriver.memFree(gpu);
        }
    }

    /** Block-major pieces, each block's slots contiguous in the pool, as the engine lays them out. */
    private static CopyBatch batch(CopyBatch.Direction dir, Shape s, long gpu, int[] blockIds) {
        CopyBatch b = new CopyBatch(dir, s.pieces());
        long host = 0;
        for (int block : blockIds) {
            for (int l = 0; l < s.layers(); l++) {
                for (int seg = 0; seg < s.segments(); seg++) {
                    b.add(s.device(gpu, l, seg, block), host, s.pieceBytes());
                    host += s.pieceBytes();
                }
            }
        }
        return b;
    }

    private static double median(int repeat, Runnable run) {
        // Warm-up: JIT-compile the descriptor path, load the kernel, size the lane buffers; the
        // steady state is what a serving engine sees.
        run.run();
        run.run();
        run.run();
        double[] t = new double[Math.max(1, repeat)];
        for (int i = 0; i < t.length; i++) {
            long start = System.nanoTime();
            run.run();
            t[i] = (System.nanoTime() - start) / 1e9;
        }
        Arrays.sort(t);
        return t[t.length / 2];
    }
}
