package io.pegaflow.engine;

import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * Whether any two of a worker's layer regions overlap, in O(n log n), with exactly the answer
 * of {@link LayerRegion#overlaps} applied to every pair (quadratic: a registration with very
 * many layers held the store lock far too long; docs/security.md, "What is enforced where"):
 *
 * <ol>
 *   <li>Extents {@code [base, base + extent())} sorted by start, swept with the open ones in a
 *       heap by end and counted per block stride: two regions whose extents intersect and
 *       whose strides differ overlap ({@code overlaps} says so without looking at pieces).
 *   <li>Otherwise every pair of intersecting extents shares a stride {@code S}, and pieces are
 *       compared exactly: address {@code x} is the cell (row {@code x / S}, column
 *       {@code x % S}); one segment of every block of a region covers at most three rectangles
 *       of cells, so two regions overlap iff two of their rectangles intersect. A sweep over
 *       rows keeps the open rectangles, whose column ranges are pairwise disjoint until the
 *       first intersection, ordered by first column (a Fenwick tree over their ranks): each new
 *       one is compared with its two neighbours.
 * </ol>
 */
final class LayerOverlaps {
    private LayerOverlaps() {}

    /**
     * Indexes {@code {i, j}}, {@code i < j}, of a pair with
     * {@code regions.get(i).overlaps(regions.get(j))}, or null when no pair overlaps. Every
     * region must have passed {@link LayerRegion#validate}.
     */
    static int[] find(List<LayerRegion> regions) {
        int n = regions.size();
        long[] start = new long[n];
        long[] end = new long[n];
        int[] strideId = new int[n];
        Map<Long, Integer> strideIds = new HashMap<>();
        long lastStride = 0;
        int lastId = -1;
        for (int i = 0; i < n; i++) {
            LayerRegion r = regions.get(i);
            start[i] = r.baseAddress();
            end[i] = r.baseAddress() + r.extent();
            if (lastId < 0 || r.blockStride() != lastStride) {
                lastStride = r.blockStride();
                lastId = strideIds.computeIfAbsent(lastStride, k -> strideIds.size());
            }
            strideId[i] = lastId;
        }
        int strides = strideIds.size();
        int[] byStart = order(start, n);
        if (strides > 1) {
            int[] pair = acrossStrides(start, end, strideId, strides, byStart);
            if (pair != null) {
                return pair;
            }
        }
        // Step 2 for the regions whose extent meets another's (usually none: one allocation a layer).
        boolean[] meets = new boolean[n];
        long reach = Long.MIN_VALUE;
        int reacher = -1;
        for (int i : byStart) {
            if (start[i] < reach) {
                meets[i] = true;
                meets[reacher] = true;
            }
            if (end[i] > reach) {
                reach = end[i];
                reacher = i;
            }
        }
        // Those regions grouped by stride: group g is members[from[g], from[g + 1]).
        int[] from = new int[strides + 1];
        for (int i = 0; i < n; i++) {
            if (meets[i]) {
                from[strideId[i] + 1]++;
            }
        }
        for (int g = 0; g < strides; g++) {
            from[g + 1] += from[g];
        }
        int[] members = new int[from[strides]];
        int[] fill = Arrays.copyOf(from, strides);
        for (int i = 0; i < n; i++) {
            if (meets[i]) {
                members[fill[strideId[i]]++] = i;
            }
        }
        for (int g = 0; g < strides; g++) {
            if (from[g + 1] - from[g] > 1) {
                int[] pair = withinStride(regions, members, from[g], from[g + 1]);
                if (pair != null) {
                    return pair;
                }
            }
        }
        return null;
    }

    /** Step 1: a pair of intersecting extents with different strides, or null. */
    private static int[] acrossStrides(long[] start, long[] end, int[] strideId, int strides, int[] byStart) {
        int n = start.length;
        // Sweep: open extents in start order, close them in end order once the sweep passes their end.
        int[] byEnd = order(end, n);
        int[] openPerStride = new int[strides];
        int open = 0;
        int closed = 0;
        for (int i : byStart) {
            while (end[byEnd[closed]] <= start[i]) {
                openPerStride[strideId[byEnd[closed++]]]--;
                open--;
            }
            if (open > openPerStride[strideId[i]]) {
                for (int j = 0; j < n; j++) {
                    if (strideId[j] != strideId[i] && start[j] < end[i] && start[i] < end[j]) {
                        return ordered(i, j);
                    }
                }
                throw new IllegalStateException("sweep found an open extent of another stride, scan did not");
            }
            openPerStride[strideId[i]]++;
            open++;
        }
        return null;
    }

    /**
     * Indexes {@code 0..n-1} ordered by {@code key}: a bottom-up merge sort that moves each key
     * with its index, so every pass reads sequentially.
     */
    static int[] order(long[] key, int n) {
        long[] k = Arrays.copyOf(key, n);
        int[] a = new int[n];
        for (int i = 0; i < n; i++) {
            a[i] = i;
        }
        long[] k2 = new long[n];
        int[] a2 = new int[n];
        for (int width = 1; width < n; width *= 2) {
            for (int lo = 0; lo < n; lo += 2 * width) {
                int mid = Math.min(lo + width, n);
                int hi = Math.min(lo + 2 * width, n);
                int x = lo;
                int y = mid;
                for (int out = lo; out < hi; out++) {
                    if (x < mid && (y >= hi || k[x] <= k[y])) {
                        k2[out] = k[x];
                        a2[out] = a[x++];
                    } else {
                        k2[out] = k[y];
                        a2[out] = a[y++];
                    }
                }
            }
            long[] tk = k;
            k = k2;
            k2 = tk;
            int[] ta = a;
            a = a2;
            a2 = ta;
        }
        return a;
    }

