package io.pegaflow.engine.metrics;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.InvalidArgumentException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

/**
 * How many distinct blocks were asked for, and how many lookups, over sliding windows (e.g.
 * 15 minutes, an hour, a day): a HyperLogLog per window, so that an operator sees the hit-rate
 * ceiling, the share of block lookups whose block was asked for before within the window,
 * which a cache of unbounded size would have served. Why a sketch: a day of distinct hashes
 * would not fit in memory; each window costs {@link #SLICES} x 4 KiB here (about 1.6% error).
 *
 * <p>Each window is {@link #SLICES} slices of a sixth of its length; a slice older than the
 * window is cleared as time passes, so a window's estimate covers between five and six sixths
 * of it back from now. Any thread; one lock per window, held for a query's hashes at a time.
 */
public final class DistinctBlocks {
    /** Slices per window: the estimate covers the last (SLICES - 1) to SLICES sixths. */
    public static final int SLICES = 6;
    private static final int P = 12;
    private static final int M = 1 << P;
    /** The most windows a store keeps (each is 24 KiB). */
    public static final int MAX_WINDOWS = 8;

    private static final java.lang.invoke.VarHandle LONGS =
            java.lang.invoke.MethodHandles.byteArrayViewVarHandle(long[].class, java.nio.ByteOrder.LITTLE_ENDIAN);

    private final List<Window> windows = new ArrayList<>();

    /** One sliding window: its name (as given, e.g. {@code 15m}) and length. */
    public static final class Window {
        private final String name;
        private final long sliceNanos;
        private final byte[][] registers = new byte[SLICES][M];
        private final long[] lookups = new long[SLICES];
        private final long[] sliceOf = new long[SLICES];

        Window(String name, Duration length) {
            this.name = name;
            this.sliceNanos = Math.max(1, length.toNanos() / SLICES);
            java.util.Arrays.fill(sliceOf, Long.MIN_VALUE);
        }

        public String name() {
            return name;
        }

        /** The slot of the slice that holds {@code now}, cleared when it held an older slice. */
        private int slot(long now) {
            long slice = Math.floorDiv(now, sliceNanos);
            int i = (int) Math.floorMod(slice, SLICES);
            if (sliceOf[i] != slice) {
                java.util.Arrays.fill(registers[i], (byte) 0);
                lookups[i] = 0;
                sliceOf[i] = slice;
            }
            return i;
        }

        private boolean live(int i, long now) {
            return sliceOf[i] > Math.floorDiv(now, sliceNanos) - SLICES;
        }

        synchronized void add(long[] keys, long now) {
            int slot = slot(now);
            byte[] r = registers[slot];
            lookups[slot] += keys.length;
            for (long k : keys) {
                int idx = (int) (k >>> (64 - P));
                int rank = Math.min(64 - P, Long.numberOfLeadingZeros((k << P) | (1L << (P - 1)))) + 1;
                if (rank > r[idx]) {
                    r[idx] = (byte) rank;
                }
            }
        }

        /** Distinct blocks asked for within the window, estimated. */
        public synchronized double distinct(long now) {
            byte[] merged = new byte[M];
            boolean any = false;
            for (int i = 0; i < SLICES; i++) {
                if (!live(i, now)) {
                    continue;
                }
                any = true;
                byte[] r = registers[i];
                for (int j = 0; j < M; j++) {
                    if (r[j] > merged[j]) {
                        merged[j] = r[j];
                    }
                }
            }
            return any ? estimate(merged) : 0;
        }

        /** Block lookups within the window (each hash of each query). */
        public synchronized long lookups(long now) {
            long sum = 0;
            for (int i = 0; i < SLICES; i++) {
                if (live(i, now)) {
                    sum += lookups[i];
                }
            }
            return sum;
        }

        /**
         * The hit-rate ceiling within the window: the share of lookups whose block was asked for
         * before (1 - distinct / lookups; 0 without lookups).
         */
        public double ceiling(long now) {
            long n = lookups(now);
            return n == 0 ? 0 : Math.max(0, 1 - distinct(now) / n);
        }
    }

