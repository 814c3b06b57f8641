package io.pegaflow.bench;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.CopyResult;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.WorkerSpec;
import java.util.Map;
import java.util.function.IntToLongFunction;

/**
 * Save then load through one {@link PegaEngine}, embedded or attached to the server: the
 * large and the small operation, then the restore, on the blocks the copy engine alone moved.
 * In server mode each operation's timeline says where the time went; the first operations
 * are kept for the first-against-steady ratio.
 */
final class PathsSaveLoad {
    private PathsSaveLoad() {}

    /**
     * The seconds of {@code repeat} save-then-load rounds, each round's timeline of the save
     * and of the load, whether every save stored every block and whether every load brought
     * back what its save wrote.
     */
    record Rounds(double[] save, double[] load, String[] saveLines, String[] loadLines, boolean saved, boolean loaded) {}

    /** Save then load of {@code --blocks} and {@code --small-blocks}, and the restore, through one engine. */
    static void run(PathsCommand paths, String name, PegaEngine engine, Kv kv, boolean recordFirst) {
        Map<String, Object> report = paths.report;
        String instance = name + "-" + ProcessHandle.current().pid();
        register(paths, engine, instance, "paths-" + name + "-" + paths.layers + "x" + paths.pieceBytes, kv);
        Ids ids = new Ids(paths.cacheBlocks, 11);
        boolean ok = true;
        for (int n : new int[] {paths.blocks, paths.smallBlocks}) {
            String suffix = n == paths.blocks ? "" : "_" + n;
            int size = n;
            Rounds t = rounds(paths, engine, instance, kv, ids, n, r -> name.hashCode() * 1000L + r * 7L + size);
            ok &= t.saved() && t.loaded();
            double[] save = t.save();
            double[] load = t.load();
            if (recordFirst && n == paths.blocks) {
                report.put(name + "_first_save_s", save[0]);
                report.put(name + "_first_load_s", load[0]);
                paths.each.put(name + "_save", save);
                paths.each.put(name + "_load", load);
                report.put(name + "_save_s_each", Stats.rounded(save));
                report.put(name + "_load_s_each", Stats.rounded(load));
            }
            if (name.equals("server")) {
                // where the time of the median operation went: each batch's submit and copy end, then the caller's
                // return, in µs from the call (submit@, done@ per batch; end@)
                report.put("server_timeline_save_us" + suffix, t.saveLines()[Stats.medianIndex(save)]);
                report.put("server_timeline_load_us" + suffix, t.loadLines()[Stats.medianIndex(load)]);
                // and of the first (first_op_ratio)
                report.put("server_timeline_first_save_us" + suffix, t.saveLines()[0]);
                report.put("server_timeline_first_load_us" + suffix, t.loadLines()[0]);
            }
            paths.putRates(name, suffix, n * paths.blockBytes, Stats.median(save), Stats.median(load));
        }
        ok &= PathsRestore.run(paths, name, engine, instance, kv, ids);
        engine.unregisterInstance(instance);
        report.put(name + "_verified", ok);
    }

    /** {@code instance} of one rank, {@code kv} its only worker's cache (on {@code --device} when copying with CUDA). */
    static void register(PathsCommand paths, PegaEngine engine, String instance, String model, Kv kv) {
        engine.registerInstance(new InstanceSpec(instance, model, 1, 1));
        engine.registerWorker(instance, new WorkerSpec(0, 0, paths.cuda ? paths.device : -1, kv.regions()));
    }

    /**
     * {@code repeat} rounds of {@code n} blocks: fresh blocks filled and saved under the hashes
     * of {@code seed(round)}, then the worker's load of the lease a query took into other
     * blocks, each call timed and its timeline recorded.
     */
    static Rounds rounds(PathsCommand paths, PegaEngine engine, String instance, Kv kv, Ids ids, int n, IntToLongFunction seed) {
        int repeat = paths.repeat;
        Timeline timeline = paths.timeline;
        double[] save = new double[repeat];
        double[] load = new double[repeat];
        String[] saveLines = new String[repeat];
        String[] loadLines = new String[repeat];
        boolean saved = true;
        boolean loaded = true;
        for (int r = 0; r < repeat; r++) {
            long[] src = ids.take(n);
            long[] dst = ids.take(n);
            BlockHashes h = Ids.hashes(n, seed.applyAsLong(r));
            kv.fill(src, r);
            timeline.clear();
            long t0 = System.nanoTime();
            CopyResult result = engine.save(instance, 0, src, h).join();
            save[r] = (System.nanoTime() - t0) / 1e9;
            saveLines[r] = timeline.since(t0, System.nanoTime());
            saved &= result.blocks() == n;
            kv.clear(dst);
            // the worker path: its share of a lease the scheduler took (the restore times both)
            QueryResult q = engine.query(instance, h);
            timeline.clear();
            t0 = System.nanoTime();
            engine.load(instance, 0, q.lease(), dst).join();
            load[r] = (System.nanoTime() - t0) / 1e9;
            loadLines[r] = timeline.since(t0, System.nanoTime());
            loaded &= q.hitBlocks() == n && kv.check(dst, r);
        }
        return new Rounds(save, load, saveLines, loadLines, saved, loaded);
    }
}
