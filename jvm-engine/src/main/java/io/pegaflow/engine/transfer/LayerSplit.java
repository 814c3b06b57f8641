package io.pegaflow.engine.transfer;

import io.pegaflow.engine.InvalidArgumentException;

/**
 * How a layer-wise load (vLLM's in-step load, whose compute waits layer by layer) is cut into
 * copy batches: consecutive layers join one group until each block's stretch of the group,
 * back to back in the pool, reaches {@code groupBytes} (0: one layer per group), and the
 * groups are dealt round-robin over {@code lanes} batches, each on its own copy lane, so one
 * layer's copy does not wait for the tail of the previous one's on the same stream. A GPU
 * engine also caps the thread blocks each kernel launch of such a batch takes
 * ({@code kernelBlocks}), so the forward's kernels running beside the copy find free SMs
 * instead of queueing behind a copy that fills the GPU, or ({@code copyEngine}) moves the
 * pool side with the copy engine, which takes no SMs at all.
 *
 * @param groupBytes   bytes of each block's slots per group at least; 0 to 1 GiB
 * @param lanes        batches a layer-wise load part is dealt over; 1 to 16
 * @param kernelBlocks the most thread blocks one copy-kernel launch of a batch of several
 *                     groups takes (a grid-strided kernel moves the same pieces with fewer);
 *                     0: no cap
 * @param copyEngine   a GPU engine moves every group's pool side through its copy engine
 *                     into a device buffer (the bounce path) however short each block's
 *                     stretch of the group, instead of reading the pool with the kernel:
 *                     the copy engine takes no SMs from the forward beside the load
 */
public record LayerSplit(long groupBytes, int lanes, int kernelBlocks, boolean copyEngine) {
    /**
     * One layer per group, one batch, the pool side through the copy engine, kernels of at most
     * 32 thread blocks: the default. Without the cap one layer's copy kernel (a thread block per
     * piece) filled the GPU's SMs and each of the forward's kernels beside it queued behind it;
     * with 32 the copy ran as fast and the forward followed it layer by layer
     * (docs/benchmarks/README.md, seventh and eighth H200 runs). The copy engine moved the same
     * layers sooner than the capped kernel with the forward beside it (the tenth run).
     */
    public static final LayerSplit PER_LAYER = new LayerSplit(0, 1, 32, true);
    /** The environment variables {@link #fromEnvironment} reads (KiB, a count, a count, 0 or 1). */
    public static final String GROUP_ENV = "PEGAFLOW_CUDA_LAYER_GROUP_KIB";
    public static final String LANES_ENV = "PEGAFLOW_CUDA_LAYER_LANES";
    public static final String BLOCKS_ENV = "PEGAFLOW_CUDA_LAYER_KERNEL_BLOCKS";
    public static final String DMA_ENV = "PEGAFLOW_CUDA_LAYER_DMA";

    public LayerSplit {
        if (groupBytes < 0 || groupBytes > (1L << 30)) {
            throw new InvalidArgumentException("layer group of " + groupBytes + " bytes; expected 0 (one layer per group) to 1 GiB");
        }
        if (lanes < 1 || lanes > 16) {
            throw new InvalidArgumentException("layer lanes " + lanes + "; expected 1..16");
        }
        if (kernelBlocks < 0 || kernelBlocks > 65535) {
            throw new InvalidArgumentException("layer kernel blocks " + kernelBlocks + "; expected 0 (no cap) to 65535");
        }
    }

    /**
     * From the values of {@link #GROUP_ENV} (KiB), {@link #LANES_ENV} and {@link #BLOCKS_ENV};
     * unset (null or blank) keeps {@link #PER_LAYER}'s value.
     */
    public static LayerSplit fromEnvironment(String groupKib, String lanes, String kernelBlocks) {
        return fromEnvironment(groupKib, lanes, kernelBlocks, null);
    }

    /** As {@link #fromEnvironment(String, String, String)}, with {@link #DMA_ENV} ({@code 0} or {@code 1}). */
    public static LayerSplit fromEnvironment(String groupKib, String lanes, String kernelBlocks, String dma) {
        long group = parse(groupKib, GROUP_ENV, 0, 1 << 20, PER_LAYER.groupBytes >> 10,
                "KiB of each block's slots per group of a layer-wise load, 0 (one layer per group) to 1048576") << 10;
        long n = parse(lanes, LANES_ENV, 1, 16, PER_LAYER.lanes, "copy lanes a layer-wise load is dealt over, 1 to 16");
        long blocks = parse(kernelBlocks, BLOCKS_ENV, 0, 65535, PER_LAYER.kernelBlocks,
                "thread blocks per copy-kernel launch of a layer-wise load, 0 (no cap) to 65535");
        long copyEngine = parse(dma, DMA_ENV, 0, 1, PER_LAYER.copyEngine ? 1 : 0,
                "0 (the copy kernel reads the pool) or 1 (the copy engine moves every layer)");
        return new LayerSplit(group, (int) n, (int) blocks, copyEngine == 1);
    }

    /**
     * An environment setting {@code name=value} as a number from {@code min} to {@code max};
     * unset (null or blank): {@code unset}; otherwise refused naming the setting and {@code expected}.
     */
    public static long parse(String value, String name, long min, long max, long unset, String expected) {
        if (value == null || value.isBlank()) {
            return unset;
        }
        try {
            long v = Long.parseLong(value.strip());
            if (v >= min && v <= max) {
                return v;
            }
        } catch (NumberFormatException e) {
            // named below
        }
        throw new InvalidArgumentException(name + "=" + value + "; expected " + expected);
    }
}
