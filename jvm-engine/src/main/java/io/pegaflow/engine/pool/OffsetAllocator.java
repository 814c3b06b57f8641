package io.pegaflow.engine.pool;

import java.util.Arrays;

/**
 * Sub-allocates the host pool by offset in O(1) per call, with immediate coalescing.
 *
 * <h2>Algorithm (two-level segregated fit, as in TLSF)</h2>
 * <ul>
 *   <li>The pool is divided into units of {@link #unitBytes()} (512 B, or larger so that the
 *       whole pool fits in 2<sup>31</sup> units). Sizes and offsets below are in units.</li>
 *   <li>Every free range is a node in exactly one of 256 <em>bins</em>. A bin index is a tiny
 *       floating-point number: 5 exponent bits, 3 mantissa bits, so bins are spaced at most
 *       12.5% apart. A free range is filed in the bin of its size rounded <em>down</em>; a
 *       request looks in bins from its size rounded <em>up</em>, so any node found is big
 *       enough without scanning a list.</li>
 *   <li>A 32-bit mask marks which exponent groups have a non-empty bin and one 8-bit mask per
 *       group marks which bins do; finding the first usable bin is two count-trailing-zeros.</li>
 *   <li>Allocation takes the head node of that bin and splits off the remainder as a new free
 *       node. Only if no such bin exists is the request's own (rounded-down) bin scanned for
 *       a range that fits, so a free range as large as the request is always found. Nodes also form a doubly linked list in address order; freeing merges a node
 *       with a free left and right neighbour before filing it, so free space never stays
 *       fragmented next to itself.</li>
 * </ul>
 * Rounding wastes at most 12.5% of a request only when the request is not a bin size; the
 * remainder of a split is always returned to a bin, so accounting stays exact:
 * {@code used + free == capacity} at all times.
 *
 * <p>Handles are {@code long}s: node index in the high 32 bits, offset in units in the low 32.
 *
 * <p>Not thread-safe: the engine calls it under its own lock.
 */
public final class OffsetAllocator {
    /** Returned by {@link #allocate(long)} when no free range is large enough. */
    public static final long NO_SPACE = -1L;

    private static final int MANTISSA_BITS = 3;
    private static final int MANTISSA_VALUE = 1 << MANTISSA_BITS;
    private static final int MANTISSA_MASK = MANTISSA_VALUE - 1;
    private static final int TOP_BINS = 32;
    private static final int NUM_BINS = TOP_BINS * MANTISSA_VALUE;
    private static final int NONE = -1;

    private final long unitBytes;
    private final int capacityUnits;

    private int usedTopMask;
    private final int[] usedLeafMask = new int[TOP_BINS];
    private final int[] binHead = new int[NUM_BINS];

    // Node storage (struct of arrays), grown on demand.
    private int[] offset;
    private int[] size;
    private int[] binPrev;
    private int[] binNext;
    private int[] physPrev;
    private int[] physNext;
    private boolean[] used;
    private int[] freeNodes;
    private int freeNodeCount;
    private int nodeCapacity;

    private long usedUnits;
    private int liveAllocations;

    /** An allocator over {@code capacityBytes}; the unit is chosen so the pool fits 2^31 units. */
    public OffsetAllocator(long capacityBytes) {
        this(capacityBytes, unitFor(capacityBytes));
    }

    public OffsetAllocator(long capacityBytes, long unitBytes) {
        if (unitBytes <= 0 || unitBytes % HostPool.ALIGNMENT != 0) {
            throw new IllegalArgumentException("unit " + unitBytes + " must be a positive multiple of " + HostPool.ALIGNMENT);
        }
        long units = capacityBytes / unitBytes;
        if (units <= 0 || units > Integer.MAX_VALUE) {
            throw new IllegalArgumentException("capacity " + capacityBytes + " bytes gives " + units
                    + " units of " + unitBytes + " bytes; expected 1.." + Integer.MAX_VALUE);
        }
        this.unitBytes = unitBytes;
        this.capacityUnits = (int) units;
        Arrays.fill(binHead, NONE);
        grow(1024);
        int node = takeNode();
        offset[node] = 0;
        size[node] = capacityUnits;
        physPrev[node] = NONE;
        physNext[node] = NONE;
        used[node] = false;
        insertFree(node);
    }

    /** The smallest multiple of 512 B that lets {@code capacityBytes} fit in 2^31 units. */
    public static long unitFor(long capacityBytes) {
        long unit = HostPool.ALIGNMENT;
        while (capacityBytes / unit > Integer.MAX_VALUE) {
            unit *= 2;
        }
        return unit;
    }

