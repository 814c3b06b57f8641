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
 * instead of queueing behind a copy that fills the GPU.
 *
 * @param groupBytes   bytes of each block's slots per group at least; 0 to 1 GiB
 * @param lanes        batches a layer-wise load part is dealt over; 1 to 16
 * @param kernelBlocks the most thread blocks one copy-kernel launch of a batch of several
 *                     groups takes (a grid-strided kernel moves the same pieces with fewer);
 *                     0: no cap
 */
public record LayerSplit(long groupBytes, int lanes, int kernelBlocks) {
    /**
     * One layer per group, one batch, kernels of at most 32 thread blocks: the default. Without
     * the cap one layer's copy kernel (a thread block per piece) filled the GPU's SMs and each
     * of the forward's kernels beside it queued behind it; with 32 the copy ran as fast and the
     * forward followed it layer by layer (docs/benchmarks/README.md, seventh and eighth H200 runs).
     */
    public static final LayerSplit PER_LAYER = new LayerSplit(0, 1, 32);
    /** The environment variables {@link #fromEnvironment} reads (KiB, a count, a count). */
    public static final String GROUP_ENV = "PEGAFLOW_CUDA_LAYER_GROUP_KIB";
    public static final String LANES_ENV = "PEGAFLOW_CUDA_LAYER_LANES";
    public static final String BLOCKS_ENV = "PEGAFLOW_CUDA_LAYER_KERNEL_BLOCKS";

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
        long group = PER_LAYER.groupBytes;
        if (groupKib != null && !groupKib.isBlank()) {
            long kib = parse(groupKib, GROUP_ENV, "KiB of each block's slots per group of a layer-wise load, 0 (one layer per "
                    + "group) to 1048576");
            if (kib > (1 << 20)) {
                throw new InvalidArgumentException(GROUP_ENV + "=" + groupKib + "; expected KiB of each block's slots per group "
                        + "of a layer-wise load, 0 (one layer per group) to 1048576");
            }
            group = kib << 10;
        }
        int n = PER_LAYER.lanes;
        if (lanes != null && !lanes.isBlank()) {
            long v = parse(lanes, LANES_ENV, "copy lanes a layer-wise load is dealt over, 1 to 16");
            if (v < 1 || v > 16) {
                throw new InvalidArgumentException(LANES_ENV + "=" + lanes + "; expected copy lanes a layer-wise load is dealt "
                        + "over, 1 to 16");
            }
            n = (int) v;
        }
        int blocks = PER_LAYER.kernelBlocks;
        if (kernelBlocks != null && !kernelBlocks.isBlank()) {
            long v = parse(kernelBlocks, BLOCKS_ENV, "thread blocks per copy-kernel launch of a layer-wise load, 0 (no cap) to 65535");
            if (v > 65535) {
                throw new InvalidArgumentException(BLOCKS_ENV + "=" + kernelBlocks + "; expected thread blocks per copy-kernel "
                        + "launch of a layer-wise load, 0 (no cap) to 65535");
            }
            blocks = (int) v;
        }
        return new LayerSplit(group, n, blocks);
    }

    private static long parse(String value, String name, String expected) {
        try {
            long v = Long.parseLong(value.strip());
            if (v >= 0) {
                return v;
            }
        } catch (NumberFormatException e) {
            // named below
        }
        throw new InvalidArgumentException(name + "=" + value + "; expected " + expected);
    }
}
