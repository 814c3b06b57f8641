import io.pegaflow.client.RemoteStore;
import io.pegaflow.engine.*;
import java.util.*;
/**
 * A query's round trip over the server's local socket after the client idled 0, 1, 10 or 50 ms:
 * what a thread that slept costs (docs/gpu.md, docs/server.md). Run against a live server:
 *   java --enable-native-access=ALL-UNNAMED -cp bench/target/pegaflow.jar bench/probe/IdleRoundTrip.java HOST:PORT
 */
public class IdleRoundTrip {
  public static void main(String[] a) throws Exception {
    try (RemoteStore s = RemoteStore.connect(a[0], 30000)) {
      String inst = "idle" + ProcessHandle.current().pid();
      s.registerInstance(new InstanceSpec(inst, "idle-ns", 1, 1));
      List<LayerRegion> regions = new ArrayList<>();
      for (int l = 0; l < 2; l++) regions.add(new LayerRegion("layers." + l, KvLayout.SPLIT_KV, (1L<<44) + l*(1L<<20), 1L<<20, 1024, 512, 512, 1024L*512));
      s.registerWorker(inst, new WorkerSpec(0, 0, -1, regions));
      byte[] h = new byte[16 * 32]; new Random(1).nextBytes(h);
      BlockHashes hs = new BlockHashes(h, 32);
      for (int i = 0; i < 3000; i++) s.query(inst, hs);   // warm
      for (int sleepMs : new int[]{0, 1, 10, 50}) {
        double[] t = new double[200];
        for (int r = 0; r < t.length; r++) {
          if (sleepMs > 0) Thread.sleep(sleepMs);
          long t0 = System.nanoTime();
          s.query(inst, hs);
          t[r] = (System.nanoTime() - t0) / 1e3;
        }
        Arrays.sort(t);
        System.out.printf("idle %d ms before: query RTT p50 %.0f us p90 %.0f us%n", sleepMs, t[100], t[180]);
      }
    }
  }
}
