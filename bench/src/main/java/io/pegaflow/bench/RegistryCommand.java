package io.pegaflow.bench;

import io.lettuce.core.RedisClient;
import io.lettuce.core.api.StatefulRedisConnection;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.server.cluster.BlockRegistry;
import io.pegaflow.server.cluster.RedisBlockRegistry;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import java.util.concurrent.Callable;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

/**
 * {@code pegaflow-bench registry}: the cost of the Redis registry (docs/cluster.md): advertise
 * rate of one host, Redis memory per advertised block (one owner), and the lookup of a
 * 2,048-hash prefix held by another live host, through {@link RedisBlockRegistry} itself.
 */
@Command(name = "registry", mixinStandardHelpOptions = true,
        description = "Redis registry cost: advertise rate, Redis bytes per block, prefix lookup latency (JSON)")
public final class RegistryCommand implements Callable<Integer> {
    @Option(names = "--redis", required = true, description = "redis://HOST:PORT of a Redis used by nothing else")
    String url;

    @Option(names = "--blocks", defaultValue = "1000000", description = "blocks advertised (default ${DEFAULT-VALUE})")
    int blocks;

    @Option(names = "--prefix", defaultValue = "2048", description = "hashes per lookup (default ${DEFAULT-VALUE})")
    int prefix;

    @Option(names = "--lookups", defaultValue = "200", description = "lookups timed (default ${DEFAULT-VALUE})")
    int lookups;

    @Option(names = "--json", defaultValue = "out/registry.json")
    Path json;

    @Override
    public Integer call() throws Exception {
        if (prefix < 1 || blocks < prefix) {
            throw new IllegalArgumentException("--blocks " + blocks + ", --prefix " + prefix
                    + "; expected 1 <= prefix <= blocks (a lookup asks for the first prefix of the advertised blocks)");
        }
        var settings = new RedisBlockRegistry.Settings(url, 256, Duration.ofMillis(200), Duration.ofSeconds(3), blocks + 1,
                Duration.ofSeconds(5), null);
        SplittableRandom rnd = new SplittableRandom(42);
        byte[][] hashes = new byte[blocks][32];
        for (byte[] h : hashes) {
            rnd.nextBytes(h);
        }
        long before = usedMemory();
        Map<String, Object> report = new LinkedHashMap<>();
        try (RedisBlockRegistry owner = new RedisBlockRegistry(settings, "10.0.0.1:1", each -> {});
                RedisBlockRegistry asker = new RedisBlockRegistry(settings, "10.0.0.2:1", each -> {})) {
            waitFor(() -> owner.connected() && asker.liveNodes().size() == 1, "both hosts registered");
            owner.flush();
            long memBefore = usedMemory();
            long t0 = System.nanoTime();
            for (byte[] h : hashes) {
                owner.advertise("bench-ns", h);
            }
            owner.flush();
            double seconds = (System.nanoTime() - t0) / 1e9;
            BlockRegistry.RegistryStats st = owner.stats();
            if (st.dropped() != 0 || st.advertised() != blocks) {
                throw new IllegalStateException("advertised " + st.advertised() + " of " + blocks + ", dropped " + st.dropped());
            }
            long memAfter = usedMemory();
            report.put("blocks", blocks);
            report.put("advertise_blocks_per_s", Math.round(blocks / seconds));
            report.put("redis_bytes_per_block", Math.round((memAfter - memBefore) / (double) blocks * 10) / 10.0);
            byte[] packed = new byte[prefix * 32];
            for (int i = 0; i < prefix; i++) {
                System.arraycopy(hashes[i], 0, packed, i * 32, 32);
            }
            BlockHashes p = new BlockHashes(packed, 32);
            List<Double> us = new ArrayList<>();
            for (int i = 0; i < lookups + 20; i++) {
                long s = System.nanoTime();
                BlockRegistry.Owner o = asker.lookup("bench-ns", p, List.of());
                long e = System.nanoTime();
                if (o.blocks() != prefix) {
                    throw new IllegalStateException("lookup found " + o.blocks() + " of " + prefix);
                }
                if (i >= 20) {
                    us.add((e - s) / 1e3); // the first 20 warm the JIT and the connection
                }
            }
            us.sort(null);
            report.put("registry_lookup_" + prefix + "_us_p50", Math.round(us.get(us.size() / 2)));
            report.put("registry_lookup_" + prefix + "_us_p99", Math.round(us.get(Math.min(us.size() - 1, us.size() * 99 / 100))));
        }
        report.put("redis_used_memory_before", before);
        report.put("command", "pegaflow-bench registry --redis " + url + " --blocks " + blocks);
        System.out.println(Json.write(report));
        if (json.getParent() != null) {
            java.nio.file.Files.createDirectories(json.getParent());
        }
        Json.writeFile(json, report);
        return 0;
    }

    private long usedMemory() {
        RedisClient c = RedisClient.create(url);
        try (StatefulRedisConnection<String, String> conn = c.connect()) {
            for (String line : conn.sync().info("memory").split("\r?\n")) {
                if (line.startsWith("used_memory:")) {
                    return Long.parseLong(line.substring("used_memory:".length()).trim());
                }
            }
            throw new IllegalStateException("no used_memory in INFO memory");
        } finally {
            c.shutdown();
        }
    }

    private static void waitFor(java.util.function.BooleanSupplier ok, String what) throws InterruptedException {
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (!ok.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException(what + ": not within 10 s");
            }
            Thread.sleep(20);
        }
    }
}