    /**
     * Allocates {@code bytes} (rounded up to whole units). Returns a handle, or
     * {@link #NO_SPACE} when no free range is large enough (the caller evicts and retries).
     */
    public long allocate(long bytes) {
        if (bytes <= 0) {
            throw new IllegalArgumentException("allocation of " + bytes + " bytes; expected > 0");
        }
        long unitsL = (bytes + unitBytes - 1) / unitBytes;
        if (unitsL > capacityUnits) {
            return NO_SPACE;
        }
        int units = (int) unitsL;
        int bin = firstNonEmptyBinFrom(binRoundUp(units));
        int node = bin != NONE ? binHead[bin] : firstFitInBin(binRoundDown(units), units);
        if (node == NONE) {
            return NO_SPACE;
        }
        removeFree(node);
        int remainder = size[node] - units;
        size[node] = units;
        used[node] = true;
        if (remainder > 0) {
            int rest = takeNode();
            offset[rest] = offset[node] + units;
            size[rest] = remainder;
            used[rest] = false;
            physPrev[rest] = node;
            physNext[rest] = physNext[node];
            if (physNext[node] != NONE) {
                physPrev[physNext[node]] = rest;
            }
            physNext[node] = rest;
            insertFree(rest);
        }
        usedUnits += units;
        liveAllocations++;
        return ((long) node << 32) | (offset[node] & 0xffffffffL);
    }

    /** Frees a handle from {@link #allocate(long)}; merges with free neighbours. */
    public void free(long handle) {
        int node = checkLive(handle);
        usedUnits -= size[node];
        liveAllocations--;
        used[node] = false;
        int prev = physPrev[node];
        if (prev != NONE && !used[prev]) {
            removeFree(prev);
            offset[node] = offset[prev];
            size[node] += size[prev];
            physPrev[node] = physPrev[prev];
            if (physPrev[prev] != NONE) {
                physNext[physPrev[prev]] = node;
            }
            releaseNode(prev);
        }
        int next = physNext[node];
        if (next != NONE && !used[next]) {
            removeFree(next);
            size[node] += size[next];
            physNext[node] = physNext[next];
            if (physNext[next] != NONE) {
                physPrev[physNext[next]] = node;
            }
            releaseNode(next);
        }
        insertFree(node);
    }

    /** Byte offset of an allocation from the start of the pool. */
    public long offsetBytes(long handle) {
        return (handle & 0xffffffffL) * unitBytes;
    }

    /** Bytes actually reserved for an allocation (its request rounded up to units). */
    public long sizeBytes(long handle) {
        return (long) size[checkLive(handle)] * unitBytes;
    }

    public long unitBytes() {
        return unitBytes;
    }

    public long capacityBytes() {
        return (long) capacityUnits * unitBytes;
    }

    public long usedBytes() {
        return usedUnits * unitBytes;
    }

    public long freeBytes() {
        return capacityBytes() - usedBytes();
    }

    public int liveAllocations() {
        return liveAllocations;
    }

    /** Size of the largest free range (exact: scans the highest non-empty bin). */
    public long largestFreeBytes() {
        if (usedTopMask == 0) {
            return 0;
        }
        int top = 31 - Integer.numberOfLeadingZeros(usedTopMask);
        int leaf = 31 - Integer.numberOfLeadingZeros(usedLeafMask[top]);
        int best = 0;
        for (int n = binHead[(top << MANTISSA_BITS) | leaf]; n != NONE; n = binNext[n]) {
            best = Math.max(best, size[n]);
        }
        return (long) best * unitBytes;
    }

    // --- size classes -------------------------------------------------------------------

    static int binRoundUp(int units) {
        if (units < MANTISSA_VALUE) {
            return units;
        }
        int highBit = 31 - Integer.numberOfLeadingZeros(units);
        int mantissaStart = highBit - MANTISSA_BITS;
        int exp = mantissaStart + 1;
        int mantissa = (units >>> mantissaStart) & MANTISSA_MASK;
        if ((units & ((1 << mantissaStart) - 1)) != 0) {
            mantissa++; // may carry into the exponent: (exp << 3) + 8 == ((exp + 1) << 3)
        }
        return (exp << MANTISSA_BITS) + mantissa;
    }

    static int binRoundDown(int units) {
        if (units < MANTISSA_VALUE) {
            return units;
        }
        int highBit = 31 - Integer.numberOfLeadingZeros(units);
        int mantissaStart = highBit - MANTISSA_BITS;
        int exp = mantissaStart + 1;
        int mantissa = (units >>> mantissaStart) & MANTISSA_MASK;
        return (exp << MANTISSA_BITS) | mantissa;
    }

