import io.pegaflow.engine.*;
import io.pegaflow.engine.transfer.HostTransferEngine;
import io.pegaflow.client.EngineClient;
import io.pegaflow.server.PegaflowServer;
import java.lang.foreign.Arena;
import java.nio.file.*;
import java.time.Duration;
import java.util.*;

/**
 * A warm 16K request's lookup in server mode, on the host: query (and lease) of a stored
 * 1,024-block prefix of 32 layers through pegaflow-server's local socket, plain and with the load
 * begun (queryAndBegin: the query that also hands back the load's copy plan, what the connector's
 * lookup does since 4d266b7), back to back and after the client idled 1-600 ms (requests in the
 * TTFT benchmark come ~0.6 s apart), the lease released after each, untimed. After idling, a
 * 1-hash query first ("ping") and then the whole one, to part the threads' wake-up from the
 * work. Starts its own server in this JVM (host copies, 512-byte segments: the store's work
 * follows the block and layer counts, not the bytes), or with the argument "local" asks an
 * embedded engine instead (no server, no socket); prints one JSON line per case, the back-to-back
 * and 600 ms cases with the store's own phases of a query (its counters: lookup, lease, plan).
 * {@code -Dblocks=N} stores and asks for N blocks instead (512: a warm 8K request), and
 * {@code -DbusyPollUs=U} has the server's connection threads spin U µs for a next frame
 * ({@code --busy-poll-us}; the client then spins for its answers, as in the connector):
 *   java --enable-native-access=ALL-UNNAMED [-Dblocks=512] [-DbusyPollUs=1000000] -cp bench/target/pegaflow.jar bench/probe/BeginQueryProbe.java [local]
 */
public class BeginQueryProbe {
  public static void main(String[] a) throws Exception {
    int blocks = Integer.getInteger("blocks", 1024);
    long busyPollUs = Long.getLong("busyPollUs", 0L);
    boolean local = a.length > 0 && a[0].equals("local");
    Path dir = Files.createTempDirectory("bq");
    PegaflowServer own = local ? null : PegaflowServer.start(new PegaflowServer.Config("127.0.0.1:0", null, 128L << 20,
        dir.resolve("pool"), Duration.ofSeconds(600), Duration.ofSeconds(2), true), true, busyPollUs);
    try (Arena arena = Arena.ofShared(); PegaEngine w = local ? PegaEngine.create(EngineConfig.builder().poolSize("128mb").build())
        : EngineClient.connect("127.0.0.1:" + own.port(), p -> new HostTransferEngine(p, 1), 5000)) {
      String inst = "bq";
      BlockHashes h = storedPrefix(w, arena, inst, blocks);
      byte[] packed = h.packed();
      for (String mode : new String[] {"query", "queryAndBegin", "query", "queryAndBegin"}) {
        for (int i = 0; i < 1000; i++) once(w, inst, h, mode, blocks);
        long[] s = new long[2000];
        EngineStats before = w.stats();
        for (int i = 0; i < s.length; i++) s[i] = once(w, inst, h, mode, blocks);
        String phases = phases(before, w.stats(), s.length);
        Arrays.sort(s);
        System.out.printf(Locale.ROOT, "{\"mode\": \"%s\", \"idle_ms\": 0, \"p50_us\": %.1f, \"p90_us\": %.1f, %s}%n", mode, s[s.length / 2] / 1e3, s[s.length * 9 / 10] / 1e3, phases);
      }
      BlockHashes one = new BlockHashes(Arrays.copyOf(packed, 32), 32);
      for (int idle : new int[] {1, 10, 100, 600}) {
        long[] ping = new long[15], after = new long[15];
        for (int i = 0; i < 15; i++) {
          Thread.sleep(idle);
          long t0 = System.nanoTime(); QueryResult q1 = w.query(inst, one); ping[i] = System.nanoTime() - t0; w.release(inst, q1.lease());
          after[i] = once(w, inst, h, "queryAndBegin", blocks);
        }
        Arrays.sort(ping); Arrays.sort(after);
        System.out.printf(Locale.ROOT, "{\"idle_ms\": %d, \"ping_1_hash_p50_us\": %.1f, \"then_queryAndBegin_p50_us\": %.1f}%n", idle, ping[7] / 1e3, after[7] / 1e3);
      }
      for (String mode : new String[] {"query", "queryAndBegin"}) {
        long[] s = new long[15];
        EngineStats before = w.stats();
        for (int i = 0; i < s.length; i++) { Thread.sleep(600); s[i] = once(w, inst, h, mode, blocks); }
        String phases = phases(before, w.stats(), s.length);
        Arrays.sort(s);
        System.out.printf(Locale.ROOT, "{\"mode\": \"%s\", \"idle_ms\": 600, \"p50_us\": %.1f, \"max_us\": %.1f, %s}%n", mode, s[s.length / 2] / 1e3, s[s.length - 1] / 1e3, phases);
      }
    } finally {
      if (own != null) own.close();
    }
  }
  /**
   * Registers instance {@code inst} with one worker of 32 layers of {@code blocks} 512-byte
   * blocks in {@code arena} (the store's work follows the block and layer counts, not the
   * bytes), saves {@code blocks} random hashes (seed 5) and returns them. ClientWarmUpProbe's too.
   */
  static BlockHashes storedPrefix(PegaEngine w, Arena arena, String inst, int blocks) {
    int layers = 32; long seg = 512;
    w.registerInstance(new InstanceSpec(inst, inst + "-ns", 1, 1));
    List<LayerRegion> regions = new ArrayList<>();
    for (int l = 0; l < layers; l++) {
      long base = arena.allocate(2 * blocks * seg, 4096).address();
      regions.add(new LayerRegion("layers." + l, KvLayout.SPLIT_KV, base, 2 * blocks * seg, blocks, seg, seg, blocks * seg));
    }
    w.registerWorker(inst, new WorkerSpec(0, 0, 0, regions));
    byte[] packed = new byte[blocks * 32]; new Random(5).nextBytes(packed);
    BlockHashes h = new BlockHashes(packed, 32);
    long[] ids = new long[blocks]; for (int i = 0; i < blocks; i++) ids[i] = i;
    w.save(inst, 0, ids, h).join();
    return h;
  }
  /** The store's own phases of the timed queries, mean us per query (its counters: lookup, lease, plan). */
  static String phases(EngineStats a, EngineStats b, int n) {
    io.pegaflow.engine.metrics.Counter[] c = {io.pegaflow.engine.metrics.Counter.QUERY_LOOKUP_NANOS,
        io.pegaflow.engine.metrics.Counter.QUERY_LEASE_NANOS, io.pegaflow.engine.metrics.Counter.QUERY_PLAN_NANOS};
    return String.format(Locale.ROOT, "\"store_lookup_us\": %.1f, \"store_lease_us\": %.1f, \"store_plan_us\": %.1f",
        (b.get(c[0]) - a.get(c[0])) / 1e3 / n, (b.get(c[1]) - a.get(c[1])) / 1e3 / n, (b.get(c[2]) - a.get(c[2])) / 1e3 / n);
  }
  static long once(PegaEngine w, String inst, BlockHashes h, String mode, int blocks) {
    long t0 = System.nanoTime();
    QueryResult q = mode.equals("query") ? w.query(inst, h) : w.queryAndBegin(inst, h, 0);
    long t = System.nanoTime() - t0;
    if (q.hitBlocks() != blocks) throw new IllegalStateException("hit " + q.hitBlocks());
    if (mode.equals("queryAndBegin") && q.begun() == null) throw new IllegalStateException("not begun");
    w.release(inst, q.lease());
    return t;
  }
}
