package io.pegaflow.engine.cuda;

import static org.assertj.core.api.Assertions.assertThat;

import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.CopyBatch;
import io.pegaflow.engine.transfer.LayerSplit;
import io.pegaflow.engine.transfer.TransferFuture;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.TestInstance;

/**
 * The bounce path ({@link CudaOptions#bounceBytes()}): pieces back to back in the pool and
 * scattered on the GPU go through the copy engine and a device slot. Small slots (1 MiB) and
 * pinned chunks (1 MiB) so a batch reuses every slot many times and its stretches cross
 * chunks; every byte is compared, and the engine's own count says which bytes went through the
 * slots (with the bounce path off, or taken by no group, the tests fail). GPU machine only.
 */
@Tag("gpu")
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class CudaBounceTest {
    private static final int PIECE = 32 << 10;
    private static final int LAYERS = 4;
    private static final int SEGMENTS = 2;
    /** One block over all layers: 256 KiB, the smallest stretch that takes the bounce path. */
    private static final long BLOCK = (long) PIECE * LAYERS * SEGMENTS;
    private static final int CACHE_BLOCKS = 96;

    private final Arena arena = Arena.ofShared();
    private HostPool pool;
    private CudaTransferEngine bounced;
    private CudaDevice device;
    /** LAYERS * SEGMENTS regions of CACHE_BLOCKS pieces each, as vLLM's per-layer tensors. */
    private long kv;
    private long kvBytes;

    @BeforeAll
    void setUp() {
        pool = HostPool.anonymous(64L << 20);
        bounced = CudaTransferEngine.create(pool, CudaOptions.defaults().withRegisterChunk(1L << 20).withBounce(4L << 20, 4));
        device = CudaDevice.open(0);
        device.makeCurrent();
        kvBytes = (long) LAYERS * SEGMENTS * CACHE_BLOCKS * PIECE;
        kv = CudaDriver.memAlloc(kvBytes);
    }

    @AfterAll
    void tearDown() {
        device.makeCurrent();
        CudaDriver.memFree(kv);
        bounced.close();
        device.close();
        pool.close();
        arena.close();
    }

    private long piece(int layer, int segment, int block) {
        return kv + ((long) (layer * SEGMENTS + segment) * CACHE_BLOCKS + block) * PIECE;
    }

    /** Block ids {@code ids[i]} to pool slots {@code slots[i]} (in blocks), one group per {@code groupEvery} blocks (0: one group). */
    private CopyBatch batch(CopyBatch.Direction dir, int[] ids, long[] slots, int groupEvery) {
        CopyBatch b = new CopyBatch(dir, ids.length * LAYERS * SEGMENTS);
        for (int i = 0; i < ids.length; i++) {
            long host = slots[i] * BLOCK;
            for (int l = 0; l < LAYERS; l++) {
                for (int s = 0; s < SEGMENTS; s++) {
                    b.add(piece(l, s, ids[i]), host, PIECE);
                    host += PIECE;
                }
            }
            if (groupEvery > 0 && (i + 1) % groupEvery == 0) {
                b.endGroup();
            }
        }
        return b;
    }

    private byte[] deviceBytes() {
        MemorySegment h = arena.allocate(kvBytes, 4096);
        CudaDriver.memcpyDtoH(h.address(), kv, kvBytes);
        return h.toArray(ValueLayout.JAVA_BYTE);
    }

    private void fillDevice(long seed) {
        byte[] content = new byte[(int) kvBytes];
        new Random(seed).nextBytes(content);
        MemorySegment h = arena.allocate(kvBytes, 4096);
        MemorySegment.copy(content, 0, h, ValueLayout.JAVA_BYTE, 0, content.length);
        CudaDriver.memcpyHtoD(kv, h.address(), kvBytes);
    }

    /** The piece bytes of {@code block}'s layer {@code layer} (its segments in order). */
    private static byte[] sliceOf(byte[] dev, int block, int layer) {
        byte[] out = new byte[SEGMENTS * PIECE];
        for (int s = 0; s < SEGMENTS; s++) {
            long off = ((long) (layer * SEGMENTS + s) * CACHE_BLOCKS + block) * PIECE;
            System.arraycopy(dev, (int) off, out, s * PIECE, PIECE);
        }
        return out;
    }

    /** The piece bytes of {@code block} in device order (layer, segment). */
    private static byte[] blockOf(byte[] dev, int block) {
        byte[] out = new byte[(int) BLOCK];
        int at = 0;
        for (int l = 0; l < LAYERS; l++) {
            for (int s = 0; s < SEGMENTS; s++) {
                long off = ((long) (l * SEGMENTS + s) * CACHE_BLOCKS + block) * PIECE;
                System.arraycopy(dev, (int) off, out, at, PIECE);
                at += PIECE;
            }
        }
        return out;
    }

    /**
     * 40 blocks (10 MiB: ten 1 MiB slots, each used two or three times) saved into pool slots
     * that run back to back in places and jump in others, then loaded into other ids: the
     * pool holds each block in slot order, and the loaded blocks equal the saved ones.
     */
    @Test
    void blocksRoundTripThroughTheBounceSlots() {
        device.makeCurrent();
        fillDevice(11);
        byte[] before = deviceBytes();
        int n = 40;
        int[] src = new int[n];
        int[] dst = new int[n];
        long[] slots = new long[n];
        java.util.Set<Integer> srcSet = new java.util.HashSet<>();
        for (int i = 0; i < n; i++) {
            src[i] = (i * 7) % CACHE_BLOCKS;
            srcSet.add(src[i]);
            slots[i] = i < 20 ? i : 3 * i + 1; // back to back, then every third slot
        }
        List<Integer> free = new ArrayList<>(); // the other ids, shuffled: distinct and scattered
        for (int b = 0; b < CACHE_BLOCKS; b++) {
            if (!srcSet.contains(b)) {
                free.add(b);
            }
        }
        java.util.Collections.shuffle(free, new Random(3));
        for (int i = 0; i < n; i++) {
            dst[i] = free.get(i);
        }
        long through = bounced.bouncedBytes();
        bounced.submit(batch(CopyBatch.Direction.TO_HOST, src, slots, 0)).join();
        assertThat(bounced.bouncedBytes() - through).as("every piece went through a slot").isEqualTo(n * BLOCK);
        MemorySegment pooled = pool.segment();
        for (int i = 0; i < n; i++) {
            byte[] inPool = pooled.asSlice(slots[i] * BLOCK, BLOCK).toArray(ValueLayout.JAVA_BYTE);
            assertThat(inPool).as("pool slot %d (block %d)", slots[i], src[i]).isEqualTo(blockOf(before, src[i]));
        }
        bounced.submit(batch(CopyBatch.Direction.TO_DEVICE, dst, slots, 0)).join();
        assertThat(bounced.bouncedBytes() - through).as("and back").isEqualTo(2 * n * BLOCK);
        byte[] after = deviceBytes();
        for (int i = 0; i < n; i++) {
            assertThat(blockOf(after, dst[i])).as("block %d loaded from slot %d", dst[i], slots[i])
                    .isEqualTo(blockOf(before, src[i]));
        }
        for (int b = 0; b < CACHE_BLOCKS; b++) {
            boolean written = false;
            for (int d : dst) {
                written |= d == b;
            }
            if (!written) {
                assertThat(blockOf(after, b)).as("block %d, not loaded into", b).isEqualTo(blockOf(before, b));
            }
        }
    }

    /**
     * A layer-wise batch (one group per layer, each group block by block) over 24 blocks whose
     * pool slots run back to back, on an engine with 4 MiB pinned chunks (16 blocks) and 1 MiB
     * bounce slots (16 stretches of a layer): each slot's stretches are one layer of
     * consecutive blocks at one stride, so a load moves them as pitched copies, one per slot
     * here (16 rows, then the 8 after the chunk's end). Saved that way (short stretches: the
     * kernel's direct path) and loaded back into other ids: every byte lands, and the engine
     * counts two pitched copies per layer.
     */
    @Test
    void layerMajorStretchesGoAsPitchedCopies() {
        try (HostPool own = HostPool.anonymous(16L << 20); CudaTransferEngine engine = smallChunks(own)) {
            Moves m = Moves.scattered(24);
            byte[] before = savedLayerMajor(engine, m, 15);
            for (int i = 0; i < m.src.length; i++) {
                assertThat(own.segment().asSlice(m.slots[i] * BLOCK, BLOCK).toArray(ValueLayout.JAVA_BYTE))
                        .as("pool slot %d (block %d)", m.slots[i], m.src[i]).isEqualTo(blockOf(before, m.src[i]));
            }
            awaitEveryLayer(engine.submit(layerMajor(CopyBatch.Direction.TO_DEVICE, m.dst, m.slots)));
            assertLoaded(before, m);
            assertThat(engine.pitchedCopies()).as("the load's pitched copies").isEqualTo(2L * LAYERS);
        }
    }

    /**
     * A layer-wise load held until its caller opens it (a load started where vLLM allocates
     * its blocks waits so for its step): nothing lands before, every byte after.
     */
    @Test
    void aHeldLayerwiseLoadCopiesNothingUntilOpened() throws Exception {
        try (HostPool own = HostPool.anonymous(16L << 20); CudaTransferEngine engine = smallChunks(own)) {
            Moves m = Moves.scattered(12);
            byte[] before = savedLayerMajor(engine, m, 16);
            java.util.concurrent.CompletableFuture<Void> go = new java.util.concurrent.CompletableFuture<>();
            TransferFuture load = engine.submit(layerMajor(CopyBatch.Direction.TO_DEVICE, m.dst, m.slots).holdUntil(go));
            Thread.sleep(200);
            assertThat(load).as("held").isNotDone();
            byte[] held = deviceBytes();
            for (int d : m.dst) {
                assertThat(blockOf(held, d)).as("block %d before the hold opened", d).isEqualTo(blockOf(before, d));
            }
            go.complete(null);
            awaitEveryLayer(load);
            assertLoaded(before, m);
        }
    }

    /**
     * A held layer-wise load with a lead of one layer's bytes: that layer lands before the hold
     * opens, no other, through the kernel (nothing on the copy engine: vLLM's input copies queued
     * meanwhile must not wait behind it); the layers after it through the copy engine once the
     * hold opens; every byte after.
     */
    @Test
    void aHeldLoadsLeadLandsBeforeItsHoldOpens() throws Exception {
        Moves m = Moves.scattered(12);
        long layerBytes = (long) m.dst.length * SEGMENTS * PIECE;
        try (HostPool own = HostPool.anonymous(16L << 20); CudaTransferEngine engine = CudaTransferEngine.create(own,
                CudaOptions.defaults().withRegisterChunk(4L << 20).withBounce(4L << 20, 4)
                        .withLayerSplit(LayerSplit.PER_LAYER.withLead(layerBytes)))) {
            byte[] before = savedLayerMajor(engine, m, 17);
            long bounced = engine.bouncedBytes();
            java.util.concurrent.CompletableFuture<Void> go = new java.util.concurrent.CompletableFuture<>();
            TransferFuture load = engine.submit(layerMajor(CopyBatch.Direction.TO_DEVICE, m.dst, m.slots).holdUntil(go));
            long stream = CudaDriver.streamCreate(CudaDriver.CU_STREAM_NON_BLOCKING);
            try {
                load.awaitGroup(0, stream);
                CudaDriver.streamSynchronize(stream);
            } finally {
                CudaDriver.streamDestroy(stream);
            }
            Thread.sleep(200);
            assertThat(load).as("held past its lead").isNotDone();
            assertThat(engine.bouncedBytes()).as("the lead through the kernel, nothing on the copy engine").isEqualTo(bounced);
            byte[] led = deviceBytes();
            for (int i = 0; i < m.dst.length; i++) {
                for (int l = 0; l < LAYERS; l++) {
                    assertThat(sliceOf(led, m.dst[i], l)).as("block %d layer %d before the hold opened", m.dst[i], l)
                            .isEqualTo(sliceOf(before, l == 0 ? m.src[i] : m.dst[i], l));
                }
            }
            go.complete(null);
            awaitEveryLayer(load);
            assertLoaded(before, m);
            assertThat(engine.bouncedBytes() - bounced).as("the layers after the lead through the copy engine")
                    .isGreaterThanOrEqualTo(layerBytes);
        }
    }

    /**
     * A held layer-wise load whose lead covers all of it (the lead's cap, more than any one load:
     * {@code PEGAFLOW_CUDA_LAYER_LEAD_MIB=16384}): every layer through the kernel before the hold
     * opens, nothing on the copy engine, and the load completes without waiting for the hold
     * (nothing is left for the step to queue).
     */
    @Test
    void aLeadOfTheWholeLoadLandsItAllBeforeItsHoldOpens() throws Exception {
        Moves m = Moves.scattered(12);
        try (HostPool own = HostPool.anonymous(16L << 20); CudaTransferEngine engine = CudaTransferEngine.create(own,
                CudaOptions.defaults().withRegisterChunk(4L << 20).withBounce(4L << 20, 4)
                        .withLayerSplit(LayerSplit.fromEnvironment(null, null, null, null, "16384")))) {
            byte[] before = savedLayerMajor(engine, m, 18);
            assertThat(wholeLeadWithItsHoldClosed(engine, before, m)).as("the whole lead through the kernel, nothing on the copy engine")
                    .isZero();
            assertThat(engine.pacedGroups()).as("a lead through the kernel is queued whole, not paced").isZero();
        }
    }

    /**
     * A paced lead of the whole load ({@code PEGAFLOW_CUDA_LAYER_LEAD_PACED=1}): the layers go
     * through the copy engine, one at a time, and all land before the hold opens; with the hold
     * opened while the lead still goes, the layers left are queued at once and every byte lands.
     */
    @Test
    void aPacedLeadGoesThroughTheCopyEngineAndStopsPacingWhenItsHoldOpens() throws Exception {
        Moves m = Moves.scattered(12);
        long loadBytes = (long) m.dst.length * LAYERS * SEGMENTS * PIECE;
        try (HostPool own = HostPool.anonymous(16L << 20); CudaTransferEngine engine = CudaTransferEngine.create(own,
                CudaOptions.defaults().withRegisterChunk(4L << 20).withBounce(4L << 20, 4)
                        .withLayerSplit(LayerSplit.fromEnvironment(null, null, null, null, "16384", "1")))) {
            byte[] before = savedLayerMajor(engine, m, 19);
            assertThat(wholeLeadWithItsHoldClosed(engine, before, m)).as("the whole lead through the copy engine").isEqualTo(loadBytes);
            assertThat(engine.pacedGroups()).as("each layer after the first queued once the one before it landed").isEqualTo(LAYERS - 1);

            fillDevice(20);
            java.util.concurrent.CompletableFuture<Void> open = new java.util.concurrent.CompletableFuture<>();
            TransferFuture again = engine.submit(layerMajor(CopyBatch.Direction.TO_DEVICE, m.dst, m.slots).holdUntil(open));
            open.complete(null);
            awaitEveryLayer(again);
            assertThat(again).succeedsWithin(java.time.Duration.ofSeconds(20));
            assertLoaded(before, m);
        }
    }

    /**
     * {@code m}'s load held by a hold that never opens, on an engine whose lead covers all of it:
     * done with the hold closed, every byte landed; returns the bytes it moved through the copy engine.
     */
    private long wholeLeadWithItsHoldClosed(CudaTransferEngine engine, byte[] before, Moves m) throws Exception {
        long bounced = engine.bouncedBytes();
        java.util.concurrent.CompletableFuture<Void> go = new java.util.concurrent.CompletableFuture<>();
        TransferFuture load = engine.submit(layerMajor(CopyBatch.Direction.TO_DEVICE, m.dst, m.slots).holdUntil(go));
        assertThat(load).as("done with its hold still closed").succeedsWithin(java.time.Duration.ofSeconds(20));
        awaitEveryLayer(load);
        assertThat(go).as("the hold never opened").isNotDone();
        assertLoaded(before, m);
        return engine.bouncedBytes() - bounced;
    }

    /** An engine over {@code own} with 4 MiB pinned chunks (16 blocks) and 1 MiB bounce slots. */
    private static CudaTransferEngine smallChunks(HostPool own) {
        return CudaTransferEngine.create(own, CudaOptions.defaults().withRegisterChunk(4L << 20).withBounce(4L << 20, 4));
    }

    /** Fills the device cache from {@code seed}, saves {@code m}'s sources layer by layer; returns the cache as filled. */
    private byte[] savedLayerMajor(CudaTransferEngine engine, Moves m, long seed) {
        device.makeCurrent();
        fillDevice(seed);
        byte[] before = deviceBytes();
        engine.submit(layerMajor(CopyBatch.Direction.TO_HOST, m.src, m.slots)).join();
        return before;
    }

    /** Blocks {@code src[i]} saved to pool slot {@code slots[i]} (back to back), loaded into {@code dst[i]}. */
    private record Moves(int[] src, int[] dst, long[] slots) {
        /** n blocks from 0 up into slots 0 up, loaded back into scattered ids, none of them a source. */
        static Moves scattered(int n) {
            Moves m = new Moves(new int[n], new int[n], new long[n]);
            for (int i = 0; i < n; i++) {
                m.src[i] = i;
                m.dst[i] = CACHE_BLOCKS - 1 - 2 * i;
                m.slots[i] = i;
            }
            return m;
        }
    }

    /** Waits for every layer of a layer-wise load from a stream of its own, then for the load. */
    private static void awaitEveryLayer(TransferFuture load) {
        long stream = CudaDriver.streamCreate(CudaDriver.CU_STREAM_NON_BLOCKING);
        try {
            for (int l = 0; l < LAYERS; l++) {
                load.awaitGroup(l, stream);
            }
            CudaDriver.streamSynchronize(stream);
            load.join();
        } finally {
            CudaDriver.streamDestroy(stream);
        }
    }

    /** Every {@code dst} block holds what its {@code src} block held in {@code before}. */
    private void assertLoaded(byte[] before, Moves m) {
        byte[] after = deviceBytes();
        for (int i = 0; i < m.dst.length; i++) {
            assertThat(blockOf(after, m.dst[i])).as("block %d loaded from slot %d", m.dst[i], m.slots[i])
                    .isEqualTo(blockOf(before, m.src[i]));
        }
    }

    /** Blocks {@code ids[i]} at pool slots {@code slots[i]}, layer by layer: one group per layer. */
    private CopyBatch layerMajor(CopyBatch.Direction dir, int[] ids, long[] slots) {
        CopyBatch b = new CopyBatch(dir, ids.length * LAYERS * SEGMENTS);
        for (int l = 0; l < LAYERS; l++) {
            for (int i = 0; i < ids.length; i++) {
                long host = slots[i] * BLOCK + (long) l * SEGMENTS * PIECE;
                for (int s = 0; s < SEGMENTS; s++) {
                    b.add(piece(l, s, ids[i]), host + (long) s * PIECE, PIECE);
                }
            }
            b.endGroup();
        }
        return b;
    }

    /**
     * Groups of four blocks (each group bounced on its own), awaited one at a time from a
     * caller's stream, and several batches at once on the lanes: the bytes of every group
     * land, and concurrent batches do not share slots.
     */
    @Test
    void groupedAndConcurrentBatchesKeepTheirBytes() {
        device.makeCurrent();
        fillDevice(12);
        byte[] before = deviceBytes();
        int n = 16;
        List<int[]> srcs = new ArrayList<>();
        List<long[]> slotSets = new ArrayList<>();
        List<TransferFuture> saves = new ArrayList<>();
        long through = bounced.bouncedBytes();
        for (int k = 0; k < 3; k++) {
            int[] src = new int[n];
            long[] slots = new long[n];
            for (int i = 0; i < n; i++) {
                src[i] = k * n + i;
                slots[i] = 2L * (k * n + i) + (i % 3 == 0 ? 1 : 0); // pairs of neighbours, gaps between
            }
            srcs.add(src);
            slotSets.add(slots);
            saves.add(bounced.submit(batch(CopyBatch.Direction.TO_HOST, src, slots, 4)));
        }
        saves.forEach(TransferFuture::join);
        // load group by group into block ids 48.. (the sources are 0..47)
        long stream = CudaDriver.streamCreate(CudaDriver.CU_STREAM_NON_BLOCKING);
        try {
            int[] dst = new int[n];
            for (int i = 0; i < n; i++) {
                dst[i] = 48 + i * 2;
            }
            TransferFuture load = bounced.submit(batch(CopyBatch.Direction.TO_DEVICE, dst, slotSets.get(1), 4));
            for (int g = 0; g < 4; g++) {
                load.awaitGroup(g, stream);
            }
            CudaDriver.streamSynchronize(stream);
            load.join();
            assertThat(bounced.bouncedBytes() - through).as("each group went through the slots")
                    .isEqualTo(4L * n * BLOCK);
            byte[] after = deviceBytes();
            for (int i = 0; i < n; i++) {
                assertThat(blockOf(after, dst[i])).as("block %d from batch 1's block %d", dst[i], srcs.get(1)[i])
                        .isEqualTo(blockOf(before, srcs.get(1)[i]));
            }
        } finally {
            CudaDriver.streamDestroy(stream);
        }
    }

    /**
     * In one bounced group: a run long on both sides (straight through the copy engine), a
     * piece longer than a slot (the kernel's direct path) and odd-sized misaligned pieces
     * (the kernel's byte path, from the slot): all land exactly, in both directions.
     */
    @Test
    void longRunsOversizedAndOddPiecesInABouncedGroup() {
        long slot = 1L << 20;
        try (HostPool small = HostPool.anonymous(16L << 20);
                CudaTransferEngine engine = CudaTransferEngine.create(small,
                        CudaOptions.defaults().withBounce(4 * slot, 4).withDmaThreshold(4L << 20))) {
            device.makeCurrent();
            long total = 12L << 20;
            long gpu = CudaDriver.memAlloc(2 * total);
            try {
                byte[] content = new byte[(int) total];
                new Random(13).nextBytes(content);
                MemorySegment host = arena.allocate(total, 4096);
                MemorySegment.copy(content, 0, host, ValueLayout.JAVA_BYTE, 0, content.length);
                CudaDriver.memcpyHtoD(gpu, host.address(), total);
                // pool layout: [0, 5 MiB) one run long on both sides; [5, 7 MiB) one 2 MiB piece;
                // then 1 MiB of 1000-byte-ish pieces, back to back in the pool, reversed on the device
                CopyBatch save = new CopyBatch(CopyBatch.Direction.TO_HOST, 2048);
                List<long[]> pieces = new ArrayList<>(); // {device offset, pool offset, length}
                pieces.add(new long[] {0, 0, 5L << 20});
                pieces.add(new long[] {5L << 20, 5L << 20, 2L << 20});
                long at = 7L << 20;
                long devEnd = total;
                Random r = new Random(14);
                while (at < (9L << 20)) {
                    long len = 900 + r.nextInt(300);
                    devEnd -= len + 7;
                    pieces.add(new long[] {devEnd, at, len});
                    at += len;
                }
                // the 2 MiB piece is not merged with the run before it: a gap on the device side
                pieces.get(1)[0] += 16;
                long odd = 0;
                for (long[] p : pieces) {
                    save.add(gpu + p[0], p[1], p[2]);
                    odd += p[2];
                }
                odd -= pieces.get(0)[2] + pieces.get(1)[2]; // the long run and the oversized piece do not bounce
                long through = engine.bouncedBytes();
                engine.submit(save).join();
                assertThat(engine.bouncedBytes() - through).as("only the small pieces went through a slot").isEqualTo(odd);
                MemorySegment pooled = small.segment();
                for (long[] p : pieces) {
                    assertThat(pooled.asSlice(p[1], p[2]).toArray(ValueLayout.JAVA_BYTE))
                            .as("pool [%d, +%d)", p[1], p[2])
                            .isEqualTo(java.util.Arrays.copyOfRange(content, (int) p[0], (int) (p[0] + p[2])));
                }
                CopyBatch load = new CopyBatch(CopyBatch.Direction.TO_DEVICE, pieces.size());
                for (long[] p : pieces) {
                    load.add(gpu + total + p[0], p[1], p[2]);
                }
                engine.submit(load).join();
                assertThat(engine.bouncedBytes() - through).isEqualTo(2 * odd);
                MemorySegment back = arena.allocate(total, 4096);
                CudaDriver.memcpyDtoH(back.address(), gpu + total, total);
                for (long[] p : pieces) {
                    assertThat(back.asSlice(p[0], p[2]).toArray(ValueLayout.JAVA_BYTE)).as("device [%d, +%d)", p[0], p[2])
                            .isEqualTo(java.util.Arrays.copyOfRange(content, (int) p[0], (int) (p[0] + p[2])));
                }
            } finally {
                CudaDriver.memFree(gpu);
            }
        }
    }
}
