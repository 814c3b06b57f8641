package io.pegaflow.engine;

import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import java.util.function.Consumer;
import java.util.stream.LongStream;

/**
 * Property tests as plain seeded JUnit 5: a property is a
 * {@code @ParameterizedTest(name = "seed {0}")} over a {@code @MethodSource} returning
 * {@link #seeds(int) seeds(tries)}, whose body hands the seed to {@link #check}. There a
 * {@link Gen} seeded with it draws the inputs, and a failure is rethrown with the seed and the
 * drawn inputs in its message. The seeds are a fixed list, so every run checks the same tries.
 *
 * <p>Rerun one seed (printed in the test's display name and in the failure message):
 * {@code ./mvnw -pl jvm-engine test -Dtest=OffsetAllocatorProperties -Dpegaflow.seed=123};
 * every seeded property selected then runs that seed alone. {@code -Dpegaflow.tries=N} runs
 * N tries per property instead of its own count (a longer soak; the default seeds come first).
 */
public final class Seeds {
    /** System property naming the one seed to run. */
    public static final String SEED_PROPERTY = "pegaflow.seed";
    /** System property overriding every property's number of tries. */
    public static final String TRIES_PROPERTY = "pegaflow.tries";
    private static final long BASE = 20261130L;

    private Seeds() {
    }

    /** The seeds of a property with {@code tries} tries, or the one seed given by {@value #SEED_PROPERTY}. */
    public static LongStream seeds(int tries) {
        String one = System.getProperty(SEED_PROPERTY);
        if (one != null && !one.isBlank()) {
            return LongStream.of(Long.parseLong(one.strip()));
        }
        String n = System.getProperty(TRIES_PROPERTY);
        int count = n != null && !n.isBlank() ? Integer.parseInt(n.strip()) : tries;
        return new SplittableRandom(BASE).longs(count, 0, Long.MAX_VALUE);
    }

    /** Runs one try: {@code body} draws its inputs from a {@link Gen} seeded with {@code seed}. */
    public static void check(long seed, Consumer<Gen> body) {
        Gen gen = new Gen(seed);
        try {
            body.accept(gen);
        } catch (AssertionError | RuntimeException e) {
            throw new AssertionError("seed " + seed + " failed (rerun alone with -D" + SEED_PROPERTY + "=" + seed
                    + "); inputs " + gen + ": " + e.getMessage(), e);
        }
    }

    /**
     * Draws inputs the way the property library did: any value of the range, the range's
     * boundaries now and then (1 in 16), and in wide ranges small offsets from the minimum
     * often (7 in 16: a uniformly chosen bit length, then a value of that length).
     */
    public static final class Gen {
        private final SplittableRandom rnd;
        private final List<String> drawn = new ArrayList<>();

        Gen(long seed) {
            this.rnd = new SplittableRandom(seed);
        }

        public int intIn(String name, int min, int max) {
            return (int) draw(name, min, max);
        }

        public long longIn(String name, long min, long max) {
            return draw(name, min, max);
        }

        public <E> E oneOf(String name, E[] values) {
            E v = values[rnd.nextInt(values.length)];
            drawn.add(name + "=" + v);
            return v;
        }

        private long draw(String name, long min, long max) {
            if (min > max || min == Long.MIN_VALUE || max - min < 0) {
                throw new IllegalArgumentException("range " + min + ".." + max + " not supported");
            }
            long span = max - min;
            int pick = rnd.nextInt(16);
            long v;
            if (pick == 0) {
                long[] edges = {min, Math.min(min + 1, max), Math.max(max - 1, min), max};
                v = edges[rnd.nextInt(edges.length)];
            } else if (pick < 8 && span > 64) {
                int bits = 1 + rnd.nextInt(64 - Long.numberOfLeadingZeros(span));
                long offset = rnd.nextLong() >>> (64 - bits);
                v = offset <= span ? min + offset : uniform(min, max);
            } else {
                v = uniform(min, max);
            }
            drawn.add(name + "=" + v);
            return v;
        }

        private long uniform(long min, long max) {
            return rnd.nextLong(min - 1, max) + 1;
        }

        @Override
        public String toString() {
            return drawn.toString();
        }
    }
}
