package io.pegaflow.engine.cuda;

import static org.assertj.core.api.Assertions.assertThat;

import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import java.util.List;
import java.util.function.LongFunction;
import org.junit.jupiter.api.Test;

/**
 * The CUDA engine's registration check without a GPU: {@link CudaTransferEngine#regionFault}
 * against a fake {@code cuMemGetAddressRange} (a list of allocations). The driver call itself
 * is covered by the GPU tier ({@code CudaRegionCheckTest}).
 */
class RegionFaultTest {
    private static final long A = 0x7f00_0000_0000L;

    /** cuMemGetAddressRange over {@code allocations} ({base, bytes} each). */
    private static LongFunction<long[]> driver(long[]... allocations) {
        List<long[]> all = List.of(allocations);
        return p -> all.stream().filter(r -> r[0] <= p && p < r[0] + r[1]).findFirst().orElse(null);
    }

    private static LayerRegion region(long base, long bytes) {
        return new LayerRegion("l0", KvLayout.COMBINED, base, bytes, 4, bytes / 4, bytes / 4, 0);
    }

    @Test
    void aRegionInsideItsAllocationPasses() {
        LongFunction<long[]> d = driver(new long[] {A, 1 << 20});
        assertThat(CudaTransferEngine.regionFault(region(A, 1 << 20), 0, d)).isNull();
        assertThat(CudaTransferEngine.regionFault(region(A + 4096, 8192), 0, d)).isNull(); // a view inside it
    }

    @Test
    void aRegionEndingPastItsAllocationIsRefusedWithTheNumbers() {
        String m = CudaTransferEngine.regionFault(region(A + 4096, 1 << 20), 3, driver(new long[] {A, 1 << 20}));
        assertThat(m).isEqualTo("layer 'l0': region 0x7f0000001000 + 1048576 bytes ends 4096 bytes past its CUDA"
                + " allocation 0x7f0000000000 of 1048576 bytes (device 3); expected the KV tensor's own memory");
    }

    @Test
    void anAddressInNoAllocationIsRefused() {
        String m = CudaTransferEngine.regionFault(region(A + (1 << 20), 4096), 0, driver(new long[] {A, 1 << 20}));
        assertThat(m).isEqualTo("layer 'l0': region 0x7f0000100000 + 4096 bytes is not in a CUDA allocation"
                + " (device 0); expected the KV tensor's own memory");
        assertThat(CudaTransferEngine.regionFault(region(A, 4096), 0, p -> null)).contains("is not in a CUDA allocation");
    }

    @Test
    void mappingsWithoutAGapCountAsOneAllocation() {
        // PyTorch's expandable segments: one tensor over several cuMemMap pieces, reported one by one.
        long piece = 20L << 20;
        LongFunction<long[]> d = driver(new long[] {A, piece}, new long[] {A + piece, piece}, new long[] {A + 2 * piece, piece});
        assertThat(CudaTransferEngine.regionFault(region(A + 4096, 3 * piece - 4096), 0, d)).isNull();
        assertThat(CudaTransferEngine.regionFault(region(A, 3 * piece + 4096), 0, d))
                .contains("ends 4096 bytes past its CUDA allocation 0x7f0000000000 of " + 3 * piece + " bytes");
        // a gap stops the walk even when memory follows it
        LongFunction<long[]> gap = driver(new long[] {A, piece}, new long[] {A + piece + 4096, piece});
        assertThat(CudaTransferEngine.regionFault(region(A, 2 * piece), 0, gap))
                .contains("ends " + piece + " bytes past its CUDA allocation 0x7f0000000000 of " + piece + " bytes");
    }
}
