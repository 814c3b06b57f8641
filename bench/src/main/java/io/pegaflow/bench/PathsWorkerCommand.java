package io.pegaflow.bench;

import io.pegaflow.client.EngineClient;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.CopyResult;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.Token;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.cuda.CudaDevice;
import io.pegaflow.engine.cuda.CudaOptions;
import io.pegaflow.engine.cuda.CudaTransferEngine;
import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.HostTransferEngine;
import io.pegaflow.engine.transfer.TransferEngine;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.foreign.Arena;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.Locale;
import java.util.concurrent.Callable;
import java.util.function.Function;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

/**
 * One TP rank of {@code pegaflow-bench paths}' two-GPU case, in its own process as vLLM's
 * workers are: attaches to the server, registers its rank of an instance the parent created,
 * then follows commands on stdin, one per line, answering each on stdout:
 * {@code save SEED N} (its slots of N fresh blocks, hashes from SEED) and
 * {@code load LEASE_HEX SEED N} (its share of the lease into other blocks, checked against
 * what {@code save SEED} wrote), each answered {@code ok SECONDS VERIFIED}; {@code quit}.
 */
@Command(name = "paths-worker", hidden = true, mixinStandardHelpOptions = true,
        description = "A worker process of pegaflow-bench paths (driven over stdin).")
final class PathsWorkerCommand implements Callable<Integer> {
    @Option(names = "--endpoint", required = true)
    String endpoint;

    @Option(names = "--instance", required = true)
    String instance;

    @Option(names = "--rank", defaultValue = "0")
    int rank;

    @Option(names = "--copy", defaultValue = "cuda")
    String copy;

    @Option(names = "--device", defaultValue = "0")
    int device;

    @Option(names = "--layers", defaultValue = "32")
    int layers;

    @Option(names = "--piece-bytes", defaultValue = "32768")
    int pieceBytes;

    @Option(names = "--cache-blocks", defaultValue = "8192")
    int cacheBlocks;

    @Override
    public Integer call() throws Exception {
        boolean cuda = "cuda".equals(copy);
        Function<HostPool, TransferEngine> transfer = cuda
                ? p -> CudaTransferEngine.create(p, CudaOptions.defaults().withDevice(device))
                : p -> new HostTransferEngine(p, 2);
        CudaDevice dev = cuda ? CudaDevice.open(device) : null;
        try (Arena arena = Arena.ofShared(); PegaEngine engine = EngineClient.open(endpoint, transfer, 30_000,
                ServerProcess.joinSecret()).engine()) {
            Kv kv = Kv.allocate(dev, arena, layers, pieceBytes, cacheBlocks);
            engine.registerWorker(instance, new WorkerSpec(rank, rank, cuda ? device : -1, kv.regions()));
            Ids ids = new Ids(cacheBlocks, 100 + rank);
            java.util.Map<Long, long[]> saved = new java.util.HashMap<>();
            System.out.println("ready");
            System.out.flush();
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while (true) {
                line = in.readLine();
                if (line == null) {
                    System.err.println("paths-worker " + rank + ": stdin closed; exiting");
                    break;
                }
                String[] w = line.trim().split(" ");
                switch (w[0]) {
                    case "save" -> {
                        long seed = Long.parseLong(w[1]);
                        int n = Integer.parseInt(w[2]);
                        long[] src = ids.take(n);
                        BlockHashes h = Ids.hashes(n, seed);
                        kv.fill(src, (int) seed);
                        long t0 = System.nanoTime();
                        CopyResult r = engine.save(instance, rank, src, h).join();
                        double seconds = (System.nanoTime() - t0) / 1e9;
                        engine.flush(10_000); // the parent queries through another client: the barrier first
                        answer(seconds, r.blocks() == n);
                        saved.put(seed, src);
                    }
                    case "load" -> {
                        Token lease = Token.fromBytes(HexFormat.of().parseHex(w[1]));
                        long seed = Long.parseLong(w[2]);
                        int n = Integer.parseInt(w[3]);
                        long[] dst = ids.take(n);
                        kv.clear(dst);
                        long t0 = System.nanoTime();
                        engine.load(instance, rank, lease, dst).join();
                        answer((System.nanoTime() - t0) / 1e9, saved.containsKey(seed) && kv.check(dst, (int) seed));
                    }
                    case "quit" -> {
                        kv.free();
                        return 0;
                    }
                    default -> throw new IllegalArgumentException("paths-worker command '" + line + "'; expected save, load or quit");
                }
            }
            kv.free();
            return 0;
        } finally {
            if (dev != null) {
                dev.close();
            }
        }
    }

    private static void answer(double seconds, boolean ok) {
        System.out.println(String.format(Locale.ROOT, "ok %.6f %b", seconds, ok));
        System.out.flush();
    }
}
