package io.pegaflow.bench;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.QueryResult;

/**
 * The restore: a saved prefix of {@code --restore-blocks} (10K tokens of 16-token blocks by
 * default), then query and load into other blocks timed together, as a returning request
 * waits for its prefix before it computes the rest.
 */
final class PathsRestore {
    private PathsRestore() {}

    /** Reports {@code <name>_restore_<blocks>_ms_p50}; true when every load brought back the prefix. */
    static boolean run(PathsCommand paths, String name, PegaEngine engine, String instance, Kv kv, Ids ids) {
        int n = paths.restoreBlocks;
        long[] src = ids.take(n);
        BlockHashes h = Ids.hashes(n, name.hashCode() * 31L + 5);
        kv.fill(src, 99);
        engine.save(instance, 0, src, h).join();
        double[] restore = new double[paths.repeat];
        boolean ok = true;
        for (int r = 0; r < paths.repeat; r++) {
            long[] dst = ids.take(n);
            long t0 = System.nanoTime();
            QueryResult q = engine.query(instance, h);
            engine.load(instance, 0, q.lease(), dst).join();
            restore[r] = (System.nanoTime() - t0) / 1e9;
            ok &= q.hitBlocks() == n && kv.check(dst, 99);
        }
        paths.report.put(name + "_restore_" + n + "_ms_p50", Stats.median(restore) * 1e3);
        return ok;
    }
}
