package io.pegaflow.engine;

import io.pegaflow.engine.cuda.CudaOptions;
import io.pegaflow.engine.transfer.LayerSplit;
import org.junit.jupiter.api.Tag;

/**
 * The copy-engine contract with every layer of a layer-wise load moved through the copy
 * engine ({@link LayerSplit#copyEngine()}) into a bounce buffer of two 1 MiB slots, so a
 * layer's pieces turn the slots over several times and each layer's event is recorded after
 * its scatters on the lane's second stream. GPU machine only: {@code -Dgroups=gpu}.
 */
@Tag("gpu")
class CudaLayerDmaContractTest extends CudaTransferContractTest {
    @Override
    CudaOptions options() {
        return CudaOptions.defaults().withBounce(2L << 20, 2).withLayerSplit(new LayerSplit(0, 1, 32, true));
    }
}
