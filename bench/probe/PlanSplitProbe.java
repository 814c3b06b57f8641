import io.pegaflow.engine.*;
import io.pegaflow.engine.transfer.*;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.TimeUnit;
/**
 * Where an in-step load's plan goes on the host, without a GPU: query + lease of a 1,024-block
 * Llama-3.1-8B prefix (32 layers, two 32 KiB pieces per layer and block, as vLLM 0.26 lays it
 * out), then loadLayered on a copy engine that moves nothing, timed by the load's own parts
 * (LayeredLoad.plannedNanos, buildNanos, submitNanos: the worker counters in_step_store_ns,
 * in_step_build_ns, in_step_submit_ns). Prints the means of each part over the second half of
 * SECONDS of back-to-back loads (the first half warms the JIT). That engine's futures are done
 * when submit returns, so its submit_ms is a no-op's (the CUDA engine's also waits for a free
 * lane and pins pool chunks on first touch), and load_layered_ms includes the load's end, which
 * a real copy runs later on the copy's thread:
 *   java --enable-native-access=ALL-UNNAMED -cp bench/target/pegaflow.jar bench/probe/PlanSplitProbe.java SECONDS
 */
public class PlanSplitProbe {
  static final int LAYERS = 32, BLOCKS = 1024;
  static final long PIECE = 32 * 1024;

  public static void main(String[] a) throws Exception {
    TransferEngine nothing = new TransferEngine() {
      public TransferFuture submit(CopyBatch b) { TransferFuture f = new TransferFuture(); f.complete(null); return f; }
      public String name() { return "nothing-moves"; }
      public void close() {}
    };
    PegaEngine engine = PegaEngine.create(EngineConfig.builder().poolBytes(BLOCKS * LAYERS * 2 * PIECE + (64L << 20))
        .sweepInterval(Duration.ZERO).transfer(pool -> nothing).build());
    engine.registerInstance(new InstanceSpec("probe", "probe-ns", 1, 1));
    List<LayerRegion> layers = new ArrayList<>();
    long base = 1L << 40; // never dereferenced: nothing moves
    for (int l = 0; l < LAYERS; l++) {
      long bytes = 2L * 2 * BLOCKS * PIECE;
      layers.add(new LayerRegion("model.layers." + l + ".self_attn.attn", KvLayout.SPLIT_KV, base, bytes, 2 * BLOCKS,
          PIECE, PIECE, 2 * BLOCKS * PIECE));
      base += bytes;
    }
    engine.registerWorker("probe", new WorkerSpec(0, 0, 0, layers));
    byte[] packed = new byte[BLOCKS * 32];
    new Random(1).nextBytes(packed);
    BlockHashes hashes = new BlockHashes(packed, 32);
    long[] src = new long[BLOCKS], dst = new long[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) { src[i] = i; dst[i] = BLOCKS + i; }
    engine.save("probe", 0, src, hashes).get(60, TimeUnit.SECONDS);
    engine.flush(60_000);
    QueryResult check = engine.query("probe", hashes);
    if (check.hitBlocks() != BLOCKS) {
      throw new IllegalStateException("saved " + BLOCKS + " blocks, " + check.hitBlocks() + " resident");
    }
    engine.release("probe", check.lease());
    long start = System.nanoTime(), half = start + Long.parseLong(a[0]) * 500_000_000L, end = half + (half - start);
    long n = 0, query = 0, store = 0, build = 0, submit = 0, whole = 0;
    while (System.nanoTime() < end) {
      long t0 = System.nanoTime();
      QueryResult q = engine.query("probe", hashes);
      long t1 = System.nanoTime();
      LayeredLoad load = engine.loadLayered("probe", 0, q.lease(), dst);
      long t2 = System.nanoTime();
      load.result().join();
      if (t0 >= half) {
        n++; query += t1 - t0; store += load.plannedNanos() - t1; build += load.buildNanos(); submit += load.submitNanos(); whole += t2 - t1;
      }
    }
    if (n == 0) {
      throw new IllegalArgumentException("no load timed in " + a[0] + " s; expected SECONDS of at least 2");
    }
    System.out.printf("{\"loads\": %d, \"query_ms\": %.3f, \"store_plan_ms\": %.3f, \"build_ms\": %.3f, \"submit_ms\": %.3f, \"load_layered_ms\": %.3f}%n",
        n, query / 1e6 / n, store / 1e6 / n, build / 1e6 / n, submit / 1e6 / n, whole / 1e6 / n);
    engine.close();
  }
}
