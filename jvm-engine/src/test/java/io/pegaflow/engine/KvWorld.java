package io.pegaflow.engine;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;

/**
 * Test fixture: one instance's "device" KV memory in host RAM, laid out the way vLLM lays
 * it out on GPUs, plus helpers to fill blocks with content derived from their hash and to
 * check bytes. Each worker (rank = ppStage * tp + tpRank) owns its own allocations.
 */
final class KvWorld implements AutoCloseable {
    /** The vLLM layouts the engine must handle, each described only through LayerRegion. */
    enum Kind {
        /** per-layer tensor [2, N, ...]: K of all blocks, then V of all blocks */
        SPLIT_KFIRST,
        /** per-layer tensor [N, 2, ...] described as two segments */
        SPLIT_BLOCKS_FIRST,
        /** per-layer tensor [N, 2, ...] described as one combined segment */
        COMBINED,
        /** per-layer latent [N, ...] */
        MLA,
        /** one tensor for every layer: [N, L, 2, ...] (cross-layer blocks) */
        CROSS_LAYER
    }

    final InstanceSpec spec;
    final Kind kind;
    final int tp;
    final int layers;
    final int numBlocks;
    final long segmentBytes;
    final List<WorkerSpec> workers = new ArrayList<>();
    private final DeviceMemory memory;

    KvWorld(String instanceId, String namespace, Kind kind, int tp, int pp, int layers, int numBlocks,
            long segmentBytes, long pad) {
        this(DeviceMemory.host(), instanceId, namespace, kind, tp, pp, layers, numBlocks, segmentBytes, pad);
    }

    /** A world whose tensors live in {@code memory}; the world closes it. */
    KvWorld(DeviceMemory memory, String instanceId, String namespace, Kind kind, int tp, int pp, int layers,
            int numBlocks, long segmentBytes, long pad) {
        this.memory = memory;
        if (layers % pp != 0) {
            throw new IllegalArgumentException("layers " + layers + " not divisible by pp " + pp);
        }
        this.spec = new InstanceSpec(instanceId, namespace, tp, tp * pp);
        this.kind = kind;
        this.tp = tp;
        this.layers = layers;
        this.numBlocks = numBlocks;
        this.segmentBytes = segmentBytes;
        int perStage = layers / pp;
        for (int stage = 0; stage < pp; stage++) {
            for (int t = 0; t < tp; t++) {
                List<LayerRegion> regions = new ArrayList<>();
                int first = stage * perStage;
                if (kind == Kind.CROSS_LAYER) {
                    long blockBytes = perStage * 2 * segmentBytes + pad;
                    long total = blockBytes * numBlocks;
                    long base = memory.allocate(total);
                    for (int l = 0; l < perStage; l++) {
                        regions.add(new LayerRegion(layerName(first + l), KvLayout.SPLIT_KV, base + l * 2 * segmentBytes,
                                total - l * 2 * segmentBytes, numBlocks, blockBytes, segmentBytes, segmentBytes));
                    }
                } else {
                    for (int l = 0; l < perStage; l++) {
                        regions.add(region(layerName(first + l), pad));
                    }
                }
                workers.add(new WorkerSpec(stage * tp + t, t, t, regions));
            }
        }
    }

    private LayerRegion region(String name, long pad) {
        long s = segmentBytes;
        int n = numBlocks;
        return switch (kind) {
            case SPLIT_KFIRST -> {
                long stride = s + pad;
                long total = 2 * stride * n;
                long base = memory.allocate(total);
                yield new LayerRegion(name, KvLayout.SPLIT_KV, base, total, n, stride, s, stride * n);
            }
            case SPLIT_BLOCKS_FIRST -> {
                long stride = 2 * s + pad;
                long total = stride * n;
                yield new LayerRegion(name, KvLayout.SPLIT_KV, memory.allocate(total), total, n, stride, s, s);
            }
            case COMBINED -> {
                long stride = 2 * s + pad;
                long total = stride * n;
                yield new LayerRegion(name, KvLayout.COMBINED, memory.allocate(total), total, n, stride, 2 * s, 0);
            }
            case MLA -> {
                long stride = s + pad;
                long total = stride * n;
                yield new LayerRegion(name, KvLayout.MLA, memory.allocate(total), total, n, stride, s, 0);
            }
            case CROSS_LAYER -> throw new IllegalStateException("handled by the constructor");
        };
    }

    static String layerName(int i) {
        return "model.layers." + i + ".self_attn.attn";
    }

    void register(PegaEngine engine) {
        engine.registerInstance(spec);
        for (WorkerSpec w : workers) {
            engine.registerWorker(spec.instanceId(), w);
        }
    }

