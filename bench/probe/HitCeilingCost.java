import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.metrics.DistinctBlocks;
import java.util.List;

/**
 * What the hit-rate ceiling's sketch adds to a query: DistinctBlocks.observe of 2,048 random
 * 32-byte hashes over the given windows (default the store's 15m, 1h, 1d), p50 and p99 of
 * 2,001 calls after 20,000 warm-up calls; prints JSON.
 *   java -cp bench/target/pegaflow.jar bench/probe/HitCeilingCost.java [WINDOW ...]
 */
public class HitCeilingCost {
    public static void main(String[] a) {
        byte[] packed = new byte[2048 * 32];
        new java.util.Random(1).nextBytes(packed);
        BlockHashes h = new BlockHashes(packed, 32);
        List<String> windows = List.of(a.length > 0 ? a : new String[] {"15m", "1h", "1d"});
        DistinctBlocks d = DistinctBlocks.of(windows);
        for (int i = 0; i < 20_000; i++) {
            d.observe("ns", h, i);
        }
        long[] t = new long[2001];
        for (int r = 0; r < t.length; r++) {
            long t0 = System.nanoTime();
            d.observe("ns", h, r);
            t[r] = System.nanoTime() - t0;
        }
        java.util.Arrays.sort(t);
        System.out.printf("{\"windows\": %d, \"hashes\": 2048, \"observe_p50_us\": %.1f, \"observe_p99_us\": %.1f}%n",
                windows.size(), t[1000] / 1e3, t[1980] / 1e3);
    }
}
