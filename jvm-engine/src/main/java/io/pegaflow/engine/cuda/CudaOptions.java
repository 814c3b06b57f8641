package io.pegaflow.engine.cuda;

import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.transfer.LayerSplit;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * Settings of the CUDA copy engine, validated here; {@link #defaults()} is the one place
 * that reads the environment ({@code CUDA_HOME}, the user's home for the kernel cache).
 *
 * @param device              CUDA device ordinal
 * @param lanesPerDirection   streams per direction; a batch holds one until it completes
 * @param dmaThresholdBytes   merged runs at least this long go through the copy engine
 *                            (cuMemcpyAsync) instead of the gather kernel
 * @param registerChunkBytes  the pool is pinned in pieces of this size
 * @param kernelCacheDir      where compiled kernels are kept between processes
 * @param nvrtcDirs           directories searched for NVRTC after the loader path
 * @param pinInBackground     pin the pool's first chunk at creation and the rest on a
 *                            background thread, a chunk a batch needs first being pinned at
 *                            once. Off by default: the driver serializes pinning with every
 *                            other call of the process, so on the H200 the engine was ready
 *                            no sooner (docs/gpu.md, "Pool attach")
 * @param hostDescriptors     the kernel reads descriptors straight from the lane's pinned
 *                            staging buffer (default) instead of a device copy uploaded
 *                            before each launch; on the H200 this was slightly faster in
 *                            both directions (docs/gpu.md, "Why this shape")
 * @param dmaBatch            a batch's long runs go to the copy engine in one
 *                            {@code cuMemcpyBatchAsync} per group (CUDA 12.8+; where the driver
 *                            lacks it, one {@code cuMemcpyAsync} per run as with {@code false})
 * @param bounceBytes         device memory per lane for the bounce path (0: off): a group of
 *                            scattered pieces that lie back to back in the pool (a block's
 *                            layers) moves pool side through the copy engine into this buffer
 *                            and is scattered there by the kernel on the GPU (a save gathers,
 *                            then copies out), in {@code bounceSlots} slots so the two
 *                            overlap. The copy engine moves long runs over PCIe at the line,
 *                            faster than the kernel reading or writing the pool there itself
 *                            (docs/gpu.md, "Server mode at line speed"). Default 16 MiB
 *                            ({@code PEGAFLOW_CUDA_BOUNCE_MIB}) in 2 slots; the engine's
 *                            lanes hold {@code 2 * lanesPerDirection} of them (128 MiB)
 * @param bounceSlots         slots of the bounce buffer, 2 to 8: one copy engine call per slot,
 *                            so small slots leave gaps between calls; the slot's size matters,
 *                            not the count (docs/gpu.md, "The bounce path's buffer"). Default 2
 *                            ({@code PEGAFLOW_CUDA_BOUNCE_SLOTS})
 * @param layerSplit          how a layer-wise load (a load inside vLLM's step) is cut into
 *                            batches ({@link LayerSplit}): groups of layers long enough in the
 *                            pool take the bounce path (the copy engine, no SMs taken from the
 *                            forward beside it), several lanes overlap one layer's kernel tail
 *                            with the next, a cap on each copy kernel's thread blocks leaves
 *                            SMs to the forward. Default {@link LayerSplit#PER_LAYER}, the
 *                            environment's {@code PEGAFLOW_CUDA_LAYER_GROUP_KIB},
 *                            {@code PEGAFLOW_CUDA_LAYER_LANES},
 *                            {@code PEGAFLOW_CUDA_LAYER_KERNEL_BLOCKS} and
 *                            {@code PEGAFLOW_CUDA_LAYER_DMA} override: groups of 256 KiB
 *                            stretches were not faster in vLLM on the H200 and took longer to
 *                            submit (docs/benchmarks/README.md, "Layer groups")
 * @param stageBytes          device memory a load's pool side is staged in from the lookup
 *                            that begins it ({@link io.pegaflow.engine.transfer.Stager}; 0, the
 *                            default: off; {@code PEGAFLOW_PRESTAGE_MIB})
 * @param saveKernelBlocks    0 (the default): a save takes the bounce path and the copy engine
 *                            as above; N > 0: a save's pieces go to the host through the copy
 *                            kernel alone, at most N thread blocks a launch, and leave the copy
 *                            engine to vLLM's own copies, the sampled tokens' copy to the host of
 *                            each decode step among them, which otherwise waits behind the
 *                            save's device-to-host copies ({@code PEGAFLOW_CUDA_SAVE_KERNEL_BLOCKS};
 *                            docs/gpu.md, "Saves beside decode")
 * @param savePaceCopies      0: a save's lane queues all of its bounce slots' copies to the host
 *                            at once; N > 0 (default 1): the engine's saves have at most N of them queued on
 *                            the copy engine at a time, the next queued (on the lane's own
 *                            thread, never the caller's) once one ends, so a copy of vLLM's that
 *                            comes meanwhile (a decode step's sampled tokens to the host) waits
 *                            behind N at most, not behind the rest of the save
 *                            ({@code PEGAFLOW_CUDA_SAVE_PACE}; docs/gpu.md, "Saves beside decode")
 */
public record CudaOptions(int device, int lanesPerDirection, long dmaThresholdBytes, long registerChunkBytes,
        Path kernelCacheDir, List<Path> nvrtcDirs, boolean hostDescriptors, boolean pinInBackground, boolean dmaBatch,
        long bounceBytes, int bounceSlots, LayerSplit layerSplit, long stageBytes, int saveKernelBlocks, int savePaceCopies) {

    /** The environment variable giving {@link #bounceBytes} in MiB for {@link #defaults()}. */
    public static final String BOUNCE_ENV = "PEGAFLOW_CUDA_BOUNCE_MIB";

    public CudaOptions {
        if (device < 0) {
            throw new InvalidArgumentException("CUDA device " + device + "; expected an ordinal >= 0");
        }
        if (lanesPerDirection < 1 || lanesPerDirection > 16) {
            throw new InvalidArgumentException("lanesPerDirection " + lanesPerDirection + "; expected 1..16");
        }
        if (dmaThresholdBytes < 4096) {
            throw new InvalidArgumentException("dmaThresholdBytes " + dmaThresholdBytes + "; expected >= 4096");
        }
        if (registerChunkBytes < (1 << 20) || registerChunkBytes % 4096 != 0) {
            throw new InvalidArgumentException("registerChunkBytes " + registerChunkBytes
                    + "; expected a multiple of 4096 of at least 1 MiB");
        }
        if (bounceSlots < 2 || bounceSlots > 8) {
            throw new InvalidArgumentException("bounceSlots " + bounceSlots + "; expected 2..8");
        }
        if (bounceBytes != 0 && (bounceBytes < bounceSlots * (1L << 20) || bounceBytes > (1L << 30)
                || bounceBytes % (bounceSlots * 4096L) != 0)) {
            throw new InvalidArgumentException("bounceBytes " + bounceBytes + "; expected 0 (off) or a multiple of "
                    + bounceSlots * 4096 + " (" + bounceSlots + " slots of whole pages) from " + bounceSlots
                    + " MiB to 1 GiB");
        }
        if (saveKernelBlocks < 0 || saveKernelBlocks > CopyLane.MAX_GRID) {
            throw new InvalidArgumentException("saveKernelBlocks " + saveKernelBlocks + "; expected 0 (saves through the copy engine) to "
                    + CopyLane.MAX_GRID);
        }
        if (savePaceCopies < 0 || savePaceCopies > MAX_SAVE_PACE) {
            throw new InvalidArgumentException("savePaceCopies " + savePaceCopies + "; expected 0 (not paced) to " + MAX_SAVE_PACE);
        }
        java.util.Objects.requireNonNull(layerSplit, "layerSplit");
        io.pegaflow.engine.transfer.Stager.checkBytes(stageBytes);
        nvrtcDirs = List.copyOf(nvrtcDirs);
    }

    /** The environment variable giving {@link #bounceSlots} for {@link #defaults()}. */
    public static final String BOUNCE_SLOTS_ENV = "PEGAFLOW_CUDA_BOUNCE_SLOTS";

    /** {@link #bounceSlots} from {@link #BOUNCE_SLOTS_ENV}, or 2 when unset. */
    static int bounceSlotsFromEnvironment(String value) {
        return (int) LayerSplit.parse(value, BOUNCE_SLOTS_ENV, 2, 8, 2, "slots of each lane's bounce buffer, 2 to 8");
    }

    /** {@link #bounceBytes} from {@link #BOUNCE_ENV} (MiB), or 16 MiB when unset. */
    static long bounceFromEnvironment(String value) {
        return LayerSplit.parse(value, BOUNCE_ENV, 0, 1024, 16, "MiB of device memory per copy lane, 0 (off) to 1024") << 20;
    }

    /** The environment variable giving {@link #saveKernelBlocks} for {@link #defaults()}. */
    public static final String SAVE_KERNEL_ENV = "PEGAFLOW_CUDA_SAVE_KERNEL_BLOCKS";

    /** {@link #saveKernelBlocks} from {@link #SAVE_KERNEL_ENV}, or 0 (saves through the copy engine) when unset. */
    static int saveKernelBlocksFromEnvironment(String value) {
        return (int) LayerSplit.parse(value, SAVE_KERNEL_ENV, 0, CopyLane.MAX_GRID, 0,
                "thread blocks of a save's copy kernel, 0 (saves through the copy engine) to " + CopyLane.MAX_GRID);
    }

    /** The environment variable giving {@link #savePaceCopies} for {@link #defaults()}. */
    public static final String SAVE_PACE_ENV = "PEGAFLOW_CUDA_SAVE_PACE";
    /** The most save copies {@link #savePaceCopies} lets the copy engine hold at once. */
    static final int MAX_SAVE_PACE = 64;

    /**
     * {@link #savePaceCopies} from {@link #SAVE_PACE_ENV}, or 1 when unset: of 0, 1 and 2 on an
     * H100 in vLLM, one copy at a time slowed the decode steps beside a save least
     * (docs/gpu.md, "Saves beside decode").
     */
    static int savePaceFromEnvironment(String value) {
        return (int) LayerSplit.parse(value, SAVE_PACE_ENV, 0, MAX_SAVE_PACE, 1,
                "save copies queued on the copy engine at once, 0 (not paced) to " + MAX_SAVE_PACE);
    }

    public static CudaOptions defaults() {
        List<Path> dirs = new ArrayList<>();
        String cudaHome = System.getenv("CUDA_HOME");
        if (cudaHome != null && !cudaHome.isBlank()) {
            dirs.add(Path.of(cudaHome, "lib64"));
            dirs.add(Path.of(cudaHome, "lib"));
        }
        dirs.add(Path.of("/usr/local/cuda/lib64"));
        dirs.add(Path.of("/usr/local/cuda/targets/x86_64-linux/lib"));
        Path cache = Path.of(System.getProperty("user.home"), ".cache", "pegaflow", "kernels");
        return new CudaOptions(0, 4, 1L << 20, 1L << 30, cache, dirs, true, false, true,
                bounceFromEnvironment(System.getenv(BOUNCE_ENV)), bounceSlotsFromEnvironment(System.getenv(BOUNCE_SLOTS_ENV)),
                LayerSplit.fromEnvironment(System.getenv(LayerSplit.GROUP_ENV), System.getenv(LayerSplit.LANES_ENV),
                        System.getenv(LayerSplit.BLOCKS_ENV), System.getenv(LayerSplit.DMA_ENV),
                        System.getenv(LayerSplit.LEAD_ENV), System.getenv(LayerSplit.PACED_ENV)),
                io.pegaflow.engine.transfer.Stager.bytesFromEnvironment(System.getenv(io.pegaflow.engine.transfer.Stager.ENV)),
                saveKernelBlocksFromEnvironment(System.getenv(SAVE_KERNEL_ENV)),
                savePaceFromEnvironment(System.getenv(SAVE_PACE_ENV)));
    }

    public CudaOptions withDevice(int ordinal) {
        return new CudaOptions(ordinal, lanesPerDirection, dmaThresholdBytes, registerChunkBytes, kernelCacheDir, nvrtcDirs, hostDescriptors, pinInBackground, dmaBatch, bounceBytes, bounceSlots, layerSplit, stageBytes, saveKernelBlocks, savePaceCopies);
    }

    public CudaOptions withLanes(int lanes) {
        return new CudaOptions(device, lanes, dmaThresholdBytes, registerChunkBytes, kernelCacheDir, nvrtcDirs, hostDescriptors, pinInBackground, dmaBatch, bounceBytes, bounceSlots, layerSplit, stageBytes, saveKernelBlocks, savePaceCopies);
    }

    public CudaOptions withRegisterChunk(long bytes) {
        return new CudaOptions(device, lanesPerDirection, dmaThresholdBytes, bytes, kernelCacheDir, nvrtcDirs, hostDescriptors, pinInBackground, dmaBatch, bounceBytes, bounceSlots, layerSplit, stageBytes, saveKernelBlocks, savePaceCopies);
    }

    public CudaOptions withHostDescriptors(boolean host) {
        return new CudaOptions(device, lanesPerDirection, dmaThresholdBytes, registerChunkBytes, kernelCacheDir, nvrtcDirs, host, pinInBackground, dmaBatch, bounceBytes, bounceSlots, layerSplit, stageBytes, saveKernelBlocks, savePaceCopies);
    }

    public CudaOptions withDmaThreshold(long bytes) {
        return new CudaOptions(device, lanesPerDirection, bytes, registerChunkBytes, kernelCacheDir, nvrtcDirs, hostDescriptors, pinInBackground, dmaBatch, bounceBytes, bounceSlots, layerSplit, stageBytes, saveKernelBlocks, savePaceCopies);
    }

    public CudaOptions withPinInBackground(boolean background) {
        return new CudaOptions(device, lanesPerDirection, dmaThresholdBytes, registerChunkBytes, kernelCacheDir, nvrtcDirs,
                hostDescriptors, background, dmaBatch, bounceBytes, bounceSlots, layerSplit, stageBytes, saveKernelBlocks, savePaceCopies);
    }

    public CudaOptions withDmaBatch(boolean batch) {
        return new CudaOptions(device, lanesPerDirection, dmaThresholdBytes, registerChunkBytes, kernelCacheDir, nvrtcDirs,
                hostDescriptors, pinInBackground, batch, bounceBytes, bounceSlots, layerSplit, stageBytes, saveKernelBlocks, savePaceCopies);
    }

    public CudaOptions withLayerSplit(LayerSplit split) {
        return new CudaOptions(device, lanesPerDirection, dmaThresholdBytes, registerChunkBytes, kernelCacheDir, nvrtcDirs,
                hostDescriptors, pinInBackground, dmaBatch, bounceBytes, bounceSlots, split, stageBytes, saveKernelBlocks, savePaceCopies);
    }

    public CudaOptions withStage(long bytes) {
        return new CudaOptions(device, lanesPerDirection, dmaThresholdBytes, registerChunkBytes, kernelCacheDir, nvrtcDirs,
                hostDescriptors, pinInBackground, dmaBatch, bounceBytes, bounceSlots, layerSplit, bytes, saveKernelBlocks, savePaceCopies);
    }

    public CudaOptions withSaveKernelBlocks(int blocks) {
        return new CudaOptions(device, lanesPerDirection, dmaThresholdBytes, registerChunkBytes, kernelCacheDir, nvrtcDirs,
                hostDescriptors, pinInBackground, dmaBatch, bounceBytes, bounceSlots, layerSplit, stageBytes, blocks, savePaceCopies);
    }

    public CudaOptions withSavePace(int copies) {
        return new CudaOptions(device, lanesPerDirection, dmaThresholdBytes, registerChunkBytes, kernelCacheDir, nvrtcDirs,
                hostDescriptors, pinInBackground, dmaBatch, bounceBytes, bounceSlots, layerSplit, stageBytes, saveKernelBlocks,
                copies);
    }

    public CudaOptions withBounce(long bytes) {
        return withBounce(bytes, bounceSlots);
    }

    public CudaOptions withBounce(long bytes, int slots) {
        return new CudaOptions(device, lanesPerDirection, dmaThresholdBytes, registerChunkBytes, kernelCacheDir, nvrtcDirs,
                hostDescriptors, pinInBackground, dmaBatch, bytes, slots, layerSplit, stageBytes, saveKernelBlocks, savePaceCopies);
    }
}
