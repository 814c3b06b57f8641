package io.pegaflow.engine.store;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * The blocks of one namespace by vLLM hash: an open-addressing table (linear probing,
 * backward-shift deletion, load factor at most 1/2) whose keys' first 32 bytes and length
 * live inline in one {@code long[]}, five words per slot (length 0 marks an empty slot).
 *
 * <p>Why not {@code HashMap<HashKey, Block>}: a prefix query is one lookup per block (32K for
 * a long prompt) and each lookup's cost is cache misses. A HashMap chases table, node, key
 * and key bytes; here a probe reads 40 contiguous bytes of {@code words} and, on a match,
 * the block, so a long prefix query costs a fraction of the HashMap's (docs/engine.md, "Block
 * index"; the JMH figures in docs/benchmarks/README.md).
 * Probes are computed straight from the caller's hash bytes, so a lookup allocates nothing.
 * Hashes longer than 32 bytes match on their inline prefix and length, then on the block's
 * full {@link HashKey}.
 *
 * <p>Not thread-safe: guarded by the engine lock.
 */
final class BlockTable {
    private static final VarHandle LONG = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);

    private static final int STRIDE = 5;
    private static final int LEN = 4;

    /** Per slot: w0, w1, w2, w3 (first 32 hash bytes, little endian), length (0 = empty). */
    private long[] words;
    private Block[] blocks;
    private int mask;
    private int size;

    BlockTable() {
        allocate(64);
    }

    int size() {
        return size;
    }

    /** The block stored under {@code hash}, or null. */
    Block get(byte[] hash) {
        return get(hash, 0, hash.length);
    }

    /** The block stored under the hash at {@code buf[start, start+len)}, or null. */
    Block get(byte[] buf, int start, int len) {
        return probe(buf, start, len, slot(word(buf, start, len, 0), len));
    }

    /** The block stored under the hash at {@code buf[start, start+len)}, starting at its home slot. */
    private Block probe(byte[] buf, int start, int len, int home) {
        long w0 = word(buf, start, len, 0);
        long w1 = word(buf, start, len, 8);
        long w2 = word(buf, start, len, 16);
        long w3 = word(buf, start, len, 24);
        for (int i = home; ; i = (i + 1) & mask) {
            int k = i * STRIDE;
            long stored = words[k + LEN];
            if (stored == 0) {
                return null;
            }
            if (stored == len && words[k] == w0 && words[k + 1] == w1 && words[k + 2] == w2 && words[k + 3] == w3
                    && (len <= 32 || Arrays.equals(blocks[i].key.bytes(), 0, len, buf, start, start + len))) {
                return blocks[i];
            }
        }
    }

    /**
     * Length of the longest prefix of {@code count} hashes of {@code hashLen} bytes packed in
     * {@code packed} whose blocks are present and sealed; those blocks are written to
     * {@code out}. Lookups go in groups: first every probe's first slot of the group is read,
     * then the probes are resolved and their blocks read, then the group is checked in order.
     * The reads of a phase do not depend on each other, so the CPU overlaps their cache misses
     * instead of taking them one after another.
     */
    int sealedPrefix(byte[] packed, int hashLen, int count, Block[] out) {
        final int group = 16;
        int[] home = new int[group];
        Block[] found = new Block[group];
        long sink = 0;
        for (int base = 0; base < count; base += group) {
            int m = Math.min(group, count - base);
            for (int j = 0; j < m; j++) {
                home[j] = slot(word(packed, (base + j) * hashLen, hashLen, 0), hashLen);
                sink += words[home[j] * STRIDE + LEN];
            }
            for (int j = 0; j < m; j++) {
                Block b = probe(packed, (base + j) * hashLen, hashLen, home[j]);
                found[j] = b;
                if (b != null) {
                    sink += b.refs;
                }
            }
            for (int j = 0; j < m; j++) {
                Block b = found[j];
                if (b == null || !b.sealed) {
                    return base + j + (int) (sink & 0); // sink keeps the touches alive
                }
                out[base + j] = b;
            }
        }
        return count + (int) (sink & 0);
    }

    /** Stores {@code block} under its key; the key must be absent. */
    void put(Block block) {
        if ((size + 1) * 2 > blocks.length) {
            resize(blocks.length * 2);
        }
        insert(block);
        size++;
    }

    /** Removes the entry for {@code block}'s key if it maps to {@code block}. */
    boolean remove(Block block) {
        byte[] hash = block.key.bytes();
        long w0 = word(hash, 0, hash.length, 0);
        for (int i = slot(w0, hash.length); words[i * STRIDE + LEN] != 0; i = (i + 1) & mask) {
            if (blocks[i] == block) {
                deleteAt(i);
                size--;
                return true;
            }
        }
        return false;
    }

    /** A snapshot of every stored block (for audits and shutdown; not a hot path). */
    List<Block> values() {
        List<Block> out = new ArrayList<>(size);
        for (Block b : blocks) {
            if (b != null) {
                out.add(b);
            }
        }
        return out;
    }

    void clear() {
        allocate(64);
        size = 0;
    }

    private void insert(Block block) {
        byte[] hash = block.key.bytes();
        long w0 = word(hash, 0, hash.length, 0);
        int i = slot(w0, hash.length);
        while (words[i * STRIDE + LEN] != 0) {
            i = (i + 1) & mask;
        }
        int k = i * STRIDE;
        words[k] = w0;
        words[k + 1] = word(hash, 0, hash.length, 8);
        words[k + 2] = word(hash, 0, hash.length, 16);
        words[k + 3] = word(hash, 0, hash.length, 24);
        words[k + LEN] = hash.length;
        blocks[i] = block;
    }

    /** Backward-shift deletion: later members of the probe run move up so no tombstones remain. */
    private void deleteAt(int hole) {
        int i = hole;
        while (true) {
            i = (i + 1) & mask;
            if (words[i * STRIDE + LEN] == 0) {
                break;
            }
            int home = slot(words[i * STRIDE], (int) words[i * STRIDE + LEN]);
            // Move entry i into the hole if its home is not in the cyclic range (hole, i].
            boolean homeInRange = hole <= i ? (home > hole && home <= i) : (home > hole || home <= i);
            if (!homeInRange) {
                System.arraycopy(words, i * STRIDE, words, hole * STRIDE, STRIDE);
                blocks[hole] = blocks[i];
                hole = i;
            }
        }
        Arrays.fill(words, hole * STRIDE, hole * STRIDE + STRIDE, 0L);
        blocks[hole] = null;
    }

    private void resize(int capacity) {
        Block[] old = blocks;
        allocate(capacity);
        for (Block b : old) {
            if (b != null) {
                insert(b);
            }
        }
    }

    private void allocate(int capacity) {
        words = new long[capacity * STRIDE];
        blocks = new Block[capacity];
        mask = capacity - 1;
    }

    private int slot(long w0, int len) {
        long x = (w0 + len) * 0x9E3779B97F4A7C15L;
        return (int) (x >>> 32) & mask;
    }

    /** Little-endian word of the hash at {@code buf[start, start+len)} from byte {@code offset}, zero-padded. */
    private static long word(byte[] buf, int start, int len, int offset) {
        if (len >= offset + 8) {
            return (long) LONG.get(buf, start + offset);
        }
        long w = 0;
        for (int i = Math.min(len, offset + 8) - 1; i >= offset; i--) {
            w = (w << 8) | (buf[start + i] & 0xff);
        }
        return w;
    }
}
