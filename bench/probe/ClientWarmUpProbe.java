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
 * the p50 of the first 10 and of the next 20 calls, µs, the server's own time per Query and its
 * store's lookup, lease and plan phases (its /metrics, read with curl), and every call. Options:
 * {@code -Dprompts=N} goes as the TTFT benchmark does instead (N new 512-block prompts saved,
 * then each looked up and its begun load copied, 600 ms apart, until 30 calls);
 * {@code -DserverPrewarm=N} has another process's client make N back-to-back lookups of its own
 * prefix on the fresh server first (the server alone warmed by real calls);
 * {@code -Dhammer=N} adds N back-to-back calls after the 30 and 30 spaced ones again (not with -Dprompts);
 * {@code -DserverJvmArgs="..."} passes JVM options to the server (e.g. -XX:+PrintCompilation),
 * {@code -DserverLog=FILE} keeps its output:
 *   [taskset -c 1] java --enable-native-access=ALL-UNNAMED [-DbusyPollUs=0] [-DserverCpus=0] [-Dprompts=5] -cp bench/target/pegaflow.jar bench/probe/ClientWarmUpProbe.java none|embedded|server
 */
public class ClientWarmUpProbe {
  public static void main(String[] a) throws Exception {
    if (a.length == 3 && a[0].equals("prewarm")) { // another process's client: only the server warms
      try (Arena arena = Arena.ofShared(); PegaEngine w = EngineClient.connect("127.0.0.1:" + a[1], p -> new HostTransferEngine(p, 1), 5000)) {
        BlockHashes h = BeginQueryProbe.storedPrefix(w, arena, "prewarm", 512);
        for (int i = 0; i < Integer.parseInt(a[2]); i++) w.release("prewarm", w.queryAndBegin("prewarm", h, 0).lease());
      }
      return;
    }
    String arm = a.length > 0 ? a[0] : "server";
    if (!List.of("none", "embedded", "server").contains(arm)) throw new IllegalArgumentException("arm " + arm + "; expected none, embedded or server");
    Path dir = Files.createTempDirectory("cwp");
    int port = 50100 + (int) (ProcessHandle.current().pid() % 800);
    String jar = System.getProperty("java.class.path");
    List<String> cmd = new ArrayList<>();
    String cpus = System.getProperty("serverCpus");
    if (cpus != null) cmd.addAll(List.of("taskset", "-c", cpus)); // the server's CPUs, apart from this process's
    cmd.addAll(List.of(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
        "--enable-native-access=ALL-UNNAMED", "-Xms64m", "-Xmx2g", "-XX:+UseSerialGC"));
    String jvmArgs = System.getProperty("serverJvmArgs"); // e.g. -XX:+PrintCompilation, its output in -DserverLog
    if (jvmArgs != null) cmd.addAll(List.of(jvmArgs.split(" ")));
    cmd.addAll(List.of("-cp", jar, "io.pegaflow.server.ServerMain",
        "--addr", "127.0.0.1:" + port, "--http-addr", "127.0.0.1:" + (port + 1000), "--pool-size", "256mb",
        "--pool-path", dir.resolve("pool").toString(), "--busy-poll-us", Long.getLong("busyPollUs", 1_000_000L).toString()));
    Process server = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(dir.resolve("server.log").toFile()).start();
    try {
      for (int i = 0; i < 300 && !Files.readString(dir.resolve("server.log")).contains(" ready grpc="); i++) Thread.sleep(100);
      int prewarm = Integer.getInteger("serverPrewarm", 0);
      if (prewarm > 0) { // the server alone warmed by another process's back-to-back calls first
        // compiled (javac -d DIR, DIR on the class path): the class by name; else this source file
        String main = ClientWarmUpProbe.class.getClassLoader() == ClassLoader.getSystemClassLoader()
            ? "ClientWarmUpProbe" : "bench/probe/ClientWarmUpProbe.java";
        Process p = new ProcessBuilder(Path.of(System.getProperty("java.home"), "bin", "java").toString(), "--enable-native-access=ALL-UNNAMED",
            "-cp", jar, main, "prewarm", String.valueOf(port), String.valueOf(prewarm)).inheritIO().start();
        if (p.waitFor() != 0) throw new IllegalStateException("prewarm exited " + p.exitValue());
      }
      long w0 = System.nanoTime();
      if (!arm.equals("none")) {
        LookupWarmUp.Result r = LookupWarmUp.run(16, 400, 3_000_000_000L, 0, arm.equals("server") ? ScratchServers.provided() : null);
        if (r.throughServer() != arm.equals("server")) throw new IllegalStateException("warm-up through server: " + r.throughServer());
      }
      long warmUpNanos = System.nanoTime() - w0;
      if (Boolean.getBoolean("mark")) System.out.println("=== warm-up done ===");
      int blocks = 512;
      try (Arena arena = Arena.ofShared(); PegaEngine w = EngineClient.connect("127.0.0.1:" + port, p -> new HostTransferEngine(p, 1), 5000)) {
        String inst = "cwp";
        BlockHashes h = BeginQueryProbe.storedPrefix(w, arena, inst, blocks); // bench/probe/BeginQueryProbe.java, beside
        double[] q0 = serverQuery(port + 1000);
        long[] t = new long[30];
        int prompts = Integer.getInteger("prompts", 0);
        if (prompts > 0) { // as the TTFT benchmark goes: a batch of new prompts saved, then each looked up and loaded
          Random rnd = new Random(11);
          long[] ids = new long[blocks];
          Arrays.setAll(ids, i -> i);
          for (int i = 0; i < t.length; ) {
            BlockHashes[] batch = new BlockHashes[prompts];
            for (int k = 0; k < prompts; k++) {
              byte[] packed = new byte[blocks * 32];
              rnd.nextBytes(packed);
              batch[k] = new BlockHashes(packed, 32);
              w.save(inst, 0, ids, batch[k]).join();
            }
            for (int k = 0; k < prompts && i < t.length; k++, i++) {
              Thread.sleep(600);
              long t0 = System.nanoTime();
              QueryResult q = w.queryAndBegin(inst, batch[k], 0);
              t[i] = System.nanoTime() - t0;
              if (q.hitBlocks() != blocks || q.begun() == null) throw new IllegalStateException("hit " + q.hitBlocks());
              w.load(inst, 0, q.lease(), ids).join();
            }
          }
        } else for (int i = 0; i < t.length; i++) {
          Thread.sleep(600);
          long t0 = System.nanoTime();
          QueryResult q = w.queryAndBegin(inst, h, 0);
          t[i] = System.nanoTime() - t0;
          if (q.hitBlocks() != blocks || q.begun() == null) throw new IllegalStateException("hit " + q.hitBlocks());
          w.release(inst, q.lease());
        }
        long[] first = Arrays.copyOfRange(t, 0, 10), rest = Arrays.copyOfRange(t, 10, 30);
        Arrays.sort(first); Arrays.sort(rest);
        System.out.printf(Locale.ROOT, "{\"warm_up\": \"%s\", \"warm_up_ms\": %.0f, \"calls_1_10_p50_us\": %.1f, \"calls_11_30_p50_us\": %.1f, \"server_query_phases_us\": %s, \"calls_us\": %s}%n",
            arm, warmUpNanos / 1e6, first[5] / 1e3, rest[10] / 1e3, serverQueryUs(port + 1000, q0), Arrays.toString(Arrays.stream(t).map(x -> x / 1000).toArray()));
        int hammer = Integer.getInteger("hammer", 0);
        if (hammer > 0 && prompts > 0) { // the prompts' saves may have evicted the prefix the back-to-back calls ask for
          System.out.println("{\"after_back_to_back\": null, \"why\": \"-Dhammer goes without -Dprompts\"}");
        } else if (hammer > 0) { // then both halves as warm as back-to-back calls make them, and spaced again
          for (int i = 0; i < hammer; i++) w.release(inst, w.queryAndBegin(inst, h, 0).lease());
          double[] q1 = serverQuery(port + 1000);
          for (int i = 0; i < t.length; i++) {
            Thread.sleep(600);
            long t0 = System.nanoTime();
            QueryResult q = w.queryAndBegin(inst, h, 0);
            t[i] = System.nanoTime() - t0;
            w.release(inst, q.lease());
          }
          long[] s = t.clone(); Arrays.sort(s);
          System.out.printf(Locale.ROOT, "{\"after_back_to_back\": %d, \"calls_p50_us\": %.1f, \"server_query_phases_us\": %s, \"calls_us\": %s}%n",
              hammer, s[15] / 1e3, serverQueryUs(port + 1000, q1), Arrays.toString(Arrays.stream(t).map(x -> x / 1000).toArray()));
        }
      }
    } finally {
      server.destroy();
      server.waitFor();
      String keep = System.getProperty("serverLog");
      if (keep != null) Files.copy(dir.resolve("server.log"), Path.of(keep), StandardCopyOption.REPLACE_EXISTING);
      try (var s = Files.walk(dir)) { s.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete()); }
    }
  }

  /** The server's Query calls so far: {count, seconds} (its /metrics, pegaflow_rpc_duration_seconds). */
  static double[] serverQuery(int httpPort) throws Exception {
    // curl, not java.net.http: the HTTP client's classes would change this JVM's compiled code (a heap
    // buffer subclass it links deoptimizes the client's own socket reads)
    String body = "";
    try {
      Process curl = new ProcessBuilder("curl", "-s", "http://127.0.0.1:" + httpPort + "/metrics").start();
      body = new String(curl.getInputStream().readAllBytes());
      curl.waitFor();
    } catch (java.io.IOException noCurl) {
      // no curl on this host: the server's side is not read (NaN)
    }
    double[] r = new double[5];
    String[] phases = {"pegaflow_query_lookup_seconds_total", "pegaflow_query_lease_seconds_total", "pegaflow_query_plan_seconds_total"};
    for (String line : body.split("\n")) {
      for (int i = 0; i < phases.length; i++) {
        if (line.startsWith(phases[i] + " ")) r[2 + i] = Double.parseDouble(line.substring(line.lastIndexOf(' ') + 1));
      }
      if (!line.startsWith("pegaflow_rpc_duration_seconds_") || !line.contains("method=\"Query\"")) continue;
      double v = Double.parseDouble(line.substring(line.lastIndexOf(' ') + 1));
      if (line.startsWith("pegaflow_rpc_duration_seconds_count")) r[0] += v;
      else if (line.startsWith("pegaflow_rpc_duration_seconds_sum")) r[1] += v;
    }
    return r;
  }

  /** The server's mean time per Query since {@code before}, µs, and its store's lookup, lease and plan phases. */
  static String serverQueryUs(int httpPort, double[] before) throws Exception {
    double[] now = serverQuery(httpPort);
    double n = now[0] - before[0];
    StringBuilder b = new StringBuilder();
    for (int i = 1; i < now.length; i++) b.append(b.length() == 0 ? "" : ", ").append(String.format(Locale.ROOT, "%.1f", n == 0 ? Double.NaN : (now[i] - before[i]) / n * 1e6));
    return "[" + b + "]";
  }
}
