package io.pegaflow.bench;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.BlockStore;
import io.pegaflow.engine.CopyPlan;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.WorkerSpec;

/**
 * The control plane alone, per call, with no bytes copied: what each step of a save and of a
 * load costs in the embedded store and, as a round trip, in the server, apart from the copies
 * the other cases time with it.
 */
final class PathsControlPlane {
    private PathsControlPlane() {}

    /**
     * The control plane alone, per call, on the same geometry (regions that are never read):
     * a save's plan and end, a query, a load's plan and end, then the same load begun by its
     * query (one call, {@link BlockStore#queryAndBegin}) and its end, for the large and the
     * small operation. In server mode each is a round trip to the server process.
     */
    static void run(PathsCommand paths, String name, BlockStore store) {
        String instance = name + "-control-" + ProcessHandle.current().pid();
        store.registerInstance(new InstanceSpec(instance, "paths-control-" + paths.layers + "x" + paths.pieceBytes, 1, 1));
        Kv geometry = Kv.unbacked(1L << 44, paths.layers, paths.pieceBytes, paths.cacheBlocks);
        store.registerWorker(instance, new WorkerSpec(0, 0, -1, geometry.regions()));
        Ids ids = new Ids(paths.cacheBlocks, 23);
        for (int n : new int[] {paths.blocks, paths.smallBlocks}) {
            String suffix = n == paths.blocks ? "" : "_" + n;
            long bytes = n * paths.blockBytes;
            int rounds = Math.max(paths.repeat, 15);
            double[][] t = new double[7][rounds];
            for (int r = -3; r < rounds; r++) { // three untimed rounds: the client's paths compiled
                BlockHashes h = Ids.hashes(n, 900_000L + n * 100L + r);
                long t0 = System.nanoTime();
                CopyPlan save = store.reserveSave(instance, 0, null, ids.take(n), h);
                long t1 = System.nanoTime();
                store.endCopy(instance, save.id(), true, bytes, 1);
                long t2 = System.nanoTime();
                QueryResult q = store.query(instance, h);
                long t3 = System.nanoTime();
                CopyPlan load = store.beginLoad(instance, 0, q.lease(), ids.take(n));
                long t4 = System.nanoTime();
                store.endCopy(instance, load.id(), true, bytes, 1);
                long t5 = System.nanoTime();
                CopyPlan begun = store.queryAndBegin(instance, h, 0).begun();
                long t6 = System.nanoTime();
                if (begun == null) {
                    throw new IllegalStateException("the query began no load of " + n + " blocks; expected one");
                }
                store.endCopy(instance, begun.id(), true, bytes, 1);
                long t7 = System.nanoTime();
                if (r >= 0) {
                    long[] at = {t0, t1, t2, t3, t4, t5, t6, t7};
                    for (int k = 0; k < at.length - 1; k++) {
                        t[k][r] = (at[k + 1] - at[k]) / 1e6;
                    }
                }
            }
            String[] keys = {"reserve_save", "end_save", "query", "begin_load", "end_load", "query_and_begin",
                    "end_begun_load"};
            for (int k = 0; k < keys.length; k++) {
                paths.report.put(name + "_control_" + keys[k] + "_ms" + suffix, Stats.median(t[k]));
            }
        }
        store.unregisterInstance(instance);
    }
}
