package io.pegaflow.engine;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
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
    private final Arena arena = Arena.ofShared();

    KvWorld(String instanceId, String namespace, Kind kind, int tp, int pp, int layers, int numBlocks,
            long segmentBytes, long pad) {
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
                    long base = arena.allocate(total, 64).address();
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
                long base = arena.allocate(total, 64).address();
                yield new LayerRegion(name, KvLayout.SPLIT_KV, base, total, n, stride, s, stride * n);
            }
            case SPLIT_BLOCKS_FIRST -> {
                long stride = 2 * s + pad;
                long total = stride * n;
                yield new LayerRegion(name, KvLayout.SPLIT_KV, arena.allocate(total, 64).address(), total, n, stride, s, s);
            }
            case COMBINED -> {
                long stride = 2 * s + pad;
                long total = stride * n;
                yield new LayerRegion(name, KvLayout.COMBINED, arena.allocate(total, 64).address(), total, n, stride, 2 * s, 0);
            }
            case MLA -> {
                long stride = s + pad;
                long total = stride * n;
                yield new LayerRegion(name, KvLayout.MLA, arena.allocate(total, 64).address(), total, n, stride, s, 0);
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

    static MemorySegment piece(LayerRegion r, long blockId, int seg) {
        return MemorySegment.ofAddress(r.pieceAddress(blockId, seg)).reinterpret(r.segmentBytes());
    }

    /** Fills every piece of {@code blockId} on every worker with random bytes. */
    void fillRandom(long blockId, Random rnd) {
        for (WorkerSpec w : workers) {
            for (LayerRegion r : w.layers()) {
                for (int s = 0; s < r.segments(); s++) {
                    byte[] b = new byte[(int) r.segmentBytes()];
                    rnd.nextBytes(b);
                    MemorySegment.copy(b, 0, piece(r, blockId, s), ValueLayout.JAVA_BYTE, 0, b.length);
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
                MemorySegment p = piece(r, blockId, s);
                long seed = seed(hash, w.tpRank(), r.layerName(), s);
                for (long off = 0; off + 8 <= p.byteSize(); off += 8) {
                    p.set(ValueLayout.JAVA_LONG_UNALIGNED, off, mix(seed + off));
                }
            }
        }
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
            for (int s = 0; s < r.segments(); s++) {
                MemorySegment p = piece(r, blockId, s);
                long seed = seed(hash, w.tpRank(), r.layerName(), s);
                for (long off = 0; off + 8 <= p.byteSize(); off += 8) {
                    if (p.get(ValueLayout.JAVA_LONG_UNALIGNED, off) != mix(seed + off)) {
                        return false;
                    }
                }
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
                    out.put(piece(r, blockId, s).toArray(ValueLayout.JAVA_BYTE));
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
        arena.close();
    }
}
