package io.pegaflow.bench;

import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.EngineStats;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.PoolExhaustedException;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.Sizes;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.metrics.Gauge;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Random;
import java.util.Set;
import java.util.concurrent.Callable;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

/**
 * The main job: multi-turn conversations sharing system prompts, run through the engine the
 * way vLLM drives a KV connector, with real bytes in a vLLM-shaped KV region.
 *
 * <p>Per request: hash the prompt's full blocks (chained SHA-256 over token ids, like vLLM's
 * prefix-cache hashes), query the longest cached prefix (leaving at least the last prompt
 * token to compute, as vLLM does), load the hit blocks into freshly allocated, scattered
 * "GPU" block ids and check their bytes, "compute" the rest by writing content derived from
 * each block's hash, and save every new full block of prompt and reply. A perfect cache
 * replayed over the same trace gives {@code ideal_hit_rate}.
 */
@Command(name = "workload", mixinStandardHelpOptions = true,
        description = "Multi-turn conversation workload through the embedded engine; writes the run report.")
final class WorkloadCommand implements Callable<Integer> {
    enum Verify { none, sample, full }

    @Option(names = "--pool", defaultValue = "2gb", description = "host pool size (default ${DEFAULT-VALUE}: small enough to evict)")
    String pool;

    @Option(names = "--conversations", defaultValue = "64")
    int conversations;

    @Option(names = "--turns", defaultValue = "6")
    int turns;

    @Option(names = "--system-prompts", defaultValue = "8", description = "distinct shared system prompts")
    int systemPrompts;

    @Option(names = "--prefix-tokens", defaultValue = "1024-2048", description = "system prompt length range")
    String prefixTokens;

    @Option(names = "--turn-tokens", defaultValue = "200-800", description = "user turn length range")
    String turnTokens;

    @Option(names = "--reply-tokens", defaultValue = "50-300", description = "assistant reply length range")
    String replyTokens;

    @Option(names = "--concurrency", defaultValue = "8", description = "conversations active at once (interleaved)")
    int concurrency;

    @Option(names = "--layers", defaultValue = "32")
    int layers;

    @Option(names = "--kv-heads", defaultValue = "8")
    int kvHeads;

    @Option(names = "--head-dim", defaultValue = "128")
    int headDim;

    @Option(names = "--dtype-bytes", defaultValue = "2")
    int dtypeBytes;

    @Option(names = "--block-tokens", defaultValue = "16")
    int blockTokens;

    @Option(names = "--copy-threads", defaultValue = "2")
    int copyThreads;

    @Option(names = "--prefault", defaultValue = "true", negatable = true,
            description = "commit pool pages before the run, as pinning does on a GPU host (default ${DEFAULT-VALUE})")
    boolean prefault;

    @Option(names = "--verify", defaultValue = "sample", description = "check loaded bytes: ${COMPLETION-CANDIDATES}")
    Verify verify;

    @Option(names = "--seed", defaultValue = "1")
    long seed;

    @Option(names = "--json", defaultValue = "out/run-report.json", description = "report path")
    Path json;

    private long segmentBytes;
    private int gpuBlocks;
    private LayerRegion[] regions;
    private long verifiedBlocks;
    private long verifyFailures;

