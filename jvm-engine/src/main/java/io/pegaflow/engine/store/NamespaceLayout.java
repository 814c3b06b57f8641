package io.pegaflow.engine.store;

import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.Limits;
import java.util.List;

/**
 * What every block of a namespace looks like in the host pool: the sorted layer names (a
 * layer's id is its index), the TP size, and each layer's segment geometry. Slot
 * {@code layerId * tpSize + tpRank} holds {@code segments} segments of {@code segmentBytes}.
 * Two instances may share a namespace only if their layouts are equal. Every block holds a
 * slot array, so the slot count is capped ({@link Limits#MAX_SLOTS_PER_BLOCK}).
 */
record NamespaceLayout(int tpSize, List<LayerGeometry> layers) {
    NamespaceLayout {
        if ((long) layers.size() * tpSize > Limits.MAX_SLOTS_PER_BLOCK) {
            throw new InvalidArgumentException(layers.size() + " layers x tp size " + tpSize + " = "
                    + (long) layers.size() * tpSize + " slots per block; expected at most " + Limits.MAX_SLOTS_PER_BLOCK
                    + " (Limits.MAX_SLOTS_PER_BLOCK)");
        }
    }

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