    /** Rectangles of cells: rows {@code [rowFrom, rowTo)} x columns {@code [colFrom, colTo)} of one region. */
    private static final class Rects {
        long[] rowFrom;
        long[] rowTo;
        long[] colFrom;
        long[] colTo;
        int[] region;
        int size;

        Rects(int capacity) {
            rowFrom = new long[capacity];
            rowTo = new long[capacity];
            colFrom = new long[capacity];
            colTo = new long[capacity];
            region = new int[capacity];
        }

        void add(long r0, long r1, long c0, long c1, int owner) {
            if (size == region.length) {
                int cap = Math.max(16, size * 2);
                rowFrom = Arrays.copyOf(rowFrom, cap);
                rowTo = Arrays.copyOf(rowTo, cap);
                colFrom = Arrays.copyOf(colFrom, cap);
                colTo = Arrays.copyOf(colTo, cap);
                region = Arrays.copyOf(region, cap);
            }
            rowFrom[size] = r0;
            rowTo[size] = r1;
            colFrom[size] = c0;
            colTo[size] = c1;
            region[size] = owner;
            size++;
        }

        /** Pieces {@code [a + i*s, a + i*s + len)}, i in [0, n) (len <= s when n > 1, as validate() ensures). */
        void addRun(long a, long len, long n, long s, int owner) {
            long q = Math.floorDiv(a, s);
            long phase = Math.floorMod(a, s);
            if (n == 1) {
                long last = a + len - 1;
                long q1 = Math.floorDiv(last, s);
                long phase1 = Math.floorMod(last, s) + 1;
                if (q1 == q) {
                    add(q, q + 1, phase, phase1, owner);
                } else {
                    add(q, q + 1, phase, s, owner);
                    if (q1 > q + 1) {
                        add(q + 1, q1, 0, s, owner);
                    }
                    add(q1, q1 + 1, 0, phase1, owner);
                }
            } else if (phase + len <= s) {
                add(q, q + n, phase, phase + len, owner);
            } else {
                add(q, q + n, phase, s, owner);
                add(q + 1, q + n + 1, 0, phase + len - s, owner);
            }
        }
    }

    /** Step 2: an exactly overlapping pair among {@code members[from, to)}, all of one block stride, or null. */
    private static int[] withinStride(List<LayerRegion> regions, int[] members, int from, int to) {
        long s = regions.get(members[from]).blockStride();
        Rects rects = new Rects(2 * (to - from));
        for (int m = from; m < to; m++) {
            int i = members[m];
            LayerRegion r = regions.get(i);
            for (int seg = 0; seg < r.segments(); seg++) {
                rects.addRun(r.baseAddress() + seg * r.segmentOffset(), r.segmentBytes(), r.numBlocks(), s, i);
            }
        }
        int m = rects.size;
        int[] byRowFrom = order(rects.rowFrom, m);
        int[] byRowTo = order(rects.rowTo, m);
        // Open rectangles by the rank of their first column, in a Fenwick tree of counts.
        int[] byColFrom = order(rects.colFrom, m);
        int[] rank = new int[m];
        for (int r = 0; r < m; r++) {
            rank[byColFrom[r]] = r;
        }
        OpenSet open = new OpenSet(m);
        int closed = 0;
        for (int k : byRowFrom) {
            // Every rectangle ending by this row started before it, so it is open: close it.
            while (rects.rowTo[byRowTo[closed]] <= rects.rowFrom[k]) {
                open.remove(rank[byRowTo[closed++]]);
            }
            int below = open.before(rank[k]);
            if (below >= 0 && rects.colTo[byColFrom[below]] > rects.colFrom[k]) {
                return clash(rects, k, byColFrom[below]);
            }
            int above = open.after(rank[k]);
            if (above >= 0 && rects.colFrom[byColFrom[above]] < rects.colTo[k]) {
                return clash(rects, k, byColFrom[above]);
            }
            open.add(rank[k]);
        }
        return null;
    }

    /** A set of ranks in {@code [0, n)} (a Fenwick tree of counts): add, remove, nearest below and above. */
    private static final class OpenSet {
        private final int[] tree;
        private final int n;
        private int size;

        OpenSet(int n) {
            this.n = n;
            this.tree = new int[n + 1];
        }

        void add(int rank) {
            update(rank, 1);
            size++;
        }

        void remove(int rank) {
            update(rank, -1);
            size--;
        }

        private void update(int rank, int delta) {
            for (int i = rank + 1; i <= n; i += i & -i) {
                tree[i] += delta;
            }
        }

        /** Members below {@code rank}. */
        private int countBelow(int rank) {
            int c = 0;
            for (int i = rank; i > 0; i -= i & -i) {
                c += tree[i];
            }
            return c;
        }

        /** The member with {@code c} members below it ({@code 0 <= c < size}). */
        private int select(int c) {
            int pos = 0;
            for (int step = Integer.highestOneBit(n); step > 0; step >>= 1) {
                if (pos + step <= n && tree[pos + step] <= c) {
                    pos += step;
                    c -= tree[pos];
                }
            }
            return pos;
        }

        /** The largest member below {@code rank}, or -1. */
        int before(int rank) {
            int c = countBelow(rank);
            return c == 0 ? -1 : select(c - 1);
        }

        /** The smallest member above {@code rank}, or -1. */
        int after(int rank) {
            int c = countBelow(rank + 1);
            return c == size ? -1 : select(c);
        }
    }

    private static int[] clash(Rects rects, int k, int other) {
        int a = rects.region[k];
        int b = rects.region[other];
        if (a == b) {
            throw new IllegalStateException("pieces of one layer region overlap each other; validate() it first");
        }
        return ordered(a, b);
    }

    private static int[] ordered(int a, int b) {
        return a < b ? new int[] {a, b} : new int[] {b, a};
    }
}