    @Override
    public Integer call() throws Exception {
        int[] prefix = range("--prefix-tokens", prefixTokens);
        int[] turn = range("--turn-tokens", turnTokens);
        int[] reply = range("--reply-tokens", replyTokens);
        if (conversations < 1 || turns < 1 || systemPrompts < 1 || concurrency < 1 || layers < 1 || blockTokens < 1) {
            throw new IllegalArgumentException("--conversations, --turns, --system-prompts, --concurrency, --layers and"
                    + " --block-tokens must be >= 1");
        }
        segmentBytes = (long) blockTokens * kvHeads * headDim * dtypeBytes;
        long blockBytes = layers * 2L * segmentBytes;

        Random rnd = new Random(seed);
        List<Conversation> convs = new ArrayList<>();
        int[][] system = new int[systemPrompts][];
        for (int s = 0; s < systemPrompts; s++) {
            system[s] = tokens(rnd, between(rnd, prefix));
        }
        int maxTokens = 0;
        for (int c = 0; c < conversations; c++) {
            Conversation conv = new Conversation(system[rnd.nextInt(systemPrompts)]);
            for (int t = 0; t < turns; t++) {
                conv.userTurns.add(tokens(rnd, between(rnd, turn)));
                conv.replies.add(tokens(rnd, between(rnd, reply)));
            }
            maxTokens = Math.max(maxTokens, conv.totalTokens());
            convs.add(conv);
        }
        gpuBlocks = (maxTokens + blockTokens - 1) / blockTokens + 1;

        EngineConfig config = EngineConfig.builder().poolSize(pool).copyThreads(copyThreads).prefault(prefault).build();
        long wallStart = System.nanoTime();
        List<Long> queryNanos = new ArrayList<>();
        long queryable = 0;
        long hit = 0;
        long ideal = 0;
        long promptTokens = 0;
        long refusedSaves = 0;
        int requests = 0;
        EngineStats stats;
        String transferName;
        double prefaultSeconds;
        try (Arena arena = Arena.ofShared(); PegaEngine engine = PegaEngine.create(config)) {
            transferName = engine.transferName();
            prefaultSeconds = engine.prefaultNanos() / 1e9;
            registerGpu(engine, arena);
            Set<Key> idealCache = new HashSet<>();
            List<Integer> free = new ArrayList<>();
            for (int b = 0; b < gpuBlocks; b++) {
                free.add(b);
            }
            List<Conversation> active = new ArrayList<>();
            int next = 0;
            while (next < convs.size() || !active.isEmpty()) {
                while (active.size() < concurrency && next < convs.size()) {
                    active.add(convs.get(next++));
                }
                Conversation conv = active.get(rnd.nextInt(active.size()));
                int promptLen = conv.appendUserTurn();
                int totalLen = conv.appendReply();
                List<byte[]> hashes = conv.hashes(blockTokens);
                int q = (promptLen - 1) / blockTokens;
                int full = totalLen / blockTokens;

                int idealHit = 0;
                while (idealHit < q && idealCache.contains(new Key(hashes.get(idealHit)))) {
                    idealHit++;
                }
                byte[][] queryHashes = hashes.subList(0, q).toArray(new byte[0][]);
                long t0 = System.nanoTime();
                QueryResult result = engine.query("workload", queryHashes);
                queryNanos.add(System.nanoTime() - t0);

                Collections.shuffle(free, rnd); // vLLM hands out scattered block ids
                int need = (totalLen + blockTokens - 1) / blockTokens;
                long[] ids = new long[need];
                for (int i = 0; i < need; i++) {
                    ids[i] = free.get(i);
                }
                int h = result.hitBlocks();
                if (h > 0) {
                    engine.load("workload", 0, result.lease(), Arrays.copyOf(ids, h)).join();
                    for (int i = 0; i < h; i++) {
                        check(ids[i], hashes.get(i));
                    }
                }
                for (int i = h; i < full; i++) {
                    fill(ids[i], hashes.get(i));
                }
                if (full > h) {
                    byte[][] saveHashes = hashes.subList(h, full).toArray(new byte[0][]);
                    try {
                        engine.save("workload", 0, Arrays.copyOfRange(ids, h, full), saveHashes).join();
                    } catch (PoolExhaustedException e) {
                        refusedSaves++;
                    }
                }
                for (int i = 0; i < full; i++) {
                    idealCache.add(new Key(hashes.get(i)));
                }
                requests++;
                queryable += q;
                hit += h;
                ideal += idealHit;
                promptTokens += promptLen;
                if (conv.done()) {
                    active.remove(conv);
                }
            }
            engine.verifyInvariants();
            stats = engine.stats();
        }
        double wall = (System.nanoTime() - wallStart) / 1e9;

        long[] sorted = queryNanos.stream().mapToLong(Long::longValue).sorted().toArray();
        Map<String, Object> report = new LinkedHashMap<>();
        report.put("mode", "embedded");
        report.put("transfer", transferName);
        report.put("hit_rate", ratio(hit, queryable));
        report.put("ideal_hit_rate", ratio(ideal, queryable));
        report.put("blocks_saved", stats.get(Counter.SAVE_BLOCKS));
        report.put("blocks_loaded", stats.get(Counter.LOAD_BLOCKS));
        report.put("evictions", stats.get(Counter.EVICTIONS));
        report.put("load_gbps", gbps(stats.get(Counter.LOAD_BYTES), stats.get(Counter.LOAD_NANOS)));
        report.put("save_gbps", gbps(stats.get(Counter.SAVE_BYTES), stats.get(Counter.SAVE_NANOS)));
        report.put("query_p50_us", percentile(sorted, 0.50) / 1e3);
        report.put("query_p99_us", percentile(sorted, 0.99) / 1e3);
        report.put("requests", requests);
        report.put("prompt_tokens", promptTokens);
        report.put("queryable_blocks", queryable);
        report.put("hit_blocks", hit);
        report.put("ideal_hit_blocks", ideal);
        report.put("save_skipped_blocks", stats.get(Counter.SAVE_SKIPPED_BLOCKS));
        report.put("saves_refused_pool_exhausted", refusedSaves);
        report.put("load_bytes", stats.get(Counter.LOAD_BYTES));
        report.put("save_bytes", stats.get(Counter.SAVE_BYTES));
        report.put("pool_bytes", stats.get(Gauge.POOL_CAPACITY_BYTES));
        report.put("pool_used_bytes_at_end", stats.get(Gauge.POOL_USED_BYTES));
        report.put("block_bytes", blockBytes);
        report.put("gpu_blocks", gpuBlocks);
        report.put("verify", verify.name());
        report.put("verified_blocks", verifiedBlocks);
        report.put("verify_failures", verifyFailures);
        report.put("pool_prefault_seconds", prefaultSeconds);
        report.put("wall_seconds", wall);
        Map<String, Object> workload = new LinkedHashMap<>();
        workload.put("conversations", conversations);
        workload.put("turns", turns);
        workload.put("system_prompts", systemPrompts);
        workload.put("prefix_tokens", prefixTokens);
        workload.put("turn_tokens", turnTokens);
        workload.put("reply_tokens", replyTokens);
        workload.put("concurrency", concurrency);
        workload.put("geometry", layers + " layers x " + kvHeads + " kv heads x " + headDim + " x " + dtypeBytes
                + " B, " + blockTokens + "-token blocks");
        workload.put("seed", seed);
        report.put("workload", workload);
        Json.writeFile(json, report);

        System.out.printf(Locale.ROOT, "PegaFlow-JVM workload (%s mode, %s copies): %d requests from %d conversations x %d turns, pool %s%n",
                "embedded", transferName, requests, conversations, turns, Sizes.format(stats.get(Gauge.POOL_CAPACITY_BYTES)));
        System.out.printf(Locale.ROOT, "  hit rate %.1f%% of queryable blocks (ideal %.1f%%), %d evictions, %d refused saves%n",
                100 * ratio(hit, queryable), 100 * ratio(ideal, queryable), stats.get(Counter.EVICTIONS), refusedSaves);
        System.out.printf(Locale.ROOT, "  saved %d blocks (%s) at %.1f GB/s, loaded %d blocks (%s) at %.1f GB/s%n",
                stats.get(Counter.SAVE_BLOCKS), Sizes.format(stats.get(Counter.SAVE_BYTES)), gbps(stats.get(Counter.SAVE_BYTES), stats.get(Counter.SAVE_NANOS)),
                stats.get(Counter.LOAD_BLOCKS), Sizes.format(stats.get(Counter.LOAD_BYTES)), gbps(stats.get(Counter.LOAD_BYTES), stats.get(Counter.LOAD_NANOS)));
        System.out.printf(Locale.ROOT, "  query p50 %.1f us, p99 %.1f us; verified %d loaded blocks (%s), %d mismatches; %.1f s%n",
                percentile(sorted, 0.5) / 1e3, percentile(sorted, 0.99) / 1e3, verifiedBlocks, verify, verifyFailures, wall);
        System.out.println("  report: " + json);
        return verifyFailures == 0 ? 0 : 1;
    }

