package io.pegaflow.bench;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.Callable;
import org.openjdk.jmh.results.RunResult;
import org.openjdk.jmh.results.format.ResultFormatType;
import org.openjdk.jmh.runner.Runner;
import org.openjdk.jmh.runner.options.ChainedOptionsBuilder;
import org.openjdk.jmh.runner.options.OptionsBuilder;
import org.openjdk.jmh.runner.options.TimeValue;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

/**
 * Runs the engine's JMH micro-benchmarks in one JVM fork each and writes a summary with the
 * ratios the targets are stated in, next to JMH's own JSON.
 */
@Command(name = "jmh", mixinStandardHelpOptions = true,
        description = "JMH: query+lease (and release) of a 32K-block prefix; scattered 32 KiB host copies vs one bulk copy.")
final class JmhCommand implements Callable<Integer> {
    @Option(names = "--json", defaultValue = "out/jmh-engine.json", description = "summary path (JMH's raw JSON goes next to it)")
    Path json;

    @Option(names = "--quick", description = "1 warm-up and 2 measured iterations (smoke runs)")
    boolean quick;

    @Option(names = "--include", defaultValue = "io\\.pegaflow\\.bench\\.jmh\\..*",
            description = "which benchmarks run (a regular expression over their names; default: all)")
    String include;

    @Override
    public Integer call() throws Exception {
        Path raw = json.resolveSibling(json.getFileName().toString().replace(".json", "") + "-raw.json");
        if (raw.toAbsolutePath().getParent() != null) {
            Files.createDirectories(raw.toAbsolutePath().getParent());
        }
        ChainedOptionsBuilder opts = new OptionsBuilder()
                .include(include)
                .forks(1)
                .jvmArgsAppend("--enable-native-access=ALL-UNNAMED", "--sun-misc-unsafe-memory-access=allow", "-Xmx1g")
                .warmupIterations(quick ? 1 : 5)
                .warmupTime(TimeValue.seconds(1))
                .measurementIterations(quick ? 2 : 10)
                .measurementTime(TimeValue.seconds(1))
                .resultFormat(ResultFormatType.JSON)
                .result(raw.toString());
        Collection<RunResult> results = new Runner(opts.build()).run();
        Map<String, Double> ms = new LinkedHashMap<>();
        Map<String, Double> err = new LinkedHashMap<>();
        for (RunResult r : results) {
            String name = r.getParams().getBenchmark().replaceAll(".*\\.", "");
            String algorithm = r.getParams().getParam("algorithm"); // BlockHasherBenchmark's, one result each
            name = algorithm == null ? name : name + "_" + algorithm;
            ms.put(name, r.getPrimaryResult().getScore());
            err.put(name, r.getPrimaryResult().getScoreError());
        }
        Map<String, Object> summary = new LinkedHashMap<>();
        double q = ms.getOrDefault("queryLease", Double.NaN);
        summary.put("query_lease_32k_ms", q);
        summary.put("query_lease_32k_ms_error", err.getOrDefault("queryLease", Double.NaN));
        summary.put("release_32k_ms", ms.getOrDefault("releaseLease", Double.NaN));
        summary.put("release_32k_ms_error", err.getOrDefault("releaseLease", Double.NaN));
        double gib = 268435456 / 1e9;
        double scattered = gib / (ms.getOrDefault("scatteredPieces", Double.NaN) / 1e3);
        double bulk = gib / (ms.getOrDefault("bulkCopy", Double.NaN) / 1e3);
        summary.put("host_copy_scattered_32k_gbps", scattered);
        summary.put("host_copy_bulk_gbps", bulk);
        summary.put("scattered_over_bulk", scattered / bulk);
        // the engine's share of an in-step load's plan: 1,024 Llama blocks, 32 layers (LayeredPlanBenchmark)
        summary.put("layered_plan_1024_ms", ms.getOrDefault("queryThenLoadLayered", Double.NaN));
        summary.put("plain_load_plan_1024_ms", ms.getOrDefault("queryThenLoad", Double.NaN));
        summary.put("query_release_1024_ms", ms.getOrDefault("queryAndRelease", Double.NaN));
        // vLLM's hash chain over a 16K-token prompt in blocks of 16 (BlockHasherBenchmark): the store's
        // keys where vLLM's own hashes differ per process, computed at a request's first lookup
        for (String algorithm : new String[] {"sha256", "sha256_cbor", "xxhash"}) {
            summary.put("block_hashes_16k_" + algorithm + "_ms", ms.getOrDefault("chain_" + algorithm, Double.NaN));
        }
        summary.put("jmh_raw", raw.toString());
        summary.put("cpus", Runtime.getRuntime().availableProcessors());
        summary.put("java", System.getProperty("java.vm.version"));
        Json.writeFile(json, summary);
        System.out.printf(Locale.ROOT, "query+lease of a 32K-block prefix: %.3f ms (target <= 3 ms); release: %.3f ms%n",
                q, ms.getOrDefault("releaseLease", Double.NaN));
        System.out.printf(Locale.ROOT, "host copy: scattered 32 KiB pieces %.2f GB/s, bulk %.2f GB/s, ratio %.2f (target >= 0.80)%n",
                scattered, bulk, scattered / bulk);
        System.out.println("summary: " + json + ", raw: " + raw);
        return 0;
    }
}