    /** Smallest size (in units) filed in {@code bin}. */
    static long binSize(int bin) {
        int exp = bin >>> MANTISSA_BITS;
        int mantissa = bin & MANTISSA_MASK;
        return exp == 0 ? mantissa : ((long) (mantissa | MANTISSA_VALUE)) << (exp - 1);
    }

    /**
     * Slow path when no bin above the request's rounded-up size has a node: the bin the
     * request rounds down to may still hold a range that fits exactly (a freed range of a
     * non-bin size is filed there). Scanning it keeps "the largest free range fits" true.
     */
    private int firstFitInBin(int bin, int units) {
        for (int n = binHead[bin]; n != NONE; n = binNext[n]) {
            if (size[n] >= units) {
                return n;
            }
        }
        return NONE;
    }

    private int firstNonEmptyBinFrom(int minBin) {
        int top = minBin >>> MANTISSA_BITS;
        if (top >= TOP_BINS) {
            return NONE;
        }
        int leaf = minBin & MANTISSA_MASK;
        int leaves = usedLeafMask[top] & (-1 << leaf);
        if ((usedTopMask & (1 << top)) != 0 && leaves != 0) {
            return (top << MANTISSA_BITS) | Integer.numberOfTrailingZeros(leaves);
        }
        if (top + 1 >= TOP_BINS) {
            return NONE;
        }
        int tops = usedTopMask & (-1 << (top + 1));
        if (tops == 0) {
            return NONE;
        }
        int t = Integer.numberOfTrailingZeros(tops);
        return (t << MANTISSA_BITS) | Integer.numberOfTrailingZeros(usedLeafMask[t]);
    }

    // --- free lists ---------------------------------------------------------------------

    private void insertFree(int node) {
        int bin = binRoundDown(size[node]);
        int head = binHead[bin];
        binPrev[node] = NONE;
        binNext[node] = head;
        if (head != NONE) {
            binPrev[head] = node;
        }
        binHead[bin] = node;
        int top = bin >>> MANTISSA_BITS;
        usedLeafMask[top] |= 1 << (bin & MANTISSA_MASK);
        usedTopMask |= 1 << top;
    }

    private void removeFree(int node) {
        int bin = binRoundDown(size[node]);
        int prev = binPrev[node];
        int next = binNext[node];
        if (prev != NONE) {
            binNext[prev] = next;
        } else {
            binHead[bin] = next;
        }
        if (next != NONE) {
            binPrev[next] = prev;
        }
        if (binHead[bin] == NONE) {
            int top = bin >>> MANTISSA_BITS;
            usedLeafMask[top] &= ~(1 << (bin & MANTISSA_MASK));
            if (usedLeafMask[top] == 0) {
                usedTopMask &= ~(1 << top);
            }
        }
    }

    // --- node storage -------------------------------------------------------------------

    private int checkLive(long handle) {
        int node = (int) (handle >>> 32);
        if (handle < 0 || node >= nodeCapacity || !used[node] || offset[node] != (int) handle) {
            throw new IllegalArgumentException("allocation handle 0x" + Long.toHexString(handle)
                    + " is not live (double free or foreign handle)");
        }
        return node;
    }

    private int takeNode() {
        if (freeNodeCount == 0) {
            grow(nodeCapacity * 2);
        }
        return freeNodes[--freeNodeCount];
    }

    private void releaseNode(int node) {
        used[node] = false;
        offset[node] = NONE;
        freeNodes[freeNodeCount++] = node;
    }

    private void grow(int newCapacity) {
        int old = nodeCapacity;
        offset = Arrays.copyOf(offset == null ? new int[0] : offset, newCapacity);
        size = Arrays.copyOf(size == null ? new int[0] : size, newCapacity);
        binPrev = Arrays.copyOf(binPrev == null ? new int[0] : binPrev, newCapacity);
        binNext = Arrays.copyOf(binNext == null ? new int[0] : binNext, newCapacity);
        physPrev = Arrays.copyOf(physPrev == null ? new int[0] : physPrev, newCapacity);
        physNext = Arrays.copyOf(physNext == null ? new int[0] : physNext, newCapacity);
        used = Arrays.copyOf(used == null ? new boolean[0] : used, newCapacity);
        freeNodes = Arrays.copyOf(freeNodes == null ? new int[0] : freeNodes, newCapacity);
        // Newly added indices go on the free stack, lowest index on top.
        for (int i = newCapacity - 1; i >= old; i--) {
            offset[i] = NONE;
            freeNodes[freeNodeCount++] = i;
        }
        nodeCapacity = newCapacity;
    }
}
