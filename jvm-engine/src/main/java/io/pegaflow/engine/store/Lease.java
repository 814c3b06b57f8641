package io.pegaflow.engine.store;

import io.pegaflow.engine.Token;
import java.util.BitSet;

/**
 * Pins the blocks of a query's hit prefix until every worker of the instance has consumed
 * its share by loading, the lease is released, or it expires. Guarded by the engine lock.
 */
final class Lease {
    final Token id;
    final Instance instance;
    final Block[] blocks;
    final BitSet consumedBy = new BitSet();
    final long expiresAtNanos;

    Lease(Token id, Instance instance, Block[] blocks, long expiresAtNanos) {
        this.id = id;
        this.instance = instance;
        this.blocks = blocks;
        this.expiresAtNanos = expiresAtNanos;
    }

    boolean fullyConsumed() {
        return consumedBy.cardinality() == instance.spec.worldSize();
    }
}
