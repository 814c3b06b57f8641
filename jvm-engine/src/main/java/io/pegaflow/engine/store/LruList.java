package io.pegaflow.engine.store;

import java.util.HashSet;
import java.util.Set;

/**
 * The sealed blocks' eviction order: an intrusive doubly linked list (through
 * {@link Block#lruPrev}/{@link Block#lruNext}) of the unreferenced ones, oldest first, and the
 * count of pinned sealed blocks and evictable bytes that {@link #pin}/{@link #unpin} keep.
 * Not thread-safe: guarded by LocalStore's lock.
 */
final class LruList {
    private Block head;
    private Block tail;
    private long pinnedBlocks;
    private long evictableBytes;

    /** Sealed blocks with {@code refs > 0}. */
    long pinnedBlocks() {
        return pinnedBlocks;
    }

    /** Bytes of the blocks on the list: what eviction could free. */
    long evictableBytes() {
        return evictableBytes;
    }

    /** Adds a reference; a sealed block taken from zero leaves the list and counts as pinned. */
    void pin(Block b) {
        if (b.refs++ == 0 && b.sealed) {
            unlink(b);
            evictableBytes -= b.bytes;
            pinnedBlocks++;
        }
    }

    /**
     * Drops a reference; a sealed block dropping to zero joins the list as its newest member
     * (its oldest when it is marked {@link Block#evictFirst}). Returns true when the block is
     * now unreferenced but not sealed (the caller owns what happens to blocks in flight).
     */
    boolean unpin(Block b) {
        if (--b.refs > 0) {
            return false;
        }
        if (b.sealed) {
            pinnedBlocks--;
            if (b.evictFirst) {
                prepend(b);
            } else {
                append(b);
            }
            evictableBytes += b.bytes;
            return false;
        }
        return true;
    }

    /** Counts one more pinned block: one just sealed while its save still references it. */
    void addPinned() {
        pinnedBlocks++;
    }

    /** Takes the least recently used block off the list, or returns null when it is empty. */
    Block pollOldest() {
        Block b = head;
        if (b != null) {
            unlink(b);
            evictableBytes -= b.bytes;
        }
        return b;
    }

    /**
     * Takes off the list the block of lowest {@code frequency} among the {@code sample} least
     * recently used (ties: the oldest), or returns null when the list is empty.
     */
    Block pollLeastFrequent(java.util.function.ToIntFunction<Block> frequency, int sample) {
        Block best = head;
        if (best == null) {
            return null;
        }
        int least = frequency.applyAsInt(best);
        Block b = best.lruNext;
        for (int seen = 1; b != null && seen < sample && least > 0; seen++, b = b.lruNext) {
            int f = frequency.applyAsInt(b);
            if (f < least) {
                least = f;
                best = b;
            }
        }
        unlink(best);
        evictableBytes -= best.bytes;
        return best;
    }

    /**
     * Takes the least recently used block owned by {@code owner} off the list, looking at the
     * {@code scan} oldest at most; null when none of those is.
     */
    Block pollOldestOwnedBy(int owner, int scan) {
        Block b = head;
        for (int seen = 0; b != null && seen < scan; seen++, b = b.lruNext) {
            if (b.owner == owner) {
                remove(b);
                return b;
            }
        }
        return null;
    }

    /** Moves a block on the list to its oldest end: the next to be evicted. */
    void moveToOldest(Block b) {
        unlink(b);
        prepend(b);
    }

    /** Takes an unreferenced sealed block off the list (an operator's clear drops it). */
    void remove(Block b) {
        unlink(b);
        evictableBytes -= b.bytes;
    }

    /** Forgets every block (at close). */
    void clear() {
        head = tail = null;
        pinnedBlocks = evictableBytes = 0;
    }

    /** The blocks on the list, walking it (for invariant checks). */
    Set<Block> members() {
        Set<Block> in = new HashSet<>();
        for (Block b = head; b != null; b = b.lruNext) {
            in.add(b);
        }
        return in;
    }

    /** Checks the counters against the list and against {@code pinned} sealed blocks counted in the index. */
    void verify(long pinned) {
        long lruBytes = 0;
        for (Block b = head; b != null; b = b.lruNext) {
            lruBytes += b.bytes;
        }
        LocalStore.require(pinned == pinnedBlocks, "pinned " + pinnedBlocks + " but counted " + pinned);
        LocalStore.require(lruBytes == evictableBytes, "evictable " + evictableBytes + " but LRU holds " + lruBytes);
    }

    private void append(Block b) {
        b.lruPrev = tail;
        b.lruNext = null;
        if (tail != null) {
            tail.lruNext = b;
        } else {
            head = b;
        }
        tail = b;
    }

    private void prepend(Block b) {
        b.lruNext = head;
        b.lruPrev = null;
        if (head != null) {
            head.lruPrev = b;
        } else {
            tail = b;
        }
        head = b;
    }

    private void unlink(Block b) {
        if (b.lruPrev != null) {
            b.lruPrev.lruNext = b.lruNext;
        } else {
            head = b.lruNext;
        }
        if (b.lruNext != null) {
            b.lruNext.lruPrev = b.lruPrev;
        } else {
            tail = b.lruPrev;
        }
        b.lruPrev = b.lruNext = null;
    }
}
