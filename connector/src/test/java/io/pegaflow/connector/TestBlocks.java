package io.pegaflow.connector;

import io.pegaflow.engine.BlockHashes;
import java.util.Random;

/** Block ids and random 32-byte hashes for the brain tests. */
final class TestBlocks {
    private TestBlocks() {}

    static BlockHashes hashes(Random rnd, int n) {
        byte[] h = new byte[n * 32];
        rnd.nextBytes(h);
        return new BlockHashes(h, 32);
    }

    /** {@code n} consecutive block ids from {@code from}. */
    static long[] ids(int from, int n) {
        long[] out = new long[n];
        for (int i = 0; i < n; i++) {
            out[i] = from + i;
        }
        return out;
    }
}
