package io.pegaflow.engine;

/**
 * Where one layer's KV cache lives in a worker's memory, as an affine description: segment
 * {@code s} of block {@code b} starts at {@code baseAddress + b*blockStride + s*segmentOffset}
 * and is {@code segmentBytes} long. {@code regionBytes} is the size of the allocation that
 * starts at {@code baseAddress}; every piece must lie inside it.
 *
 * <p>Examples (bf16, 16 tokens, 8 KV heads x 128): vLLM's per-layer {@code [2, N, 16, 8, 128]}
 * tensor is {@code SPLIT_KV} with segmentBytes 32768, blockStride 32768,
 * segmentOffset {@code N*32768}; a blocks-first {@code [N, 2, 16, 8, 128]} tensor is
 * {@code COMBINED} with segmentBytes 65536 and blockStride 65536 (or {@code SPLIT_KV} with
 * segmentOffset 32768; both describe the same bytes).
 */
public record LayerRegion(
        String layerName,
        KvLayout layout,
        long baseAddress,
        long regionBytes,
        int numBlocks,
        long blockStride,
        long segmentBytes,
        long segmentOffset) {

    public int segments() {
        return layout.segments();
    }

    /** Bytes of one block of this layer in the host pool (all segments). */
    public long slotBytes() {
        return segmentBytes * layout.segments();
    }

    /**
     * Block ids against the smallest of the selected regions ({@code null}: all of them): one
     * pass over the ids, whatever the layer count; the message names that region. Where a copy's
     * block ids come from its caller, before any address is made of them.
     */
    public static void checkBlockIds(LayerRegion[] regions, int[] regionIdx, long[] ids, String what) {
        LayerRegion smallest = null;
        int n = regionIdx == null ? regions.length : regionIdx.length;
        for (int k = 0; k < n; k++) {
            LayerRegion r = regions[regionIdx == null ? k : regionIdx[k]];
            if (smallest == null || r.numBlocks() < smallest.numBlocks()) {
                smallest = r;
            }
        }
        if (smallest != null) {
            for (int i = 0; i < ids.length; i++) {
                if (ids[i] < 0 || ids[i] >= smallest.numBlocks()) {
                    throw new InvalidArgumentException(what + "[" + i + "] = " + ids[i] + " out of range [0, "
                            + smallest.numBlocks() + ") for layer '" + smallest.layerName() + "'");
                }
            }
        }
    }

    /** Address of segment {@code segment} of block {@code blockId}; arguments are not checked. */
    public long pieceAddress(long blockId, int segment) {
        return baseAddress + blockId * blockStride + segment * segmentOffset;
    }

    /** One past the last byte any piece may touch, relative to {@code baseAddress}. */
    long extent() {
        return Math.addExact(Math.addExact(
                        Math.multiplyExact((long) numBlocks - 1, blockStride),
                        Math.multiplyExact((long) segments() - 1, segmentOffset)),
                segmentBytes);
    }

    /**
     * Checks the description on its own: positive sizes, pieces inside the region, no piece
     * overlapping another. Throws {@link InvalidArgumentException} naming the field.
     */
    public void validate() {
        Limits.checkName("layer name", layerName);
        if (layerName == null || layerName.isBlank()) {
            throw new InvalidArgumentException("layer name '" + layerName + "' is blank; expected a non-empty name");
        }
        String where = "layer '" + layerName + "'";
        if (layout == null) {
            throw new InvalidArgumentException(where + ": layout is null; expected SPLIT_KV, COMBINED or MLA");
        }
        if (baseAddress <= 0) {
            throw new InvalidArgumentException(where + ": base address 0x" + Long.toHexString(baseAddress)
                    + " is not a valid address; expected a positive address");
        }
        if (regionBytes > Long.MAX_VALUE - baseAddress) {
            throw new InvalidArgumentException(where + ": base address 0x" + Long.toHexString(baseAddress) + " + regionBytes "
                    + regionBytes + " overflows 64 bits; expected a region inside the address space");
        }
        if (numBlocks <= 0) {
            throw new InvalidArgumentException(where + ": numBlocks " + numBlocks + "; expected > 0");
        }
        if (segmentBytes <= 0) {
            throw new InvalidArgumentException(where + ": segmentBytes " + segmentBytes + "; expected > 0");
        }
        if (blockStride <= 0) {
            throw new InvalidArgumentException(where + ": blockStride " + blockStride + "; expected > 0");
        }
        if (segments() == 1 && segmentOffset != 0) {
            throw new InvalidArgumentException(where + ": segmentOffset " + segmentOffset + " with layout " + layout
                    + "; expected 0 (one segment)");
        }
        if (segments() == 2 && segmentOffset <= 0) {
            throw new InvalidArgumentException(where + ": segmentOffset " + segmentOffset
                    + " with layout SPLIT_KV; expected > 0 (offset of V from K)");
        }
        if (numBlocks > 1 && blockStride < segmentBytes) {
            throw new InvalidArgumentException(where + ": blockStride " + blockStride + " < segmentBytes "
                    + segmentBytes + "; consecutive blocks would overlap");
        }
        long extent;
        try {
            extent = extent();
        } catch (ArithmeticException e) {
            throw new InvalidArgumentException(where + ": numBlocks " + numBlocks + " x blockStride " + blockStride
                    + " overflows 64 bits");
        }
        if (regionBytes < extent) {
            throw new InvalidArgumentException(where + ": pieces reach " + extent + " bytes past the base but regionBytes is "
                    + regionBytes + "; expected regionBytes >= " + extent);
        }
        if (segments() == 2 && overlaps(segmentOffset, segmentBytes, segmentBytes, numBlocks, numBlocks, blockStride)) {
            throw new InvalidArgumentException(where + ": segmentOffset " + segmentOffset + " makes K and V pieces overlap"
                    + " (segmentBytes " + segmentBytes + ", blockStride " + blockStride + ")");
        }
    }

    /**
     * Whether any piece of this region overlaps any piece of {@code other}. Regions whose spans
     * interleave are compared exactly when their block strides are equal (one tensor holding
     * several layers); interleaving spans with different strides are reported as overlapping.
     */
    public boolean overlaps(LayerRegion other) {
        long aStart = baseAddress;
        long aEnd = baseAddress + extent();
        long bStart = other.baseAddress;
        long bEnd = other.baseAddress + other.extent();
        if (aEnd <= bStart || bEnd <= aStart) {
            return false;
        }
        if (blockStride != other.blockStride) {
            return true;
        }
        for (int sa = 0; sa < segments(); sa++) {
            for (int sb = 0; sb < other.segments(); sb++) {
                long delta = (other.baseAddress + sb * other.segmentOffset) - (baseAddress + sa * segmentOffset);
                if (overlaps(delta, segmentBytes, other.segmentBytes, numBlocks, other.numBlocks, blockStride)) {
                    return true;
                }
            }
        }
        return false;
    }

    /**
     * Pieces {@code [i*stride, i*stride+lenA)} for i in [0,nA) against
     * {@code [delta+j*stride, delta+j*stride+lenB)} for j in [0,nB): they overlap iff some
     * k = j - i in [-(nA-1), nB-1] has {@code -lenB < delta + k*stride < lenA}.
     */
    static boolean overlaps(long delta, long lenA, long lenB, long nA, long nB, long stride) {
        long kMin = Math.max(Math.floorDiv(-lenB - delta, stride) + 1, -(nA - 1));
        long kMax = Math.min(Math.ceilDiv(lenA - delta, stride) - 1, nB - 1);
        return kMin <= kMax;
    }
}
