import io.pegaflow.connector.LookupWarmUp;
import io.pegaflow.connector.SchedulerSide;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.CopyPlan;
import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.EngineSource;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.WorkerSpec;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.Arrays;
import java.util.List;
import java.util.Random;

/**
 * A fresh JVM's first fifteen lookups of stored 1,024-block prefixes (a 16K prompt's) through
 * the scheduler side on an embedded engine, with the lookup warm-up run to its end first
 * ({@code warm}) or not ({@code none}); each prefix is looked up cold and sealed first, as the
 * benchmark's prompts are saved before their warm answers. Prints the median and each lookup's ms.
 *   java --enable-native-access=ALL-UNNAMED -cp bench/target/pegaflow.jar bench/probe/LookupWarmUpProbe.java none|warm
 */
public class LookupWarmUpProbe {
    public static void main(String[] a) throws Exception {
        if (a.length != 1 || !(a[0].equals("none") || a[0].equals("warm"))) {
            throw new IllegalArgumentException("expected one argument, none or warm; got " + Arrays.toString(a));
        }
        if (a[0].equals("warm")) {
            LookupWarmUp.startOnce(16).join();
        }
        int blocks = 1024;
        long slot = 512;
        try (Arena arena = Arena.ofConfined();
                PegaEngine e = PegaEngine.create(EngineConfig.builder().poolBytes(64L << 20).build())) {
            MemorySegment kv = arena.allocate(blocks * slot, 64);
            e.registerInstance(new InstanceSpec("probe", "probe", 1, 1));
            e.registerWorker("probe", new WorkerSpec(0, 0, 0, List.of(new LayerRegion("model.layers.0.self_attn.attn",
                    KvLayout.MLA, kv.address(), kv.byteSize(), blocks, slot, slot, 0))));
            SchedulerSide side = new SchedulerSide(() -> new EngineSource.Binding(e, 1), "probe", 16, true);
            side.inStepLoads(true);
            Random rnd = new Random(7);
            long[] ids = new long[blocks];
            Arrays.setAll(ids, i -> i);
            double[] ms = new double[15];
            for (int p = 0; p < ms.length; p++) {
                byte[] keys = new byte[blocks * 32];
                rnd.nextBytes(keys);
                BlockHashes prefix = new BlockHashes(keys, 32);
                side.lookup("cold-" + p, prefix, blocks * 16L + 1, 0);
                side.requestFinished("cold-" + p);
                CopyPlan saved = e.localStore().reserveSave("probe", 0, null, ids, prefix);
                e.localStore().endCopy("probe", saved.id(), true, 0, 0);
                long t0 = System.nanoTime();
                long hit = side.lookup("warm-" + p, prefix, blocks * 16L + 1, 0);
                ms[p] = (System.nanoTime() - t0) / 1e6;
                if (hit != blocks * 16L) {
                    throw new IllegalStateException("warm lookup " + p + " answered " + hit + " tokens; expected " + blocks * 16);
                }
                side.requestFinished("warm-" + p);
            }
            double[] sorted = ms.clone();
            Arrays.sort(sorted);
            System.out.printf("%s: median %.3f ms, first %.3f, each %s%n", a[0], sorted[ms.length / 2], ms[0],
                    Arrays.toString(Arrays.stream(ms).map(x -> Math.round(x * 1000) / 1000.0).toArray()));
        }
    }
}
