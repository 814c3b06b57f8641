package io.pegaflow.server.cluster;

import io.lettuce.core.KeyValue;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.server.cluster.BlockRegistry.Node;
import io.pegaflow.server.cluster.BlockRegistry.Owner;
import io.pegaflow.server.cluster.RedisBlockRegistry.Link;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The longest prefix one other live host holds: one {@code MGET} of a few block keys of the
 * asked prefix ({@link #probes}), whose bitmaps are intersected with the live owners. Any
 * thread (the callers' own; reads {@link RegistryMembership}'s state), blocking up to one
 * Redis timeout. Bits of hosts that left are queued for cleanup as they are seen.
 */
final class RegistryLookup {
    private final RedisBlockRegistry.Settings settings;
    private final RegistryMembership membership;
    private final AdvertisementQueue queue;
    private final RegistryKeys keys;
    private final AtomicLong lookups = new AtomicLong();

    RegistryLookup(RedisBlockRegistry.Settings settings, RegistryMembership membership, AdvertisementQueue queue, RegistryKeys keys) {
        this.settings = settings;
        this.membership = membership;
        this.queue = queue;
        this.keys = keys;
    }

    long lookups() {
        return lookups.get();
    }

    /** See {@link BlockRegistry#lookup}. */
    Owner lookup(String namespace, BlockHashes hashes, List<String> excluded) throws Exception {
        Link c = membership.ask();
        if (c == null || !membership.connected()) {
            throw new IllegalStateException("registry not connected");
        }
        long now = System.currentTimeMillis();
        Map<Integer, Node> candidates = new HashMap<>();
        for (Node n : membership.live()) {
            if (membership.fresh(n, now) && (excluded == null || !excluded.contains(n.id()))) {
                candidates.put(n.index(), n);
            }
        }
        if (candidates.isEmpty() || hashes.count() == 0) {
            return Owner.NONE;
        }
        lookups.incrementAndGet();
        int count = hashes.count();
        int len = hashes.hashLen();
        int[] probes = probes(count);
        byte[][] probed = new byte[probes.length][];
        for (int k = 0; k < probes.length; k++) {
            probed[k] = keys.key(namespace, hashes.packed(), probes[k] * len, len);
        }
        List<KeyValue<byte[], byte[]>> values = c.str().mget(probed).get(settings.timeout().toMillis(), TimeUnit.MILLISECONDS);
        Set<Integer> alive = new HashSet<>(candidates.keySet());
        Set<Integer> known = new HashSet<>();
        for (Node n : membership.live()) {
            known.add(n.index());
        }
        known.add(membership.index());
        int run = count;
        for (int k = 0; k < values.size(); k++) {
            KeyValue<byte[], byte[]> kv = values.get(k);
            byte[] bits = kv.hasValue() ? kv.getValue() : null;
            Set<Integer> next = new HashSet<>();
            if (bits != null) {
                for (int i = 0; i < bits.length * 8; i++) {
                    if (!bit(bits, i)) {
                        continue;
                    }
                    if (alive.contains(i)) {
                        next.add(i);
                    } else if (!known.contains(i)) {
                        queue.forgetDeparted(probed[k], i); // a host that left: cleaned up now that it was seen
                    }
                }
            }
            if (next.isEmpty()) {
                run = probes[k]; // held up to some block before this probe: the owner's pin says exactly where
                break;
            }
            alive = next;
        }
        if (run == 0) {
            return Owner.NONE;
        }
        List<Integer> holders = new ArrayList<>(alive);
        int pick = holders.get(ThreadLocalRandom.current().nextInt(holders.size()));
        return new Owner(candidates.get(pick), run);
    }

    /**
     * The blocks a lookup asks Redis about: 0, 1, 3, 7, ... (2^k - 1) and the last. A prefix is
     * saved and evicted mostly as a whole, so these bound the run held by one owner; the owner's
     * pin then returns its exact resident prefix (the registry is a hint, the pin the truth).
     * 2,048 hashes cost 12 keys instead of 2,048.
     */
    static int[] probes(int count) {
        int[] out = new int[34];
        int n = 0;
        for (long p = 0; p < count; p = p * 2 + 1) {
            out[n++] = (int) p;
        }
        if (out[n - 1] != count - 1) {
            out[n++] = count - 1;
        }
        return Arrays.copyOf(out, n);
    }

    static boolean bit(byte[] bits, int i) {
        int b = i >>> 3;
        return b < bits.length && ((bits[b] >> (7 - (i & 7))) & 1) != 0;
    }
}
