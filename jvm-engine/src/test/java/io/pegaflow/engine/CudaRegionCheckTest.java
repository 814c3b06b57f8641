package io.pegaflow.engine;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.cuda.CudaDriver;
import io.pegaflow.engine.cuda.CudaOptions;
import io.pegaflow.engine.cuda.CudaTransferEngine;
import java.lang.foreign.Arena;
import java.util.List;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * The CUDA engine checks each region against its CUDA allocation at registration
 * ({@code cuMemGetAddressRange}): a fitting region passes; one ending past its allocation, one
 * at an unallocated address and one in host memory are refused, and a refused worker
 * registers nothing. GPU machine only: {@code -Dgroups=gpu}.
 */
@Tag("gpu")
class CudaRegionCheckTest {
    private static final long BYTES = 4L << 20;

    private static LayerRegion region(long base, long bytes) {
        return new LayerRegion("l0", KvLayout.COMBINED, base, bytes, 16, bytes / 16, bytes / 16, 0);
    }

    @Test
    void regionsAreCheckedAgainstTheirCudaAllocation() {
        EngineConfig config = EngineConfig.builder().poolSize("16mb")
                .transfer(pool -> CudaTransferEngine.create(pool, CudaOptions.defaults())).build();
        try (CudaMemory mem = new CudaMemory(0); PegaEngine engine = PegaEngine.create(config); Arena host = Arena.ofConfined()) {
            engine.registerInstance(new InstanceSpec("i", "ns", 1, 1));
            long a = mem.allocate(BYTES);
            // Where the driver's mapped memory from a ends (a neighbour allocation may follow without a gap).
            long reached = a;
            for (long[] r = CudaDriver.memGetAddressRange(a); r != null; r = CudaDriver.memGetAddressRange(reached)) {
                reached = r[0] + r[1];
            }
            long end = reached;
            assertThat(end - a).isGreaterThanOrEqualTo(BYTES);

            long past = end - a + 4096;
            assertThatThrownBy(() -> engine.registerWorker("i", new WorkerSpec(0, 0, 0, List.of(region(a, past)))))
                    .isInstanceOf(InvalidArgumentException.class)
                    .hasMessage("layer 'l0': region 0x" + Long.toHexString(a) + " + " + past + " bytes ends 4096 bytes past"
                            + " its CUDA allocation 0x" + Long.toHexString(a) + " of " + (end - a) + " bytes (device 0);"
                            + " expected the KV tensor's own memory");
            assertThatThrownBy(() -> engine.registerWorker("i", new WorkerSpec(0, 0, 0, List.of(region(end, 4096)))))
                    .isInstanceOf(InvalidArgumentException.class)
                    .hasMessageContaining("region 0x" + Long.toHexString(end) + " + 4096 bytes is not in a CUDA allocation");
            long pageable = host.allocate(BYTES, 4096).address();
            assertThatThrownBy(() -> engine.registerWorker("i", new WorkerSpec(0, 0, 0, List.of(region(pageable, BYTES)))))
                    .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("is not in a CUDA allocation");
            assertThat(engine.isSealed("i")).as("refused workers were not registered").isFalse();

            engine.registerWorker("i", new WorkerSpec(0, 0, 0, List.of(region(a, BYTES))));
            assertThat(engine.isSealed("i")).isTrue();
        }
    }
}