    /** vLLM's per-layer {@code [2, num_blocks, block_size, kv_heads, head_dim]} tensors, in host memory. */
    private void registerGpu(PegaEngine engine, Arena arena) {
        regions = new LayerRegion[layers];
        long layerBytes = 2L * gpuBlocks * segmentBytes;
        MemorySegment all = arena.allocate(layerBytes * layers, 4096);
        for (int l = 0; l < layers; l++) {
            regions[l] = new LayerRegion("model.layers." + l + ".self_attn.attn", KvLayout.SPLIT_KV,
                    all.address() + l * layerBytes, layerBytes, gpuBlocks, segmentBytes, segmentBytes, gpuBlocks * segmentBytes);
        }
        String namespace = "sim-" + layers + "x" + kvHeads + "x" + headDim + "x" + dtypeBytes + "-b" + blockTokens;
        engine.registerInstance(new InstanceSpec("workload", namespace, 1, 1));
        engine.registerWorker("workload", new WorkerSpec(0, 0, 0, List.of(regions)));
    }

    private static final MemorySegment EVERYTHING = MemorySegment.NULL.reinterpret(Long.MAX_VALUE);

    /** "Computes" a block: every K and V piece gets content derived from (hash, layer, segment). */
    private void fill(long blockId, byte[] hash) {
        long h = seedOf(hash);
        for (int l = 0; l < layers; l++) {
            for (int s = 0; s < 2; s++) {
                long addr = regions[l].pieceAddress(blockId, s);
                long tag = mix(h + l * 2L + s);
                MemorySegment piece = EVERYTHING.asSlice(addr, segmentBytes);
                piece.fill((byte) tag);
                piece.set(ValueLayout.JAVA_LONG_UNALIGNED, 0, tag);
                piece.set(ValueLayout.JAVA_LONG_UNALIGNED, segmentBytes - 8, ~tag);
            }
        }
    }

