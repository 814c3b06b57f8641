package io.pegaflow.engine;

import java.util.HashMap;
import java.util.Map;

/** The blocks of one namespace, sealed and in flight, keyed by vLLM hash. Guarded by the engine lock. */
final class NamespaceIndex {
    final String namespace;
    final NamespaceLayout layout;
    final Map<HashKey, Block> blocks = new HashMap<>();

    NamespaceIndex(String namespace, NamespaceLayout layout) {
        this.namespace = namespace;
        this.layout = layout;
    }
}
