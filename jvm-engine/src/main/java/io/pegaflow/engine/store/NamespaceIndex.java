package io.pegaflow.engine.store;

/** The blocks of one namespace, sealed and in flight, keyed by vLLM hash. Guarded by the engine lock. */
final class NamespaceIndex {
    final String namespace;
    final NamespaceLayout layout;
    final BlockTable blocks = new BlockTable();
    /** Each slot's bytes, in slot order: a block's payload on SSD is their concatenation. */
    final long[] slotBytes;
    final long blockBytes;

    NamespaceIndex(String namespace, NamespaceLayout layout) {
        this.namespace = namespace;
        this.layout = layout;
        this.slotBytes = new long[layout.slotCount()];
        for (int s = 0; s < slotBytes.length; s++) {
            slotBytes[s] = layout.slotBytes(s);
        }
        this.blockBytes = layout.blockBytes();
    }
}
