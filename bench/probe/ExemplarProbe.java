import io.prometheus.metrics.core.metrics.Counter;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.util.Arrays;
import java.util.Locale;

/**
 * One Prometheus counter increment after the process idled 600 ms, a counter built as the
 * library's builder gives it (exemplars on) beside one built without exemplars, as the server's
 * metrics are since the query-after-idle measurement (docs/benchmarks/README.md, "A spaced-out
 * query's answer in the server"); 15 increments each, the p50 and max in µs as one JSON line:
 *   java -cp bench/target/pegaflow.jar bench/probe/ExemplarProbe.java
 */
public class ExemplarProbe {
  public static void main(String[] a) throws Exception {
    PrometheusRegistry r = new PrometheusRegistry();
    Counter with = Counter.builder().name("probe_with_exemplars").register(r);
    Counter without = Counter.builder().name("probe_without_exemplars").withoutExemplars().register(r);
    for (int i = 0; i < 10_000; i++) { with.inc(); without.inc(); }
    long[] w = new long[15], wo = new long[15];
    for (int i = 0; i < w.length; i++) {
      Thread.sleep(600);
      long t0 = System.nanoTime(); with.inc(5); long t1 = System.nanoTime(); w[i] = t1 - t0;
      Thread.sleep(600);
      t0 = System.nanoTime(); without.inc(5); wo[i] = System.nanoTime() - t0;
    }
    Arrays.sort(w); Arrays.sort(wo);
    System.out.printf(Locale.ROOT, "{\"idle_ms\": 600, \"with_exemplars_p50_us\": %.1f, \"with_exemplars_max_us\": %.1f, "
        + "\"without_exemplars_p50_us\": %.1f, \"without_exemplars_max_us\": %.1f}%n",
        w[7] / 1e3, w[14] / 1e3, wo[7] / 1e3, wo[14] / 1e3);
  }
}
