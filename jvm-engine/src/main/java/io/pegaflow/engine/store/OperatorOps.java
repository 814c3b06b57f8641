package io.pegaflow.engine.store;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.ssd.SsdTier;
import io.pegaflow.engine.store.LocalStore.Cleared;
import io.pegaflow.engine.store.LocalStore.NamespaceSummary;
import io.pegaflow.engine.store.LocalStore.Pinned;
import io.pegaflow.engine.store.LocalStore.Warming;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.function.Function;
import java.util.function.LongSupplier;
import java.util.function.ObjLongConsumer;

/**
 * The operator's calls (pegaflow-server's {@code /admin}, and vLLM's reset_cache): clear,
 * pin and unpin, warm, the namespaces' summary, and the operator's pins ({@link AdminPins}).
 * Runs under {@link LocalStore}'s lock: each call, made on the server's threads through the
 * store's public methods, takes it (and {@link #clear} leaves it to walk the SSD tier's index).
 */
final class OperatorOps {
    private final StoreLock lock;
    private final PoolSpace pool;
    private final InstanceRegistry registry;
    private final SsdReadBack readBack;
    private final ObjLongConsumer<Counter> count;
    private final LongSupplier clock;
    /** Blocks the operator pinned; guarded by lock. */
    private final AdminPins pins;

    OperatorOps(StoreLock lock, PoolSpace pool, InstanceRegistry registry, SsdReadBack readBack,
            ObjLongConsumer<Counter> count, LongSupplier clock) {
        this.lock = lock;
        this.pool = pool;
        this.registry = registry;
        this.readBack = readBack;
        this.count = count;
        this.clock = clock;
        this.pins = new AdminPins(pool.capacityBytes());
    }

    /** The operator's pins; under lock. */
    AdminPins pins() {
        return pins;
    }

    /** See {@link LocalStore#clear}. */
    Cleared clear(String namespace, boolean dram, boolean ssd) {
        long blocks = 0;
        long bytes = 0;
        long referenced = 0;
        long unpinned = 0;
        boolean known;
        lock.lock();
        try {
            lock.checkOpen();
            NamespaceIndex only = namespace == null ? null : registry.namespace(namespace);
            known = namespace == null || only != null;
            if (dram && known) {
                for (Block b : pins.of(only)) {
                    pins.unpin(b);
                    pool.unpin(b);
                    unpinned++;
                }
                for (NamespaceIndex ns : only == null ? List.copyOf(registry.namespaces()) : List.of(only)) {
                    for (Block b : ns.blocks.values()) {
                        if (!b.sealed) {
                            continue;
                        }
                        if (b.refs > 0) {
                            referenced++;
                            continue;
                        }
                        bytes += b.bytes;
                        blocks++;
                        pool.drop(b);
                    }
                }
                count.accept(Counter.ADMIN_CLEARED_BLOCKS, blocks);
            }
        } finally {
            lock.unlock();
        }
        // Outside the lock: it walks the whole disk index, and the tier is thread-safe.
        SsdTier tier = readBack.tier();
        long records = ssd && tier != null ? tier.forget(namespace) : 0;
        count.accept(Counter.ADMIN_CLEARED_SSD_BLOCKS, records);
        if (!known && records == 0 && (tier == null || !tier.holds(namespace))) { // nothing changed
            return null;
        }
        return new Cleared(blocks, bytes, referenced, unpinned, records);
    }

    /** The namespace of a registered instance (takes the lock). */
    String namespaceOf(String instanceId) {
        return lock.locked(() -> {
            lock.checkOpen();
            return registry.get(instanceId).spec.namespace();
        });
    }

    /** See {@link LocalStore#resetCache}. */
    Cleared resetCache(String instanceId) {
        Cleared c = clear(namespaceOf(instanceId), true, true);
        return c != null ? c : new Cleared(0, 0, 0, 0, 0);
    }

    /** See {@link LocalStore#pin}. */
    Pinned pin(String namespace, BlockHashes hashes) {
        return onNamespace("pin", namespace, hashes, null, ns -> {
            Block[] found = new Block[hashes.count()];
            int hit = ns.blocks.sealedPrefix(hashes.packed(), hashes.hashLen(), hashes.count(), found);
            int pinned = pins.pinAll(found, hit, pool.lru());
            return new Pinned(pinned, hit - pinned, hashes.count() - hit);
        });
    }

    /** See {@link LocalStore#unpin}. */
    int unpin(String namespace, BlockHashes hashes) {
        return onNamespace("unpin", namespace, hashes, -1, ns -> {
            byte[] packed = hashes.packed();
            int len = hashes.hashLen();
            int n = 0;
            for (int i = 0; i < hashes.count(); i++) {
                Block b = ns.blocks.get(packed, i * len, len);
                if (b != null && pins.unpin(b)) {
                    pool.unpin(b);
                    n++;
                }
            }
            return n;
        });
    }

    /** See {@link LocalStore#warm}. */
    Warming warm(String namespace, BlockHashes hashes) {
        return onNamespace("warm", namespace, hashes, null, ns -> {
            if (readBack.tier() == null) {
                throw new InvalidArgumentException("warm: this store has no SSD tier (pegaflow-server --ssd-cache-path)");
            }
            Block[] found = new Block[hashes.count()];
            int hit = ns.blocks.sealedPrefix(hashes.packed(), hashes.hashLen(), hashes.count(), found);
            for (int i = 0; i < hit; i++) {
                pool.pin(found[i]); // as a query does: the read-back must not evict the prefix it continues
            }
            try {
                long before = readBack.readsQueued();
                int reading = hit < hashes.count() ? readBack.prefetch(ns, hashes, hit, clock.getAsLong()) : 0;
                count.accept(Counter.ADMIN_WARMED_BLOCKS, readBack.readsQueued() - before);
                return new Warming(hit, reading);
            } finally {
                for (int i = 0; i < hit; i++) {
                    pool.unpin(found[i]);
                }
            }
        });
    }

    /** An operator's call on {@code namespace} under the lock; {@code unknown} when no sealed instance created it. */
    private <T> T onNamespace(String what, String namespace, BlockHashes hashes, T unknown, Function<NamespaceIndex, T> call) {
        if (hashes == null) {
            throw new InvalidArgumentException(what + ": hashes must not be null");
        }
        return lock.locked(() -> {
            lock.checkOpen();
            NamespaceIndex ns = namespace == null ? null : registry.namespace(namespace);
            return ns == null ? unknown : call.apply(ns);
        });
    }

    /** See {@link LocalStore#namespaces}. */
    List<NamespaceSummary> namespaces() {
        return lock.locked(() -> {
            List<NamespaceSummary> out = new ArrayList<>();
            for (NamespaceIndex ns : registry.namespaces()) {
                int pinned = 0;
                long pinnedBytes = 0;
                for (Block b : pins.of(ns)) {
                    pinned++;
                    pinnedBytes += b.bytes;
                }
                out.add(new NamespaceSummary(ns.namespace, ns.blocks.size(), pinned, pinnedBytes));
            }
            out.sort(Comparator.comparing(NamespaceSummary::namespace));
            return out;
        });
    }
}
