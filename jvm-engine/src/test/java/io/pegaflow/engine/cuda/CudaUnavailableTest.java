package io.pegaflow.engine.cuda;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.junit.jupiter.api.Assumptions.assumeFalse;

import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.ErrorCode;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.CopyBatch;
import io.pegaflow.engine.transfer.LayerSplit;
import org.junit.jupiter.api.Test;

/** On a machine without a GPU, asking for CUDA copies fails at once with a message that says why. */
class CudaUnavailableTest {

    @Test
    void askingForCudaWithoutADriverFailsClearly() {
        assumeFalse(CudaDriver.available(), "this machine has a CUDA driver");
        try (HostPool pool = HostPool.anonymous(1 << 20)) {
            assertThatThrownBy(() -> CudaTransferEngine.create(pool, CudaOptions.defaults()))
                    .isInstanceOf(CudaException.class)
                    .hasMessageContaining("CUDA is not available")
                    .hasMessageContaining("libcuda.so.1")
                    .satisfies(e -> assertThat(((CudaException) e).code()).isEqualTo(ErrorCode.CUDA));
        }
        EngineConfig config = EngineConfig.builder().poolSize("1mb")
                .transfer(p -> CudaTransferEngine.create(p, CudaOptions.defaults())).build();
        assertThatThrownBy(() -> PegaEngine.create(config)).isInstanceOf(CudaException.class)
                .hasMessageContaining("the engine runs with host copies");
        // The host path is unaffected.
        try (PegaEngine engine = PegaEngine.create(EngineConfig.builder().poolSize("1mb").build())) {
            assertThat(engine.transferName()).isEqualTo("host");
        }
    }

    @Test
    void badOptionsAreRefusedByName() {
        assertThatThrownBy(() -> CudaOptions.defaults().withLanes(0)).hasMessageContaining("lanesPerDirection 0");
        assertThatThrownBy(() -> CudaOptions.defaults().withDmaThreshold(100)).hasMessageContaining("dmaThresholdBytes 100");
        assertThatThrownBy(() -> CudaOptions.defaults().withBounce(1L << 20)).hasMessageContaining("bounceBytes 1048576");
        assertThatThrownBy(() -> CudaOptions.defaults().withBounce((8L << 20) + 4096)).hasMessageContaining("multiple of 8192");
        assertThatThrownBy(() -> CudaOptions.defaults().withBounce(8L << 20, 9)).hasMessageContaining("bounceSlots 9");
        assertThat(CudaOptions.defaults().withBounce(0).bounceBytes()).isZero();
        assertThatThrownBy(() -> CudaOptions.defaults().withSaveKernelBlocks(-1)).hasMessageContaining("saveKernelBlocks -1");
        assertThatThrownBy(() -> CudaOptions.defaults().withSaveKernelBlocks(65536)).hasMessageContaining("saveKernelBlocks 65536");
        assertThatThrownBy(() -> CudaOptions.defaults().withSavePace(-1)).hasMessageContaining("savePaceCopies -1");
        assertThatThrownBy(() -> CudaOptions.defaults().withSavePace(65)).hasMessageContaining("savePaceCopies 65; expected 0 (not paced) to 64");
    }

    @Test
    void theSavePaceComesFromTheEnvironmentAsCopies() {
        assertThat(CudaOptions.savePaceFromEnvironment(null)).isEqualTo(1);
        assertThat(CudaOptions.savePaceFromEnvironment("0")).isZero();
        assertThat(CudaOptions.savePaceFromEnvironment("2")).isEqualTo(2);
        assertThatThrownBy(() -> CudaOptions.savePaceFromEnvironment("65")).hasMessageContaining("PEGAFLOW_CUDA_SAVE_PACE=65");
    }

    @Test
    void savesOnTheKernelComeFromTheEnvironmentAsBlocks() {
        assertThat(CudaOptions.saveKernelBlocksFromEnvironment(null)).isZero();
        assertThat(CudaOptions.saveKernelBlocksFromEnvironment(" 32 ")).isEqualTo(32);
        assertThatThrownBy(() -> CudaOptions.saveKernelBlocksFromEnvironment("-4"))
                .hasMessageContaining("PEGAFLOW_CUDA_SAVE_KERNEL_BLOCKS=-4").hasMessageContaining("0 (saves through the copy engine)");
        assertThatThrownBy(() -> CudaOptions.saveKernelBlocksFromEnvironment("many"))
                .hasMessageContaining("PEGAFLOW_CUDA_SAVE_KERNEL_BLOCKS=many");
    }

    @Test
    void theBounceBufferComesFromTheEnvironmentInMib() {
        assertThat(CudaOptions.bounceFromEnvironment(null)).isEqualTo(16L << 20);
        assertThat(CudaOptions.defaults().bounceSlots()).isEqualTo(2);
        assertThat(CudaOptions.bounceFromEnvironment(" 8 ")).isEqualTo(8L << 20);
        assertThat(CudaOptions.bounceFromEnvironment("0")).isZero();
        assertThatThrownBy(() -> CudaOptions.bounceFromEnvironment("lots"))
                .hasMessageContaining("PEGAFLOW_CUDA_BOUNCE_MIB=lots").hasMessageContaining("0 (off) to 1024");
        assertThatThrownBy(() -> CudaOptions.bounceFromEnvironment("4096")).hasMessageContaining("=4096");
        assertThat(CudaOptions.bounceSlotsFromEnvironment(null)).isEqualTo(2);
        assertThat(CudaOptions.bounceSlotsFromEnvironment(" 8 ")).isEqualTo(8);
        assertThatThrownBy(() -> CudaOptions.bounceSlotsFromEnvironment("9"))
                .hasMessageContaining("PEGAFLOW_CUDA_BOUNCE_SLOTS=9").hasMessageContaining("2 to 8");
        assertThatThrownBy(() -> CudaOptions.bounceSlotsFromEnvironment("two")).hasMessageContaining("=two");
    }

