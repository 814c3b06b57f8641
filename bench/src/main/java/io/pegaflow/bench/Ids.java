package io.pegaflow.bench;

import io.pegaflow.engine.BlockHashes;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Random;

/**
 * Scattered block ids of the cache, handed out in a shuffled cycle, and the hashes blocks
 * are saved under: an operation's blocks are not neighbours in the KV cache, as in a running
 * engine, and a run is the same from one time to the next.
 */
final class Ids {
    private final List<Long> order = new ArrayList<>();
    private int next;

    Ids(int cacheBlocks, long seed) {
        for (long b = 0; b < cacheBlocks; b++) {
            order.add(b);
        }
        Collections.shuffle(order, new Random(seed));
    }

    long[] take(int n) {
        long[] out = new long[n];
        for (int i = 0; i < n; i++) {
            out[i] = order.get(next);
            next = (next + 1) % order.size();
        }
        return out;
    }

    /** The hashes of {@code n} blocks, drawn from {@code seed}: the same seed, the same blocks. */
    static BlockHashes hashes(int n, long seed) {
        byte[] packed = new byte[n * 32];
        new Random(seed).nextBytes(packed);
        return new BlockHashes(packed, 32);
    }
}