    /** Fills every piece of {@code blockId} on every worker with random bytes. */
    void fillRandom(long blockId, Random rnd) {
        for (WorkerSpec w : workers) {
            for (LayerRegion r : w.layers()) {
                for (int s = 0; s < r.segments(); s++) {
                    byte[] b = new byte[(int) r.segmentBytes()];
                    rnd.nextBytes(b);
                    memory.write(r.pieceAddress(blockId, s), b);
                }
            }
        }
    }

    /** Writes content derived from (hash, worker, layer, segment) into {@code blockId}. */
    void fillPattern(long blockId, byte[] hash) {
        for (WorkerSpec w : workers) {
            fillPattern(w, blockId, hash);
        }
    }

    void fillPattern(WorkerSpec w, long blockId, byte[] hash) {
        for (LayerRegion r : w.layers()) {
            for (int s = 0; s < r.segments(); s++) {
                memory.write(r.pieceAddress(blockId, s), pattern(hash, w.tpRank(), r, s));
            }
        }
    }

    private static byte[] pattern(byte[] hash, int tpRank, LayerRegion r, int s) {
        long seed = seed(hash, tpRank, r.layerName(), s);
        ByteBuffer b = ByteBuffer.allocate((int) r.segmentBytes()).order(ByteOrder.LITTLE_ENDIAN);
        for (int off = 0; off + 8 <= b.capacity(); off += 8) {
            b.putLong(off, mix(seed + off));
        }
        return b.array();
    }

    /** Whether {@code blockId} on every worker holds the content {@link #fillPattern} writes for {@code hash}. */
    boolean holdsPattern(long blockId, byte[] hash) {
        for (WorkerSpec w : workers) {
            if (!holdsPattern(w, blockId, hash)) {
                return false;
            }
        }
        return true;
    }

    boolean holdsPattern(WorkerSpec w, long blockId, byte[] hash) {
        for (LayerRegion r : w.layers()) {
            if (!holds(w, r, blockId, hash)) {
                return false;
            }
        }
        return true;
    }

    /** Whether region {@code r} of worker {@code w} holds {@link #fillPattern}'s content for {@code hash} in {@code blockId}. */
    private boolean holds(WorkerSpec w, LayerRegion r, long blockId, byte[] hash) {
        for (int s = 0; s < r.segments(); s++) {
            byte[] actual = memory.read(r.pieceAddress(blockId, s), (int) r.segmentBytes());
            if (!Arrays.equals(actual, pattern(hash, w.tpRank(), r, s))) {
                return false;
            }
        }
        return true;
    }

    /** Whether layer {@code layer} of {@code blockId} on every worker holds what {@link #fillPattern} writes for {@code hash}. */
    boolean holdsLayer(long blockId, byte[] hash, int layer) {
        for (WorkerSpec w : workers) {
            if (!holds(w, w.layers().get(layer), blockId, hash)) {
                return false;
            }
        }
        return true;
    }

    /** Every byte of {@code blockId} across workers, layers and segments, in a fixed order. */
    byte[] snapshot(long blockId) {
        ByteBuffer out = ByteBuffer.allocate((int) bytesPerBlockAllWorkers());
        for (WorkerSpec w : workers) {
            for (LayerRegion r : w.layers()) {
                for (int s = 0; s < r.segments(); s++) {
                    out.put(memory.read(r.pieceAddress(blockId, s), (int) r.segmentBytes()));
                }
            }
        }
        return out.array();
    }

    long bytesPerBlockAllWorkers() {
        long total = 0;
        for (WorkerSpec w : workers) {
            for (LayerRegion r : w.layers()) {
                total += r.slotBytes();
            }
        }
        return total;
    }

    static byte[] randomHash(Random rnd) {
        byte[] h = new byte[32];
        rnd.nextBytes(h);
        return h;
    }

    static byte[][] randomHashes(Random rnd, int n) {
        byte[][] h = new byte[n][];
        for (int i = 0; i < n; i++) {
            h[i] = randomHash(rnd);
        }
        return h;
    }

    private static long seed(byte[] hash, int tpRank, String layer, int seg) {
        return Arrays.hashCode(hash) * 0x9E3779B97F4A7C15L + tpRank * 1_000_003L + layer.hashCode() * 31L + seg;
    }

    private static long mix(long z) {
        z = (z ^ (z >>> 30)) * 0xbf58476d1ce4e5b9L;
        z = (z ^ (z >>> 27)) * 0x94d049bb133111ebL;
        return z ^ (z >>> 31);
    }

    @Override
    public void close() {
        memory.close();
    }
}
