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
 * @param leadBytes    of a held layer-wise load's batch ({@link CopyBatch#holdUntil}; one per
 *                     lane of {@code lanes}, each with its own lead), the first groups up to
 *                     this many bytes in all are queued at once by the CUDA engine (the host
 *                     engine holds the whole batch), the rest when
 *                     the hold opens: a load started where vLLM allocates its blocks then
 *                     copies while vLLM prepares the step instead of leaving PCIe idle. The
 *                     lead goes through the copy kernel, never the copy engine (unless
 *                     {@code leadPaced}), so the step's
 *                     input copies (on the copy engine, queued meanwhile) wait behind none of
 *                     it, whereas they waited behind a load queued whole at allocation. 0
 *                     (the default): the whole load waits. Only where nothing writes the
 *                     load's blocks between the allocation and the step's start: vLLM zeroes
 *                     newly allocated blocks on its compute stream in that window where its
 *                     KV cache needs zeroing (the connector refuses the setting there)
 * @param leadPaced    the lead goes the way the rest goes (the copy engine where {@code
 *                     copyEngine}), one group at a time: each queued once the group before
 *                     it landed, and every group left queued at once when the hold opens.
 *                     The step's input copies, queued on the copy engine meanwhile, wait
 *                     behind one group at most instead of the whole lead, and the lead
 *                     moves at the copy engine's rate instead of the kernel's beside vLLM's
 *                     step. Nothing without {@code leadBytes}
 */
public record LayerSplit(long groupBytes, int lanes, int kernelBlocks, boolean copyEngine, long leadBytes, boolean leadPaced) {
    /**
     * One layer per group, one batch, the pool side through the copy engine, kernels of at most
     * 32 thread blocks: the default. Without the cap one layer's copy kernel (a thread block per
     * piece) filled the GPU's SMs and each of the forward's kernels beside it queued behind it;
     * with 32 the copy ran as fast and the forward followed it layer by layer
     * (docs/benchmarks/README.md, seventh and eighth H200 runs). The copy engine moved the same
     * layers sooner than the capped kernel with the forward beside it (the tenth run).
     */
    public static final LayerSplit PER_LAYER = new LayerSplit(0, 1, 32, true, 0, false);
    /** The environment variables {@link #fromEnvironment} reads (KiB, a count, a count, 0 or 1). */
    public static final String GROUP_ENV = "PEGAFLOW_CUDA_LAYER_GROUP_KIB";
    public static final String LANES_ENV = "PEGAFLOW_CUDA_LAYER_LANES";
    public static final String BLOCKS_ENV = "PEGAFLOW_CUDA_LAYER_KERNEL_BLOCKS";
    public static final String DMA_ENV = "PEGAFLOW_CUDA_LAYER_DMA";
    /** MiB of {@link #leadBytes}, 0 to 16384 (more than any one load: the whole held load ahead of its step). */
    public static final String LEAD_ENV = "PEGAFLOW_CUDA_LAYER_LEAD_MIB";
    /** 0 or 1: {@link #leadPaced}. */
    public static final String PACED_ENV = "PEGAFLOW_CUDA_LAYER_LEAD_PACED";

    /** No lead ({@link #leadBytes} 0): a held load waits whole. */
    public LayerSplit(long groupBytes, int lanes, int kernelBlocks, boolean copyEngine) {
        this(groupBytes, lanes, kernelBlocks, copyEngine, 0, false);
    }

    /** A lead through the copy kernel ({@link #leadPaced} false). */
    public LayerSplit(long groupBytes, int lanes, int kernelBlocks, boolean copyEngine, long leadBytes) {
        this(groupBytes, lanes, kernelBlocks, copyEngine, leadBytes, false);
    }

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
        if (leadBytes < 0 || leadBytes > (1L << 34)) {
            throw new InvalidArgumentException("held load lead of " + leadBytes + " bytes; expected 0 (none) to 16 GiB");
        }
    }

    /** This split with {@link #leadBytes} {@code bytes}. */
    public LayerSplit withLead(long bytes) {
        return new LayerSplit(groupBytes, lanes, kernelBlocks, copyEngine, bytes, leadPaced);
    }

    /** This split with {@link #leadPaced} {@code paced}. */
    public LayerSplit withLeadPaced(boolean paced) {
        return new LayerSplit(groupBytes, lanes, kernelBlocks, copyEngine, leadBytes, paced);
    }

    /**
     * How many of {@code batch}'s first groups fit in {@link #leadBytes} together: the groups
     * of a held batch queued before its hold opens.
     */
    public int leadGroups(CopyBatch batch) {
        int groups = Math.max(1, batch.groupCount());
        long sum = 0;
        for (int g = 0; g < groups && batch.size() > 0; g++) {
            for (int i = batch.groupStart(g); i < batch.groupEnd(g); i++) {
                sum += batch.length(i);
            }
            if (sum > leadBytes) {
                return g;
            }
        }
        return batch.size() == 0 ? 0 : groups;
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
        return fromEnvironment(groupKib, lanes, kernelBlocks, dma, null);
    }

    /** As {@link #fromEnvironment(String, String, String, String)}, with {@link #LEAD_ENV} (MiB). */
    public static LayerSplit fromEnvironment(String groupKib, String lanes, String kernelBlocks, String dma, String leadMib) {
        return fromEnvironment(groupKib, lanes, kernelBlocks, dma, leadMib, null);
    }

    /** As {@link #fromEnvironment(String, String, String, String, String)}, with {@link #PACED_ENV} ({@code 0} or {@code 1}). */
    public static LayerSplit fromEnvironment(String groupKib, String lanes, String kernelBlocks, String dma, String leadMib,
            String paced) {
        long group = parse(groupKib, GROUP_ENV, 0, 1 << 20, PER_LAYER.groupBytes >> 10,
                "KiB of each block's slots per group of a layer-wise load, 0 (one layer per group) to 1048576") << 10;
        long n = parse(lanes, LANES_ENV, 1, 16, PER_LAYER.lanes, "copy lanes a layer-wise load is dealt over, 1 to 16");
        long blocks = parse(kernelBlocks, BLOCKS_ENV, 0, 65535, PER_LAYER.kernelBlocks,
                "thread blocks per copy-kernel launch of a layer-wise load, 0 (no cap) to 65535");
        long copyEngine = parse(dma, DMA_ENV, 0, 1, PER_LAYER.copyEngine ? 1 : 0,
                "0 (the copy kernel reads the pool) or 1 (the copy engine moves every layer)");
        long lead = parse(leadMib, LEAD_ENV, 0, 16384, PER_LAYER.leadBytes >> 20,
                "MiB of a held layer-wise load queued before its hold opens, 0 (none) to 16384") << 20;
        long pace = parse(paced, PACED_ENV, 0, 1, PER_LAYER.leadPaced ? 1 : 0,
                "0 (a held load's lead through the copy kernel) or 1 (its copy path, one group at a time)");
        return new LayerSplit(group, (int) n, (int) blocks, copyEngine == 1, lead, pace == 1);
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
