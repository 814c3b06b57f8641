package io.pegaflow.engine.ssd;

import java.util.Arrays;

/** A block on SSD: its namespace and vLLM hash (a private copy). */
record SsdKey(String namespace, byte[] hash) {
    @Override
    public boolean equals(Object o) {
        return o instanceof SsdKey k && Arrays.equals(k.hash, hash) && k.namespace.equals(namespace);
    }

    @Override
    public int hashCode() {
        return Arrays.hashCode(hash) * 31 + namespace.hashCode();
    }
}
