package io.pegaflow.engine;

import io.pegaflow.engine.cuda.CudaOptions;
import io.pegaflow.engine.transfer.LayerSplit;
import org.junit.jupiter.api.Tag;

/**
 * The copy-engine contract with layer-wise loads dealt over two lanes, read from the pool by
 * the copy kernel, each launch capped at 8 thread blocks ({@link LayerSplit}): the
 * grid-strided kernel still moves every piece. GPU machine only: {@code -Dgroups=gpu}.
 */
@Tag("gpu")
class CudaLayerSplitContractTest extends CudaTransferContractTest {
    @Override
    CudaOptions options() {
        return CudaOptions.defaults().withLayerSplit(new LayerSplit(0, 2, 8, false));
    }
}
