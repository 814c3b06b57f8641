import io.pegaflow.bench.jmh.LayeredPlanBenchmark;
import io.pegaflow.engine.*;
/**
 * Where an in-step load's plan goes on the host, without a GPU: query + lease of a 1,024-block
 * Llama-3.1-8B prefix (32 layers, two 32 KiB pieces per layer and block, as vLLM 0.26 lays it
 * out; LayeredPlanBenchmark's fixture), then loadLayered on a copy engine that moves nothing,
 * timed by the load's own parts (LayeredLoad.plannedNanos, buildNanos, submitNanos: the worker
 * counters in_step_store_ns, in_step_build_ns, in_step_submit_ns). Prints the means of each part
 * over the second half of SECONDS of back-to-back loads (the first half warms the JIT). That
 * engine's futures are done when submit returns, so its submit_ms is a no-op's (the CUDA
 * engine's also waits for a free lane and pins pool chunks on first touch), and load_layered_ms
 * includes the load's end, which a real copy runs later on the copy's thread. Also per load over
 * the same half: the bytes this thread allocated (the query, the plan and the copy list: the
 * young generation they fill) and the collections of every collector, per thousand loads; run
 * with the options of the JVM inside vLLM (pegaflow._bridge.base_options) to see its collections:
 *   java --enable-native-access=ALL-UNNAMED -cp bench/target/pegaflow.jar bench/probe/PlanSplitProbe.java SECONDS
 */
public class PlanSplitProbe {
  public static void main(String[] a) throws Exception {
    LayeredPlanBenchmark.Fixture f = LayeredPlanBenchmark.fixture(1024);
    PegaEngine engine = f.engine();
    long start = System.nanoTime(), half = start + Long.parseLong(a[0]) * 500_000_000L, end = half + (half - start);
    long n = 0, query = 0, store = 0, build = 0, submit = 0, whole = 0, alloc0 = -1, gcs0 = -1;
    var threads = (com.sun.management.ThreadMXBean) java.lang.management.ManagementFactory.getThreadMXBean();
    while (System.nanoTime() < end) {
      if (alloc0 < 0 && System.nanoTime() >= half) {
        alloc0 = threads.getCurrentThreadAllocatedBytes();
        gcs0 = collections();
      }
      long t0 = System.nanoTime();
      QueryResult q = engine.query("bench", f.hashes());
      long t1 = System.nanoTime();
      LayeredLoad load = engine.loadLayered("bench", 0, q.lease(), f.dst());
      long t2 = System.nanoTime();
      load.result().join();
      if (t0 >= half) {
        n++; query += t1 - t0; store += load.plannedNanos() - t1; build += load.buildNanos(); submit += load.submitNanos(); whole += t2 - t1;
      }
    }
    if (n == 0) {
      throw new IllegalArgumentException("no load timed in " + a[0] + " s; expected SECONDS of at least 2");
    }
    long alloc = threads.getCurrentThreadAllocatedBytes() - alloc0, gcs = collections() - gcs0;
    System.out.printf("{\"loads\": %d, \"query_ms\": %.3f, \"store_plan_ms\": %.3f, \"build_ms\": %.3f, \"submit_ms\": %.3f, \"load_layered_ms\": %.3f, "
        + "\"allocated_kib_per_load\": %.1f, \"collections_per_1000_loads\": %.1f}%n",
        n, query / 1e6 / n, store / 1e6 / n, build / 1e6 / n, submit / 1e6 / n, whole / 1e6 / n, alloc / 1024.0 / n, gcs * 1000.0 / n);
    engine.close();
  }

  /** Collections so far, every collector together. */
  static long collections() {
    long c = 0;
    for (var gc : java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()) {
      c += Math.max(0, gc.getCollectionCount());
    }
    return c;
  }
}
