import io.pegaflow.client.EngineClient;
import io.pegaflow.connector.LookupWarmUp;
import io.pegaflow.engine.*;
import io.pegaflow.engine.transfer.HostTransferEngine;
import java.lang.foreign.Arena;
import java.nio.file.*;
import java.util.*;

/**
 * A fresh vLLM process's first warm lookups in server mode, on the host: this JVM is the
 * process (the connector's client of pegaflow-server), the server another process started here
 * (busy-polling 1 s, as the low_ttft benchmarks run it; {@code -DbusyPollUs=U} for another
 * spin; {@code -DserverCpus=LIST} runs the server under {@code taskset -c LIST}, so on a host of
 * two cores this process, itself under {@code taskset -c} the other, keeps a core the spinning
 * server thread does not take). First the process's warm-up as the
 * connector would run it, by the argument: "none" (no warm-up), "embedded" (its rounds on an
 * embedded scratch engine: what a server-mode process ran before) or "server" (its rounds as a
 * client of a private scratch server: LookupWarmUp in server mode); then 30 queries that begin
 * the load of a stored 512-block prefix of 32 layers (a warm 8K request), 600 ms apart as the
 * TTFT benchmark's requests come, each lease released. Prints one JSON line: the warm-up's ms,
 * the p50 of the first 10 and of the next 20 calls, µs, and every call:
 *   [taskset -c 1] java --enable-native-access=ALL-UNNAMED [-DbusyPollUs=0] [-DserverCpus=0] -cp bench/target/pegaflow.jar bench/probe/ClientWarmUpProbe.java none|embedded|server
 */
public class ClientWarmUpProbe {
  public static void main(String[] a) throws Exception {
    String arm = a.length > 0 ? a[0] : "server";
    if (!List.of("none", "embedded", "server").contains(arm)) throw new IllegalArgumentException("arm " + arm + "; expected none, embedded or server");
    Path dir = Files.createTempDirectory("cwp");
    int port = 50100 + (int) (ProcessHandle.current().pid() % 800);
    String jar = System.getProperty("java.class.path");
    List<String> cmd = new ArrayList<>();
    String cpus = System.getProperty("serverCpus");
    if (cpus != null) cmd.addAll(List.of("taskset", "-c", cpus)); // the server's CPUs, apart from this process's
    cmd.addAll(List.of(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
        "--enable-native-access=ALL-UNNAMED", "-Xms64m", "-Xmx2g", "-XX:+UseSerialGC", "-cp", jar, "io.pegaflow.server.ServerMain",
        "--addr", "127.0.0.1:" + port, "--http-addr", "127.0.0.1:" + (port + 1000), "--pool-size", "256mb",
        "--pool-path", dir.resolve("pool").toString(), "--busy-poll-us", Long.getLong("busyPollUs", 1_000_000L).toString()));
    Process server = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(dir.resolve("server.log").toFile()).start();
    try {
      for (int i = 0; i < 300 && !Files.readString(dir.resolve("server.log")).contains("ready"); i++) Thread.sleep(100);
      long w0 = System.nanoTime();
      if (!arm.equals("none")) {
        LookupWarmUp.Result r = LookupWarmUp.run(16, 400, 3_000_000_000L, 0, arm.equals("server") ? ScratchServers.provided() : null);
        if (r.throughServer() != arm.equals("server")) throw new IllegalStateException("warm-up through server: " + r.throughServer());
      }
      long warmUpNanos = System.nanoTime() - w0;
      int blocks = 512;
      try (Arena arena = Arena.ofShared(); PegaEngine w = EngineClient.connect("127.0.0.1:" + port, p -> new HostTransferEngine(p, 1), 5000)) {
        String inst = "cwp";
        BlockHashes h = BeginQueryProbe.storedPrefix(w, arena, inst, blocks); // bench/probe/BeginQueryProbe.java, beside
        long[] t = new long[30];
        for (int i = 0; i < t.length; i++) {
          Thread.sleep(600);
          long t0 = System.nanoTime();
          QueryResult q = w.queryAndBegin(inst, h, 0);
          t[i] = System.nanoTime() - t0;
          if (q.hitBlocks() != blocks || q.begun() == null) throw new IllegalStateException("hit " + q.hitBlocks());
          w.release(inst, q.lease());
        }
        long[] first = Arrays.copyOfRange(t, 0, 10), rest = Arrays.copyOfRange(t, 10, 30);
        Arrays.sort(first); Arrays.sort(rest);
        System.out.printf(Locale.ROOT, "{\"warm_up\": \"%s\", \"warm_up_ms\": %.0f, \"calls_1_10_p50_us\": %.1f, \"calls_11_30_p50_us\": %.1f, \"calls_us\": %s}%n",
            arm, warmUpNanos / 1e6, first[5] / 1e3, rest[10] / 1e3, Arrays.toString(Arrays.stream(t).map(x -> x / 1000).toArray()));
      }
    } finally {
      server.destroy();
      server.waitFor();
      try (var s = Files.walk(dir)) { s.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete()); }
    }
  }
}
