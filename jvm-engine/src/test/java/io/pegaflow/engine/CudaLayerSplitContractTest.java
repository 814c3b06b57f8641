package io.pegaflow.engine;

import io.pegaflow.engine.cuda.CudaOptions;
import io.pegaflow.engine.cuda.CudaTransferEngine;
import io.pegaflow.engine.transfer.LayerSplit;
import org.junit.jupiter.api.Tag;

/**
 * The copy-engine contract with layer-wise loads dealt over two lanes and each kernel launch
 * of them capped at 8 thread blocks ({@link LayerSplit}): the grid-strided kernel still moves
 * every piece. GPU machine only: {@code -Dgroups=gpu}.
 */
@Tag("gpu")
class CudaLayerSplitContractTest extends TransferContract {
    @Override
    DeviceMemory memory() {
        return new CudaMemory(0);
    }

    @Override
    EngineConfig.Builder config() {
        return EngineConfig.builder().transfer(pool -> CudaTransferEngine.create(pool,
                CudaOptions.defaults().withLayerSplit(new LayerSplit(0, 2, 8))));
    }
}
