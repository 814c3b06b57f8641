package io.pegaflow.engine.store;

import io.pegaflow.engine.QuotaExceededException;
import io.pegaflow.engine.Sizes;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Set;

/**
 * The blocks an operator pinned (pegaflow-server's {@code POST /admin/pin}): each holds one
 * reference ({@link LruList#pin}), so it is never evicted until unpinned or cleared. Pins hold
 * at most half the pool ({@link #maxBytes}, the bound a query's read-back from SSD keeps too),
 * so saves always find room; a pin that would pass it is refused whole. The store has no
 * per-tenant share of pool bytes to hold them to (docs/security.md). Guarded by LocalStore's lock.
 */
final class AdminPins {
    private final long maxBytes;
    private final Set<Block> pinned = new LinkedHashSet<>();
    private long bytes;

    AdminPins(long poolBytes) {
        this.maxBytes = poolBytes / 2;
    }

    long maxBytes() {
        return maxBytes;
    }

    int blocks() {
        return pinned.size();
    }

    long bytes() {
        return bytes;
    }

    /**
     * Pins {@code blocks[0, n)} (sealed; repeats allowed) and returns how many were newly
     * pinned; refuses the whole call, before anything changes, when the new ones would take
     * pinned bytes past half the pool.
     */
    int pinAll(Block[] blocks, int n, LruList lru) {
        long more = 0;
        Set<Block> fresh = java.util.Collections.newSetFromMap(new java.util.IdentityHashMap<>());
        for (int i = 0; i < n; i++) {
            if (!blocks[i].adminPinned && fresh.add(blocks[i])) {
                more += blocks[i].bytes;
            }
        }
        if (bytes + more > maxBytes) {
            throw new QuotaExceededException("pinning " + Sizes.format(more) + " more would hold " + Sizes.format(bytes + more)
                    + " pinned; expected at most half the pool (" + Sizes.format(maxBytes) + "): unpin some first");
        }
        for (Block b : fresh) {
            b.adminPinned = true;
            pinned.add(b);
            bytes += b.bytes;
            lru.pin(b);
        }
        return fresh.size();
    }

    /** Drops the operator's reference; false when the block was not pinned. The caller unpins it in the LRU. */
    boolean unpin(Block b) {
        if (!b.adminPinned) {
            return false;
        }
        b.adminPinned = false;
        pinned.remove(b);
        bytes -= b.bytes;
        return true;
    }

    /** The pinned blocks of {@code ns} (null: all), copied. */
    List<Block> of(NamespaceIndex ns) {
        List<Block> out = new ArrayList<>();
        for (Block b : pinned) {
            if (ns == null || b.ns == ns) {
                out.add(b);
            }
        }
        return out;
    }

    void clear() {
        for (Block b : pinned) {
            b.adminPinned = false;
        }
        pinned.clear();
        bytes = 0;
    }

    /** Each pinned block is sealed, indexed and flagged, and the bytes add up. */
    void verify() {
        long sum = 0;
        for (Block b : pinned) {
            LocalStore.require(b.adminPinned && b.sealed && !b.removed && b.refs > 0, "pinned block " + b.key + " adminPinned="
                    + b.adminPinned + " sealed=" + b.sealed + " removed=" + b.removed + " refs=" + b.refs);
            sum += b.bytes;
        }
        LocalStore.require(sum == bytes, "admin pins hold " + sum + " bytes but count " + bytes);
    }
}
