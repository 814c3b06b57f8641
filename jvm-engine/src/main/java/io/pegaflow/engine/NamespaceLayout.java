package io.pegaflow.engine;

import java.util.List;

/**
 * What every block of a namespace looks like in the host pool: the sorted layer names (a
 * layer's id is its index), the TP size, and each layer's segment geometry. Slot
 * {@code layerId * tpSize + tpRank} holds {@code segments} segments of {@code segmentBytes}.
 * Two instances may share a namespace only if their layouts are equal.
 */
record NamespaceLayout(int tpSize, List<LayerGeometry> layers) {
    record LayerGeometry(String name, KvLayout layout, long segmentBytes) {
        long slotBytes() {
            return segmentBytes * layout.segments();
        }
    }

    int slotCount() {
        return layers.size() * tpSize;
    }

    int slot(int layerId, int tpRank) {
        return layerId * tpSize + tpRank;
    }

    long slotBytes(int slot) {
        return layers.get(slot / tpSize).slotBytes();
    }

    /** Total host bytes of one sealed block (every layer, every TP rank). */
    long blockBytes() {
        long total = 0;
        for (LayerGeometry g : layers) {
            total += g.slotBytes() * tpSize;
        }
        return total;
    }
}
