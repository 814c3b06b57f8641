package io.pegaflow.bench;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.transfer.HostTransferEngine;
import io.pegaflow.client.EngineClient;
import io.pegaflow.server.PegaflowServer;
import io.pegaflow.client.RemoteStore;
import java.lang.foreign.Arena;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

/**
 * Query + lease of a resident prefix, from 1 and from N concurrent clients (each its own
 * channel, as each vLLM instance has), through the client's default path (the server's local
 * Unix socket for co-located clients) and, side by side in the same run, gRPC over loopback
 * TCP alone. The lease is released after each timed call, untimed. Starts its own server
 * unless {@code --endpoint} names one.
 */
@Command(name = "rpc", mixinStandardHelpOptions = true,
        description = "Query+lease latency against pegaflow-server over loopback, 1 and N clients.")
final class RpcCommand implements Callable<Integer> {
    @Option(names = "--endpoint", description = "HOST:PORT of a running server (default: start one in this JVM)")
    String endpoint;

    @Option(names = "--hashes", defaultValue = "2048")
    int hashes;

    @Option(names = "--calls", defaultValue = "3000", description = "timed calls per client count")
    int calls;

    @Option(names = "--clients", defaultValue = "8", description = "the concurrent-client case")
    int clients;

    @Option(names = "--json", defaultValue = "out/rpc.json")
    Path json;

    @Override
    public Integer call() throws Exception {
        PegaflowServer own = null;
        String target = endpoint;
        Path dir = null;
        if (target == null) {
            dir = Files.createTempDirectory("pegaflow-rpc");
            own = PegaflowServer.start(new PegaflowServer.Config("127.0.0.1:0", null, 64L << 20, dir.resolve("pool"),
                    Duration.ofSeconds(600), Duration.ofSeconds(2), true));
            target = "127.0.0.1:" + own.port();
        }
        Map<String, Object> report = new LinkedHashMap<>();
        try (Arena arena = Arena.ofShared();
                PegaEngine worker = EngineClient.connect(target, p -> new HostTransferEngine(p, 1), 5000)) {
            long seg = 512;
            long base = arena.allocate(hashes * seg, 4096).address();
            String instance = "rpc-bench-" + ProcessHandle.current().pid();
            worker.registerInstance(new InstanceSpec(instance, "rpc-bench", 1, 1));
            worker.registerWorker(instance, new WorkerSpec(0, 0, 0,
                    List.of(new LayerRegion("l", KvLayout.MLA, base, hashes * seg, hashes, seg, seg, 0))));
            byte[] packed = new byte[hashes * 32];
            new Random(5).nextBytes(packed);
            BlockHashes h = new BlockHashes(packed, 32);
            long[] ids = new long[hashes];
            for (int i = 0; i < hashes; i++) {
                ids[i] = i;
            }
            worker.save(instance, 0, ids, h).join();
            List<Map<String, Object>> runs = new ArrayList<>();
            List<Map<String, Object>> grpcRuns = new ArrayList<>();
            for (int n : new int[] {1, clients}) {
                runs.add(run(target, instance, h, n, true));
                grpcRuns.add(run(target, instance, h, n, false));
            }
            report.put("query_p50_us", runs.get(0).get("p50_us"));
            report.put("query_p99_us", runs.get(0).get("p99_us"));
            report.put("transport", "local Unix socket (the default for clients on the server's host)");
            report.put("clients", runs);
            report.put("grpc_tcp_query_p50_us", grpcRuns.get(0).get("p50_us"));
            report.put("grpc_tcp_query_p99_us", grpcRuns.get(0).get("p99_us"));
            report.put("grpc_tcp_clients", grpcRuns);
            report.put("hashes", hashes);
            report.put("endpoint", endpoint == null ? "own server in this JVM, loopback TCP" : endpoint);
            report.put("cpus", Runtime.getRuntime().availableProcessors());
            worker.unregisterInstance(instance);
        } finally {
            if (own != null) {
                own.close();
            }
        }
        Json.writeFile(json, report);
        for (String key : new String[] {"clients", "grpc_tcp_clients"}) {
            for (Object o : (List<?>) report.get(key)) {
                Map<?, ?> r = (Map<?, ?>) o;
                System.out.printf(Locale.ROOT,
                        "rpc query+lease of %d hashes, %s, %s client(s): p50 %.0f us, p99 %.0f us, %.0f calls/s%n", hashes,
                        key.equals("clients") ? "local socket" : "gRPC over TCP", r.get("clients"), r.get("p50_us"),
                        r.get("p99_us"), r.get("calls_per_second"));
            }
        }
        System.out.println("  report: " + json);
        return 0;
    }

    private Map<String, Object> run(String target, String instance, BlockHashes h, int n, boolean localSocket)
            throws Exception {
        List<RemoteStore> stores = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            stores.add(RemoteStore.connect(target, 5000, localSocket));
        }
        int perClient = Math.max(100, calls / n);
        long[][] samples = new long[n][perClient];
        CountDownLatch ready = new CountDownLatch(n);
        CountDownLatch go = new CountDownLatch(1);
        List<Thread> threads = new ArrayList<>();
        for (int c = 0; c < n; c++) {
            int me = c;
            RemoteStore s = stores.get(c);
            threads.add(Thread.ofPlatform().start(() -> {
                for (int w = 0; w < 500; w++) { // warm-up: JIT, channel, HTTP/2 windows
                    s.release(instance, s.query(instance, h).lease());
                }
                ready.countDown();
                try {
                    go.await();
                } catch (InterruptedException e) {
                    return;
                }
                for (int i = 0; i < perClient; i++) {
                    long t0 = System.nanoTime();
                    QueryResult q = s.query(instance, h);
                    samples[me][i] = System.nanoTime() - t0;
                    s.release(instance, q.lease());
                }
            }));
        }
        ready.await();
        long start = System.nanoTime();
        go.countDown();
        for (Thread t : threads) {
            t.join();
        }
        double seconds = (System.nanoTime() - start) / 1e9;
        stores.forEach(RemoteStore::close);
        long[] all = Arrays.stream(samples).flatMapToLong(Arrays::stream).sorted().toArray();
        Map<String, Object> r = new LinkedHashMap<>();
        r.put("clients", n);
        r.put("transport", localSocket ? "local socket" : "gRPC over TCP");
        r.put("calls", all.length);
        r.put("p50_us", all[all.length / 2] / 1e3);
        r.put("p99_us", all[Math.min(all.length - 1, (int) (all.length * 0.99))] / 1e3);
        r.put("calls_per_second", all.length / seconds);
        return r;
    }
}
