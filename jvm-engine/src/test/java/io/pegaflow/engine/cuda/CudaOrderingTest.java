package io.pegaflow.engine.cuda;

import static org.assertj.core.api.Assertions.assertThat;

import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.CopyBatch;
import io.pegaflow.engine.transfer.TransferFuture;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;

/**
 * What only a GPU copy engine has: ordering against a caller's stream, per-group events,
 * the DMA path for long runs next to the kernel's vector and byte paths. GPU machine only.
 */
@Tag("gpu")
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class CudaOrderingTest {
    private static final String TEST_KERNELS = """
            extern "C" __global__ void spin(long long cycles) {
                long long start = clock64();
                while (clock64() - start < cycles) { }
            }
            extern "C" __global__ void fill(unsigned char* p, unsigned long long n, unsigned char v) {
                for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v;
            }
            """;

    private HostPool pool;
    private CudaTransferEngine copies;
    private CudaDevice device;
    private long module;
    private long spin;
    private long fill;
    private long stream;
    private final Arena arena = Arena.ofShared();

    @BeforeAll
    void setUp() {
        pool = HostPool.anonymous(64L << 20);
        copies = CudaTransferEngine.create(pool, CudaOptions.defaults());
        device = CudaDevice.open(0);
        byte[] cubin = Nvrtc.load(CudaOptions.defaults().nvrtcDirs()).compile(TEST_KERNELS, "test_kernels.cu", device.arch(), List.of());
        module = CudaDriver.moduleLoadData(cubin);
        spin = CudaDriver.moduleGetFunction(module, "spin");
        fill = CudaDriver.moduleGetFunction(module, "fill");
        stream = CudaDriver.streamCreate(CudaDriver.CU_STREAM_NON_BLOCKING);
    }

    @AfterAll
    void tearDown() {
        device.makeCurrent();
        CudaDriver.streamSynchronize(stream);
        CudaDriver.streamDestroy(stream);
        CudaDriver.moduleUnload(module);
        copies.close();
        device.close();
        pool.close();
        arena.close();
    }

    private void launchSpin(long cycles) {
        MemorySegment arg = arena.allocate(ValueLayout.JAVA_LONG);
        arg.set(ValueLayout.JAVA_LONG, 0, cycles);
        MemorySegment params = arena.allocate(ValueLayout.ADDRESS, 1);
        params.setAtIndex(ValueLayout.ADDRESS, 0, arg);
        CudaDriver.launchKernel(spin, 1, 1, 0, stream, params);
    }

    private void launchFill(long ptr, long n, byte value) {
        MemorySegment p = arena.allocate(ValueLayout.JAVA_LONG);
        p.set(ValueLayout.JAVA_LONG, 0, ptr);
        MemorySegment len = arena.allocate(ValueLayout.JAVA_LONG);
        len.set(ValueLayout.JAVA_LONG, 0, n);
        MemorySegment v = arena.allocate(ValueLayout.JAVA_BYTE);
        v.set(ValueLayout.JAVA_BYTE, 0, value);
        MemorySegment params = arena.allocate(ValueLayout.ADDRESS, 3);
        params.setAtIndex(ValueLayout.ADDRESS, 0, p);
        params.setAtIndex(ValueLayout.ADDRESS, 1, len);
        params.setAtIndex(ValueLayout.ADDRESS, 2, v);
        CudaDriver.launchKernel(fill, 64, 256, 0, stream, params);
    }

    private byte poolByte(long offset) {
        return pool.segment().get(ValueLayout.JAVA_BYTE, offset);
    }

    /**
     * The caller's stream spins ~0.25 s and then writes 0xAB into a block; a save submitted
     * right after, told to wait for that stream, must see 0xAB. The same save without the wait
     * runs during the spin and sees the old bytes: that is what the event ordering prevents.
     */
    @Test
    void saveReadsWhatTheCallersStreamWroteBeforeSubmit() {
        device.makeCurrent();
        int piece = 32 * 1024;
        long gpu = CudaDriver.memAlloc(piece);
        try {
            CudaDriver.memsetD8Async(gpu, (byte) 0x11, piece, stream);
            CudaDriver.streamSynchronize(stream);
            long cycles = 500_000_000L; // ~0.25 s at the H200's ~2 GHz
            // Without waiting: the copy overtakes the caller's pending write.
            launchSpin(cycles);
            launchFill(gpu, piece, (byte) 0xAB);
            CopyBatch racing = new CopyBatch(CopyBatch.Direction.TO_HOST, 1);
            racing.add(gpu, 0, piece);
            copies.submit(racing).join();
            assertThat(poolByte(0)).as("unordered save ran before the caller's write").isEqualTo((byte) 0x11);
            CudaDriver.streamSynchronize(stream);

            CudaDriver.memsetD8Async(gpu, (byte) 0x11, piece, stream);
            launchSpin(cycles);
            launchFill(gpu, piece, (byte) 0xAB);
            CopyBatch ordered = new CopyBatch(CopyBatch.Direction.TO_HOST, 1).waitFor(stream);
            ordered.add(gpu, piece, piece);
            copies.submit(ordered).join();
            for (long off = piece; off < 2L * piece; off += 4096) {
                assertThat(poolByte(off)).as("ordered save saw the write at offset %d", off).isEqualTo((byte) 0xAB);
            }
            assertThat(poolByte(2L * piece - 1)).isEqualTo((byte) 0xAB);
        } finally {
            CudaDriver.streamSynchronize(stream);
            CudaDriver.memFree(gpu);
        }
    }

    /** A caller's stream made to wait for one group (layer) sees that group's bytes. */
    @Test
    void eachGroupOfALoadCanBeAwaitedOnAStream() {
        device.makeCurrent();
        int groups = 8;
        int pieces = 64;
        int piece = 16 * 1024;
        long gpu = CudaDriver.memAlloc((long) groups * pieces * piece);
        try {
            Random rnd = new Random(3);
            byte[] content = new byte[groups * pieces * piece];
            rnd.nextBytes(content);
            MemorySegment.copy(content, 0, pool.segment(), ValueLayout.JAVA_BYTE, 0, content.length);
            CopyBatch load = new CopyBatch(CopyBatch.Direction.TO_DEVICE, groups * pieces);
            for (int g = 0; g < groups; g++) {
                for (int p = 0; p < pieces; p++) {
                    // scattered on the device: reverse order inside the group
                    long dev = gpu + ((long) g * pieces + (pieces - 1 - p)) * piece;
                    load.add(dev, ((long) g * pieces + p) * piece, piece);
                }
                load.endGroup();
            }
            assertThat(load.groupCount()).isEqualTo(groups);
            TransferFuture f = copies.submit(load);
            MemorySegment back = arena.allocate((long) pieces * piece, 4096);
            for (int g = groups - 1; g >= 0; g--) {
                f.awaitGroup(g, stream);
                CudaDriver.memcpyDtoHAsync(back.address(), gpu + (long) g * pieces * piece, (long) pieces * piece, stream);
                CudaDriver.streamSynchronize(stream);
                for (int p = 0; p < pieces; p++) {
                    long at = (long) (pieces - 1 - p) * piece;
                    int src = (g * pieces + p) * piece;
                    assertThat(back.asSlice(at, piece).toArray(ValueLayout.JAVA_BYTE))
                            .as("group %d piece %d", g, p)
                            .isEqualTo(java.util.Arrays.copyOfRange(content, src, src + piece));
                }
            }
            f.join();
        } finally {
            CudaDriver.memFree(gpu);
        }
    }

    /** A long run whose host side crosses from one pinned chunk into the next still lands exactly. */
    @Test
    void dmaRunsAcrossPinnedChunksAreSplit() {
        try (HostPool small = HostPool.anonymous(8L << 20);
                CudaTransferEngine chunked = CudaTransferEngine.create(small, CudaOptions.defaults().withRegisterChunk(1L << 20))) {
            device.makeCurrent();
            int len = 3 << 20;
            long gpu = CudaDriver.memAlloc(2L * len);
            try {
                byte[] content = new byte[len];
                new Random(5).nextBytes(content);
                MemorySegment host = arena.allocate(len, 4096);
                MemorySegment.copy(content, 0, host, ValueLayout.JAVA_BYTE, 0, len);
                CudaDriver.memcpyHtoD(gpu, host.address(), len);
                CopyBatch save = new CopyBatch(CopyBatch.Direction.TO_HOST, 1);
                save.add(gpu, 512 << 10, len); // pool [0.5 MiB, 3.5 MiB): four chunks
                chunked.submit(save).join();
                CopyBatch load = new CopyBatch(CopyBatch.Direction.TO_DEVICE, 1);
                load.add(gpu + len, 512 << 10, len);
                chunked.submit(load).join();
                MemorySegment back = arena.allocate(len, 4096);
                CudaDriver.memcpyDtoH(back.address(), gpu + len, len);
                assertThat(back.toArray(ValueLayout.JAVA_BYTE)).isEqualTo(content);
            } finally {
                CudaDriver.memFree(gpu);
            }
        }
    }

    /** Long merged runs take the DMA path, odd sizes the kernel's byte path; all land exactly. */
    @Test
    void dmaRunsVectorPiecesAndOddSizesAllRoundTrip() {
        device.makeCurrent();
        long big = 3L << 20;
        int odd = 1008; // multiple of 16, so the vector piece after it stays aligned
        int vec = 32 * 1024;
        long gpu = CudaDriver.memAlloc(2 * (big + odd + vec) + 64);
        try {
            Random rnd = new Random(9);
            byte[] content = new byte[(int) (big + odd + vec)];
            rnd.nextBytes(content);
            MemorySegment host = arena.allocate(content.length, 4096);
            MemorySegment.copy(content, 0, host, ValueLayout.JAVA_BYTE, 0, content.length);
            long srcDev = gpu;
            CudaDriver.memcpyHtoD(srcDev, host.address(), content.length);
            CopyBatch save = new CopyBatch(CopyBatch.Direction.TO_HOST, 8);
            // the big run as 1 MiB pieces contiguous on both sides: merged, then DMA
            for (long off = 0; off < big; off += 1L << 20) {
                save.add(srcDev + off, off, 1L << 20);
            }
            save.add(srcDev + big + 3, big + 5, odd - 3); // misaligned: byte path
            save.add(srcDev + big, big, 3);
            save.add(srcDev + big + odd, big + odd + 1024, vec); // aligned: vector path
            assertThat(save.coalescedRanges()).isEqualTo(4);
            copies.submit(save).join();
            long dstDev = gpu + big + odd + vec + 64;
            CopyBatch load = new CopyBatch(CopyBatch.Direction.TO_DEVICE, 4);
            load.add(dstDev, 0, big);
            load.add(dstDev + big, big, 3);
            load.add(dstDev + big + 3, big + 5, odd - 3);
            load.add(dstDev + big + odd, big + odd + 1024, vec);
            copies.submit(load).join();
            MemorySegment back = arena.allocate(content.length, 4096);
            CudaDriver.memcpyDtoH(back.address(), dstDev, content.length);
            assertThat(back.toArray(ValueLayout.JAVA_BYTE)).isEqualTo(content);
            assertThat(copies.registrationNanos()).isPositive();
        } finally {
            CudaDriver.memFree(gpu);
        }
    }
}