    /**
     * Windows by their lengths, written as {@code 15m}, {@code 1h}, {@code 1d}, {@code 30s}
     * (empty: none). Refuses a length that does not parse, is not positive, or more than
     * {@link #MAX_WINDOWS} of them, naming the value.
     */
    public static DistinctBlocks of(List<String> lengths) {
        List<Duration> parsed = check(lengths);
        DistinctBlocks d = new DistinctBlocks();
        for (int i = 0; i < parsed.size(); i++) {
            d.windows.add(new Window(lengths.get(i), parsed.get(i)));
        }
        return d;
    }

    /** The windows' lengths, or the refusal {@link #of} would give (a config checks with this, allocating nothing). */
    public static List<Duration> check(List<String> lengths) {
        if (lengths.size() > MAX_WINDOWS) {
            throw new InvalidArgumentException(lengths.size() + " hit-ceiling windows " + lengths + "; expected at most " + MAX_WINDOWS);
        }
        return lengths.stream().map(DistinctBlocks::parse).toList();
    }

    static Duration parse(String text) {
        String t = text.strip();
        if (t.length() >= 2) {
            char unit = t.charAt(t.length() - 1);
            try {
                long n = Long.parseLong(t.substring(0, t.length() - 1));
                Duration d = switch (unit) {
                    case 's' -> Duration.ofSeconds(n);
                    case 'm' -> Duration.ofMinutes(n);
                    case 'h' -> Duration.ofHours(n);
                    case 'd' -> Duration.ofDays(n);
                    default -> null;
                };
                if (d != null && n > 0 && n <= 366L * 24 * 3600) {
                    return d;
                }
            } catch (NumberFormatException ignored) {
                // named below
            }
        }
        throw new InvalidArgumentException("hit-ceiling window '" + text + "'; expected a positive length such as 30s, 15m, 1h or 1d");
    }

    public List<Window> windows() {
        return List.copyOf(windows);
    }

    /** Counts a query of {@code hashes} in {@code namespace} at {@code now} (nanoseconds) in every window. */
    public void observe(String namespace, BlockHashes hashes, long now) {
        if (windows.isEmpty() || hashes.count() == 0) {
            return;
        }
        long seed = mix(namespace.hashCode() * 0x9E3779B97F4A7C15L);
        byte[] packed = hashes.packed();
        int len = hashes.hashLen();
        long[] keys = new long[hashes.count()];
        for (int i = 0; i < keys.length; i++) {
            int at = i * len;
            long h = seed;
            if (len >= 16) {
                // vLLM's block hashes are already uniform (SHA-256 or xxHash): two words of each suffice
                h ^= (long) LONGS.get(packed, at) ^ Long.rotateLeft((long) LONGS.get(packed, at + len - 8), 29);
            } else {
                for (int b = 0; b < len; b++) {
                    h = (h ^ (packed[at + b] & 0xff)) * 0x100000001B3L; // FNV-1a for short hashes
                }
            }
            keys[i] = mix(h);
        }
        for (Window w : windows) {
            w.add(keys, now);
        }
    }

    /** MurmurHash3's 64-bit finalizer: every input bit moves every output bit. */
    static long mix(long k) {
        k ^= k >>> 33;
        k *= 0xff51afd7ed558ccdL;
        k ^= k >>> 33;
        k *= 0xc4ceb9fe1a85ec53L;
        k ^= k >>> 33;
        return k;
    }

    /** HyperLogLog's estimate with the small-range correction (linear counting). */
    static double estimate(byte[] registers) {
        double sum = 0;
        int zeros = 0;
        for (byte r : registers) {
            sum += 1.0 / (1L << r);
            if (r == 0) {
                zeros++;
            }
        }
        double alpha = 0.7213 / (1 + 1.079 / M);
        double e = alpha * M * M / sum;
        if (e <= 2.5 * M && zeros > 0) {
            return M * Math.log((double) M / zeros);
        }
        return e;
    }
}
