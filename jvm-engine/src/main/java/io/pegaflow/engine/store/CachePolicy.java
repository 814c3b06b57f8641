package io.pegaflow.engine.store;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.InvalidArgumentException;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.util.Arrays;

/**
 * Which blocks the pool takes in, and which it gives up under pressure, beyond "every block,
 * least recently used first".
 *
 * <ul>
 *   <li><b>Admission</b> {@code all} (default) or {@code seen:N}: a save writes a block only
 *       once lookups have asked for its hash N times (vLLM's {@code store_threshold}): a prefix
 *       asked for once is never written, which saves pool space and copy bandwidth for the
 *       prefixes that come back. The first rank to save a block decides; other ranks' saves of
 *       a block already in flight follow it.
 *   <li><b>Eviction</b> {@code lru} (default) or {@code lfu}: of the {@link #SAMPLE} least
 *       recently used unreferenced blocks, the one asked for least (ties: the oldest), so a
 *       shared system prompt outlives a burst of one-off prefixes.
 * </ul>
 *
 * <p>Both read one frequency sketch of the lookups (TinyLFU's: a count-min sketch of 4 rows
 * of 4-bit counters, every counter halved after {@code 10 x width} increments, so old
 * popularity fades). Why a sketch: a count per hash ever asked for grows without bound; the
 * sketch is a fixed 256 KiB and over-counts only on collisions (an admission can come a lookup
 * early, an eviction choose a slightly less popular block). With both policies at their
 * defaults nothing is counted. Guarded by the store's lock.
 */
public final class CachePolicy {
    /** Blocks looked at, from the least recently used, to choose an {@code lfu} victim. */
    static final int SAMPLE = 16;
    /** The largest N of {@code seen:N} (a 4-bit counter's range). */
    static final int MAX_SEEN = 15;
    private static final int ROWS = 4;
    private static final int WIDTH = 1 << 16;
    private static final VarHandle LONG = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);

    /** Lookups a block needs before a save writes it (1: every block). */
    final int admitAfter;
    /** Whether eviction weighs frequency ({@code lfu}). */
    final boolean lfu;
    private final byte[][] counters;
    private int increments;

    private CachePolicy(int admitAfter, boolean lfu) {
        this.admitAfter = admitAfter;
        this.lfu = lfu;
        this.counters = admitAfter > 1 || lfu ? new byte[ROWS][WIDTH] : null;
    }

    /** The defaults: every block admitted, least recently used evicted first. */
    static final CachePolicy DEFAULT = new CachePolicy(1, false);

    /**
     * The policy of flags {@code admission} ({@code all} or {@code seen:N}, N in 1..15) and
     * {@code eviction} ({@code lru} or {@code lfu}); a bad value is refused naming it.
     */
    static CachePolicy of(String admission, String eviction) {
        return new CachePolicy(admitAfter(admission), lfu(eviction));
    }

    /**
     * Checks both flags without building a policy (no sketch is allocated). Public for
     * {@link io.pegaflow.engine.EngineConfig}, which checks its flags with it.
     */
    public static void check(String admission, String eviction) {
        admitAfter(admission);
        lfu(eviction);
    }

    private static int admitAfter(String admission) {
        if (admission == null || admission.equals("all")) {
            return 1;
        }
        if (admission.startsWith("seen:")) {
            try {
                int n = Integer.parseInt(admission.substring(5));
                if (n >= 1 && n <= MAX_SEEN) {
                    return n;
                }
            } catch (NumberFormatException ignored) {
                // refused below
            }
        }
        throw new InvalidArgumentException("admission '" + admission + "'; expected all or seen:N with N in 1.." + MAX_SEEN);
    }

    private static boolean lfu(String eviction) {
        if (eviction == null || eviction.equals("lru")) {
            return false;
        }
        if (eviction.equals("lfu")) {
            return true;
        }
        throw new InvalidArgumentException("eviction '" + eviction + "'; expected lru or lfu");
    }

    /** Whether lookups are counted (some policy reads the sketch). */
    boolean counts() {
        return counters != null;
    }

    /** Under lock: a lookup asked for every hash of {@code hashes} in namespace {@code ns}. */
    void looked(NamespaceIndex ns, BlockHashes hashes) {
        if (counters == null) {
            return;
        }
        int len = hashes.hashLen();
        int salt = ns.namespace.hashCode();
        for (int i = 0; i < hashes.count(); i++) {
            increment(mix(hashes.packed(), i * len, len, salt));
        }
    }

    /** Under lock: whether a save writes the new block {@code key} of namespace {@code ns}. */
    boolean admits(NamespaceIndex ns, HashKey key) {
        if (admitAfter <= 1) {
            return true;
        }
        byte[] b = key.bytes();
        return frequency(mix(b, 0, b.length, ns.namespace.hashCode())) >= admitAfter;
    }

    /** Under lock: how often lookups asked for the sealed block {@code b} lately (0 without a sketch). */
    int frequency(Block b) {
        if (counters == null) {
            return 0;
        }
        byte[] k = b.key.bytes();
        return frequency(mix(k, 0, k.length, b.ns.namespace.hashCode()));
    }

    private void increment(long h) {
        boolean grew = false;
        for (int r = 0; r < ROWS; r++) {
            int at = index(h, r);
            if (counters[r][at] < 15) {
                counters[r][at]++;
                grew = true;
            }
        }
        if (grew && ++increments >= 10 * WIDTH) {
            age();
        }
    }

    private int frequency(long h) {
        int min = 15;
        for (int r = 0; r < ROWS; r++) {
            min = Math.min(min, counters[r][index(h, r)]);
        }
        return min;
    }

    /** Halves every counter: popularity of long ago fades. */
    private void age() {
        for (byte[] row : counters) {
            for (int i = 0; i < row.length; i++) {
                row[i] = (byte) (row[i] >> 1);
            }
        }
        increments /= 2;
    }

    private static int index(long h, int row) {
        long x = h * (0x9E3779B97F4A7C15L + 2L * row) + row;
        x ^= x >>> 29;
        return (int) (x & (WIDTH - 1));
    }

    /** A 64-bit digest of one key: vLLM hashes are uniform, so 8 of their bytes suffice; shorter ones are hashed. */
    private static long mix(byte[] packed, int off, int len, int salt) {
        long x = len >= 8 ? (long) LONG.get(packed, off) : Arrays.hashCode(Arrays.copyOfRange(packed, off, off + len));
        x ^= salt * 0xC2B2AE3D27D4EB4FL;
        x ^= x >>> 33;
        x *= 0xFF51AFD7ED558CCDL;
        x ^= x >>> 33;
        return x;
    }
}
