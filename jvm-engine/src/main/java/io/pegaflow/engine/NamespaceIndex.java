package io.pegaflow.engine;

/** The blocks of one namespace, sealed and in flight, keyed by vLLM hash. Guarded by the engine lock. */
final class NamespaceIndex {
    final String namespace;
    final NamespaceLayout layout;
    final BlockTable blocks = new BlockTable();

    NamespaceIndex(String namespace, NamespaceLayout layout) {
        this.namespace = namespace;
        this.layout = layout;
    }
}
