package io.pegaflow.engine.cuda;

import io.pegaflow.engine.InvalidArgumentException;
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
 *                            no sooner (25 s for 60 GB either way; docs/gpu.md)
 * @param hostDescriptors     the kernel reads descriptors straight from the lane's pinned
 *                            staging buffer (default) instead of a device copy uploaded
 *                            before each launch; on the H200 this was 0.1-0.2 GB/s faster
 *                            in both directions (docs/benchmarks/h200-ab/)
 * @param dmaBatch            a batch's long runs go to the copy engine in one
 *                            {@code cuMemcpyBatchAsync} per group (CUDA 12.8+; where the driver
 *                            lacks it, one {@code cuMemcpyAsync} per run as with {@code false})
 */
public record CudaOptions(int device, int lanesPerDirection, long dmaThresholdBytes, long registerChunkBytes,
        Path kernelCacheDir, List<Path> nvrtcDirs, boolean hostDescriptors, boolean pinInBackground, boolean dmaBatch) {

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
        nvrtcDirs = List.copyOf(nvrtcDirs);
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
        return new CudaOptions(0, 4, 1L << 20, 1L << 30, cache, dirs, true, false, true);
    }

    public CudaOptions withDevice(int ordinal) {
        return new CudaOptions(ordinal, lanesPerDirection, dmaThresholdBytes, registerChunkBytes, kernelCacheDir, nvrtcDirs, hostDescriptors, pinInBackground, dmaBatch);
    }

    public CudaOptions withLanes(int lanes) {
        return new CudaOptions(device, lanes, dmaThresholdBytes, registerChunkBytes, kernelCacheDir, nvrtcDirs, hostDescriptors, pinInBackground, dmaBatch);
    }

    public CudaOptions withRegisterChunk(long bytes) {
        return new CudaOptions(device, lanesPerDirection, dmaThresholdBytes, bytes, kernelCacheDir, nvrtcDirs, hostDescriptors, pinInBackground, dmaBatch);
    }

    public CudaOptions withHostDescriptors(boolean host) {
        return new CudaOptions(device, lanesPerDirection, dmaThresholdBytes, registerChunkBytes, kernelCacheDir, nvrtcDirs, host, pinInBackground, dmaBatch);
    }

    public CudaOptions withDmaThreshold(long bytes) {
        return new CudaOptions(device, lanesPerDirection, bytes, registerChunkBytes, kernelCacheDir, nvrtcDirs, hostDescriptors, pinInBackground, dmaBatch);
    }

    public CudaOptions withPinInBackground(boolean background) {
        return new CudaOptions(device, lanesPerDirection, dmaThresholdBytes, registerChunkBytes, kernelCacheDir, nvrtcDirs,
                hostDescriptors, background, dmaBatch);
    }

    public CudaOptions withDmaBatch(boolean batch) {
        return new CudaOptions(device, lanesPerDirection, dmaThresholdBytes, registerChunkBytes, kernelCacheDir, nvrtcDirs,
                hostDescriptors, pinInBackground, batch);
    }
}
