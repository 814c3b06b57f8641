package io.pegaflow.bench;

import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.cuda.CudaDevice;
import io.pegaflow.engine.cuda.CudaDriver;
import io.pegaflow.engine.transfer.CopyBatch;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/**
 * A KV cache: per-layer {@code [2, cacheBlocks, piece]} tensors (vLLM's K/V split), or one
 * tensor of whole blocks; in GPU memory ({@code dev} given) or host memory. It gives the
 * engine its regions and the copy engine alone prepared batches, and marks and checks a
 * sample of the blocks so every load is verified.
 */
record Kv(CudaDevice dev, MemorySegment scratch, long base, int layers, int segments, long pieceBytes,
        int cacheBlocks) {
    static Kv allocate(CudaDevice dev, Arena arena, int layers, long pieceBytes, int cacheBlocks) {
        long bytes = (long) layers * 2 * cacheBlocks * pieceBytes;
        return make(dev, arena, bytes, layers, 2, pieceBytes, cacheBlocks);
    }

    static Kv allocateCrossLayer(CudaDevice dev, Arena arena, long blockBytes, int cacheBlocks) {
        return make(dev, arena, blockBytes * cacheBlocks, 1, 1, blockBytes, cacheBlocks);
    }

    /**
     * The per-layer geometry at {@code base} with no memory behind it: regions for the control
     * plane alone, which plans copies but never reads or writes them.
     */
    static Kv unbacked(long base, int layers, long pieceBytes, int cacheBlocks) {
        return new Kv(null, null, base, layers, 2, pieceBytes, cacheBlocks);
    }

    private static Kv make(CudaDevice dev, Arena arena, long bytes, int layers, int segments, long pieceBytes,
            int cacheBlocks) {
        if (dev != null) {
            dev.makeCurrent();
            return new Kv(dev, arena.allocate(8, 8), CudaDriver.memAlloc(bytes), layers, segments, pieceBytes, cacheBlocks);
        }
        MemorySegment m = arena.allocate(bytes, 4096);
        return new Kv(null, null, m.address(), layers, segments, pieceBytes, cacheBlocks);
    }

    long layerBytes() {
        return segments * cacheBlocks * pieceBytes;
    }

    long address(int layer, int seg, long block) {
        return base + layer * layerBytes() + (seg * cacheBlocks + block) * pieceBytes;
    }

    List<LayerRegion> regions() {
        List<LayerRegion> out = new ArrayList<>();
        for (int l = 0; l < layers; l++) {
            out.add(new LayerRegion(String.format(Locale.ROOT, "layers.%03d", l),
                    segments == 2 ? KvLayout.SPLIT_KV : KvLayout.COMBINED, base + l * layerBytes(), layerBytes(),
                    cacheBlocks, pieceBytes, pieceBytes, segments == 2 ? cacheBlocks * pieceBytes : 0));
        }
        return out;
    }

    /** Block-major pieces, each block's slots contiguous in the pool, as the engine lays them out. */
    CopyBatch batch(CopyBatch.Direction dir, long[] ids) {
        CopyBatch b = new CopyBatch(dir, ids.length * layers * segments);
        long host = 0;
        for (long block : ids) {
            for (int l = 0; l < layers; l++) {
                for (int s = 0; s < segments; s++) {
                    b.add(address(l, s, block), host, pieceBytes);
                    host += pieceBytes;
                }
            }
        }
        return b;
    }

    /**
     * The first and last 8 bytes of each piece of a sample of the blocks (about 32, first
     * and last included) hold a value of (position in the list, layer, segment, round): a
     * load into other ids is checked by position, and stale bytes of an earlier round differ.
     */
    void fill(long[] ids, int round) {
        probes(ids, round, (addr, v) -> write(addr, v));
    }

    boolean check(long[] ids, int round) {
        boolean[] ok = {true};
        probes(ids, round, (addr, v) -> ok[0] &= read(addr) == v);
        return ok[0];
    }

    void clear(long[] ids) {
        probes(ids, 0, (addr, v) -> write(addr, 0));
    }

    private interface Probe {
        void at(long address, long value);
    }

    private void probes(long[] ids, int round, Probe p) {
        int step = Math.max(1, ids.length / 32);
        for (int i = 0; i < ids.length; i = i == ids.length - 1 ? ids.length : Math.min(i + step, ids.length - 1)) {
            for (int l = 0; l < layers; l++) {
                for (int s = 0; s < segments; s++) {
                    long v = ((long) round << 40) ^ ((long) i << 16) ^ (l << 2) ^ s ^ 0x5a5a_0000_0000_0000L;
                    p.at(address(l, s, ids[i]), v);
                    p.at(address(l, s, ids[i]) + pieceBytes - 8, ~v);
                }
            }
        }
    }

    private void write(long address, long value) {
        if (dev == null) {
            MemorySegment.ofAddress(address).reinterpret(8).set(ValueLayout.JAVA_LONG, 0, value);
        } else {
            scratch.set(ValueLayout.JAVA_LONG, 0, value);
            CudaDriver.memcpyHtoD(address, scratch.address(), 8);
        }
    }

    private long read(long address) {
        if (dev == null) {
            return MemorySegment.ofAddress(address).reinterpret(8).get(ValueLayout.JAVA_LONG, 0);
        }
        CudaDriver.memcpyDtoH(scratch.address(), address, 8);
        return scratch.get(ValueLayout.JAVA_LONG, 0);
    }

    void free() {
        if (dev != null) {
            CudaDriver.memFree(base);
        }
    }
}
