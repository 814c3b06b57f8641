import io.pegaflow.connector.LookupWarmUp;
import io.pegaflow.connector.SchedulerSide;
import io.pegaflow.connector.WorkerSide;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.EngineSource;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.WorkerSpec;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;

/**
 * A fresh JVM's first fifteen warm requests for stored 1,024-block prefixes (a 16K prompt's) on an
 * embedded engine with host copies, with the connector's warm-up ({@code LookupWarmUp}) run to its
 * end first ({@code warm}) or not ({@code none}). Each prefix is saved first (32 layers, K and V
 * apart, as vLLM's per-layer tensors); then a new request looks it up ({@code lookups}: the
 * lookup is timed) or looks it up and loads it in the step into other blocks, layer by layer
 * ({@code loads}: from the worker's start of the step's loads to its last layer). Prints the
 * warm-up's own time ({@code warm}), the median and each request's ms.
 *   java --enable-native-access=ALL-UNNAMED -cp bench/target/pegaflow.jar bench/probe/LookupWarmUpProbe.java none|warm lookups|loads
 */
public class LookupWarmUpProbe {
    public static void main(String[] a) throws Exception {
        if (a.length != 2 || !List.of("none", "warm").contains(a[0]) || !List.of("lookups", "loads").contains(a[1])) {
            throw new IllegalArgumentException("expected none|warm lookups|loads; got " + Arrays.toString(a));
        }
        if (a[0].equals("warm")) {
            long w0 = System.nanoTime();
            LookupWarmUp.startOnce(16).join();
            System.out.printf("warm-up: %.0f ms%n", (System.nanoTime() - w0) / 1e6);
        }
        int blocks = 1024;
        int layers = 32;
        long segment = 128;
        try (Arena arena = Arena.ofConfined();
                PegaEngine e = PegaEngine.create(EngineConfig.builder().poolBytes(64L << 20).build())) {
            List<LayerRegion> regions = new ArrayList<>();
            for (int l = 0; l < layers; l++) {
                long bytes = 2 * 2 * blocks * segment;
                MemorySegment kv = arena.allocate(bytes, 64);
                regions.add(new LayerRegion("model.layers." + l + ".self_attn.attn", KvLayout.SPLIT_KV, kv.address(), bytes,
                        2 * blocks, segment, segment, 2L * blocks * segment));
            }
            e.registerInstance(new InstanceSpec("probe", "probe", 1, 1));
            e.registerWorker("probe", new WorkerSpec(0, 0, 0, regions));
            EngineSource source = () -> new EngineSource.Binding(e, 1);
            SchedulerSide side = new SchedulerSide(source, "probe", 16, true);
            side.inStepLoads(true);
            WorkerSide worker = new WorkerSide(source, "probe", 0);
            Random rnd = new Random(7);
            long[] ids = new long[blocks];
            Arrays.setAll(ids, i -> i);
            long[] targets = new long[blocks];
            Arrays.setAll(targets, i -> blocks + i);
            double[] ms = new double[15];
            try {
                for (int p = 0; p < ms.length; p++) {
                    byte[] keys = new byte[blocks * 32];
                    rnd.nextBytes(keys);
                    BlockHashes prefix = new BlockHashes(keys, 32);
                    e.save("probe", 0, ids, prefix).join();
                    String id = "warm-" + p;
                    long t0 = System.nanoTime();
                    long hit = side.lookup(id, prefix, blocks * 16L + 1, 0);
                    if (a[1].equals("lookups")) {
                        ms[p] = (System.nanoTime() - t0) / 1e6;
                    } else {
                        side.afterAlloc(id, targets, hit);
                        byte[] plan = side.buildPlan();
                        t0 = System.nanoTime();
                        worker.startLoads(plan);
                        for (int l = 0; l < layers; l++) {
                            worker.waitLayer(l, 0);
                        }
                        ms[p] = (System.nanoTime() - t0) / 1e6;
                        worker.getFinished(List.of());
                        if (worker.drainLoadErrors().length > 0) {
                            throw new IllegalStateException("load of request " + id + " failed");
                        }
                        side.finished(List.of(), List.of());
                    }
                    if (hit != blocks * 16L) {
                        throw new IllegalStateException("request " + id + " hit " + hit + " tokens; expected " + blocks * 16);
                    }
                    side.requestFinished(id);
                }
            } finally {
                worker.shutdown();
            }
            double[] sorted = ms.clone();
            Arrays.sort(sorted);
            System.out.printf("%s %s: median %.3f ms, first %.3f, each %s%n", a[0], a[1], sorted[ms.length / 2], ms[0],
                    Arrays.toString(Arrays.stream(ms).map(x -> Math.round(x * 1000) / 1000.0).toArray()));
        }
    }
}