    private void check(long blockId, byte[] hash) {
        if (verify == Verify.none) {
            return;
        }
        long h = seedOf(hash);
        boolean ok = true;
        for (int l = 0; l < layers && ok; l++) {
            for (int s = 0; s < 2 && ok; s++) {
                long tag = mix(h + l * 2L + s);
                MemorySegment piece = EVERYTHING.asSlice(regions[l].pieceAddress(blockId, s), segmentBytes);
                ok = piece.get(ValueLayout.JAVA_LONG_UNALIGNED, 0) == tag
                        && piece.get(ValueLayout.JAVA_LONG_UNALIGNED, segmentBytes - 8) == ~tag
                        && piece.get(ValueLayout.JAVA_BYTE, segmentBytes / 2) == (byte) tag;
                if (ok && verify == Verify.full) {
                    byte b = (byte) tag;
                    for (long off = 8; off < segmentBytes - 8 && ok; off++) {
                        ok = piece.get(ValueLayout.JAVA_BYTE, off) == b;
                    }
                }
            }
        }
        verifiedBlocks++;
        if (!ok) {
            verifyFailures++;
        }
    }

    private static long seedOf(byte[] hash) {
        return ByteBuffer.wrap(hash).order(ByteOrder.LITTLE_ENDIAN).getLong();
    }

