package io.pegaflow.bench;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * The medians the bench commands report and the per-operation lists they keep: a median
 * stands for a case, since the first and the odd slow operation are not its steady cost.
 */
final class Stats {
    private Stats() {}

    static double median(double[] t) {
        double[] s = t.clone();
        Arrays.sort(s);
        return s[s.length / 2];
    }

    /** Where the median of {@code x} sits in it: the operation whose timeline stands for the case. */
    static int medianIndex(double[] x) {
        Integer[] order = new Integer[x.length];
        for (int i = 0; i < x.length; i++) {
            order[i] = i;
        }
        Arrays.sort(order, (a, b) -> Double.compare(x[a], x[b]));
        return order[x.length / 2];
    }

    /** Seconds to the microsecond, for the report's per-operation lists. */
    static List<Double> rounded(double[] t) {
        List<Double> out = new ArrayList<>();
        for (double v : t) {
            out.add(Math.round(v * 1e6) / 1e6);
        }
        return out;
    }
}