    @Test
    void theLayerSplitComesFromTheEnvironmentAndIsCheckedWithItsName() {
        assertThat(LayerSplit.fromEnvironment(null, " ", null)).isEqualTo(LayerSplit.PER_LAYER);
        assertThat(CudaOptions.defaults().layerSplit()).isEqualTo(LayerSplit.PER_LAYER);
        assertThat(LayerSplit.fromEnvironment(" 256 ", "2", "264")).isEqualTo(new LayerSplit(256 << 10, 2, 264, true));
        assertThatThrownBy(() -> LayerSplit.fromEnvironment("four", null, null))
                .hasMessageContaining("PEGAFLOW_CUDA_LAYER_GROUP_KIB=four").hasMessageContaining("0 (one layer per group)");
        assertThatThrownBy(() -> LayerSplit.fromEnvironment(null, "17", null)).hasMessageContaining("PEGAFLOW_CUDA_LAYER_LANES=17")
                .hasMessageContaining("1 to 16");
        assertThatThrownBy(() -> new LayerSplit(0, 0, 0, false)).hasMessageContaining("layer lanes 0");
        assertThatThrownBy(() -> LayerSplit.fromEnvironment(null, null, "70000"))
                .hasMessageContaining("PEGAFLOW_CUDA_LAYER_KERNEL_BLOCKS=70000");
        assertThat(LayerSplit.fromEnvironment(null, null, null, " 1")).isEqualTo(LayerSplit.PER_LAYER);
        assertThat(LayerSplit.fromEnvironment(null, null, null, "0")).isEqualTo(new LayerSplit(0, 1, 32, false));
        assertThatThrownBy(() -> LayerSplit.fromEnvironment(null, null, null, "2"))
                .hasMessageContaining("PEGAFLOW_CUDA_LAYER_DMA=2").hasMessageContaining("0 (the copy kernel reads the pool)");
        assertThatThrownBy(() -> LayerSplit.fromEnvironment(null, null, null, "yes")).hasMessageContaining("=yes");
        assertThat(LayerSplit.fromEnvironment(null, null, null, null, " 128")).isEqualTo(LayerSplit.PER_LAYER.withLead(128L << 20));
        assertThat(LayerSplit.fromEnvironment(null, null, null, null, "16384").leadBytes()).isEqualTo(16L << 30);
        assertThatThrownBy(() -> LayerSplit.fromEnvironment(null, null, null, null, "16385"))
                .hasMessageContaining("PEGAFLOW_CUDA_LAYER_LEAD_MIB=16385").hasMessageContaining("0 (none) to 16384");
        assertThatThrownBy(() -> LayerSplit.PER_LAYER.withLead((16L << 30) + 1)).hasMessageContaining("expected 0 (none) to 16 GiB");
        assertThatThrownBy(() -> LayerSplit.PER_LAYER.withLead(-1)).hasMessageContaining("lead of -1 bytes");
        assertThat(LayerSplit.fromEnvironment(null, null, null, null, "64", " 1 "))
                .isEqualTo(LayerSplit.PER_LAYER.withLead(64L << 20).withLeadPaced(true));
        assertThat(LayerSplit.fromEnvironment(null, null, null, null, "64", "0").leadPaced()).isFalse();
        assertThatThrownBy(() -> LayerSplit.fromEnvironment(null, null, null, null, null, "on"))
                .hasMessageContaining("PEGAFLOW_CUDA_LAYER_LEAD_PACED=on").hasMessageContaining("0 (a held load's lead through the copy kernel)");
    }

    @Test
    void aHeldLoadsLeadIsItsFirstGroupsThatFitTogether() {
        CopyBatch batch = new CopyBatch(CopyBatch.Direction.TO_DEVICE, 8);
        for (int layer = 0; layer < 4; layer++) { // four layers of two 1 MiB pieces
            batch.add(layer * 8L << 20, layer * 2L << 20, 1 << 20);
            batch.add((layer * 8L + 4) << 20, (layer * 2L + 1) << 20, 1 << 20);
            batch.endGroup();
        }
        assertThat(LayerSplit.PER_LAYER.leadGroups(batch)).isZero();
        assertThat(LayerSplit.PER_LAYER.withLead((2 << 20) - 1).leadGroups(batch)).isZero();
        assertThat(LayerSplit.PER_LAYER.withLead(5L << 20).leadGroups(batch)).isEqualTo(2);
        assertThat(LayerSplit.PER_LAYER.withLead(8L << 20).leadGroups(batch)).isEqualTo(4);
        assertThat(LayerSplit.PER_LAYER.withLead(1L << 30).leadGroups(new CopyBatch(CopyBatch.Direction.TO_DEVICE, 1))).isZero();
    }
}