    private static long mix(long z) {
        z = (z ^ (z >>> 30)) * 0xbf58476d1ce4e5b9L;
        z = (z ^ (z >>> 27)) * 0x94d049bb133111ebL;
        return z ^ (z >>> 31);
    }

    /** A conversation's token history and the chained block hashes of its full blocks. */
    private static final class Conversation {
        final int[] systemPrompt;
        final List<int[]> userTurns = new ArrayList<>();
        final List<int[]> replies = new ArrayList<>();
        int[] tokens;
        int length;
        int turn;
        final List<byte[]> hashes = new ArrayList<>();

        Conversation(int[] systemPrompt) {
            this.systemPrompt = systemPrompt;
            this.tokens = systemPrompt.clone();
            this.length = systemPrompt.length;
        }

        int totalTokens() {
            int n = systemPrompt.length;
            for (int t = 0; t < userTurns.size(); t++) {
                n += userTurns.get(t).length + replies.get(t).length;
            }
            return n;
        }

        int appendUserTurn() {
            return append(userTurns.get(turn));
        }

        int appendReply() {
            int n = append(replies.get(turn));
            turn++;
            return n;
        }

        boolean done() {
            return turn == userTurns.size();
        }

        private int append(int[] more) {
            if (length + more.length > tokens.length) {
                tokens = Arrays.copyOf(tokens, Math.max(tokens.length * 2, length + more.length));
            }
            System.arraycopy(more, 0, tokens, length, more.length);
            length += more.length;
            return length;
        }

        /** Hashes of every full block so far: SHA-256(parent hash || token ids), like vLLM. */
        List<byte[]> hashes(int blockTokens) {
            MessageDigest sha = sha256();
            ByteBuffer buf = ByteBuffer.allocate(blockTokens * 4).order(ByteOrder.LITTLE_ENDIAN);
            for (int b = hashes.size(); (b + 1) * blockTokens <= length; b++) {
                byte[] parent = b == 0 ? ROOT : hashes.get(b - 1);
                buf.clear();
                for (int i = 0; i < blockTokens; i++) {
                    buf.putInt(tokens[b * blockTokens + i]);
                }
                sha.update(parent);
                sha.update(buf.array());
                hashes.add(sha.digest());
            }
            return hashes;
        }
    }

    private static final byte[] ROOT = new byte[32];

    private static MessageDigest sha256() {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    private record Key(byte[] hash) {
        @Override
        public boolean equals(Object o) {
            return o instanceof Key k && Arrays.equals(k.hash, hash);
        }

        @Override
        public int hashCode() {
            return Arrays.hashCode(hash);
        }
    }

    private static int[] tokens(Random rnd, int n) {
        int[] t = new int[n];
        for (int i = 0; i < n; i++) {
            t[i] = rnd.nextInt(128_000);
        }
        return t;
    }

    private static int between(Random rnd, int[] range) {
        return range[0] + rnd.nextInt(range[1] - range[0] + 1);
    }

    private static int[] range(String option, String text) {
        String[] parts = text.split("-");
        try {
            int lo = Integer.parseInt(parts[0].trim());
            int hi = parts.length == 1 ? lo : Integer.parseInt(parts[1].trim());
            if (parts.length > 2 || lo < 1 || hi < lo) {
                throw new NumberFormatException();
            }
            return new int[] {lo, hi};
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(option + " '" + text + "' is not a range; expected MIN-MAX with 1 <= MIN <= MAX, e.g. 200-800");
        }
    }

    private static double ratio(long a, long b) {
        return b == 0 ? 0 : (double) a / b;
    }

    private static double gbps(long bytes, long nanos) {
        return nanos == 0 ? 0 : bytes / (double) nanos;
    }

    private static double percentile(long[] sorted, double p) {
        if (sorted.length == 0) {
            return 0;
        }
        return sorted[Math.min(sorted.length - 1, (int) Math.ceil(p * sorted.length) - 1)];
    }
}
