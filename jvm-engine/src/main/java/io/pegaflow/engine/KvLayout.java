package io.pegaflow.engine;

/**
 * How one layer's KV bytes for one block are split into segments in a registered region.
 * The engine never assumes tensor shapes: sizes and strides come from {@link LayerRegion}.
 */
public enum KvLayout {
    /** K and V are two separate pieces (per-layer {@code [2, blocks, ...]} or interleaved). */
    SPLIT_KV(2),
    /** K and V of a block are one contiguous piece (e.g. blocks-first {@code [blocks, 2, ...]}). */
    COMBINED(1),
    /** Multi-head latent attention: one latent piece per block, no K/V split. */
    MLA(1);

    private final int segments;

    KvLayout(int segments) {
        this.segments = segments;
    }

    /** Pieces per (block, layer): 2 for split K/V, else 1. */
    public int segments() {
        return segments;
    }
}
