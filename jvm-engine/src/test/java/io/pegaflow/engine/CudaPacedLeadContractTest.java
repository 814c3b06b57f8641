package io.pegaflow.engine;

import io.pegaflow.engine.cuda.CudaOptions;
import io.pegaflow.engine.transfer.LayerSplit;
import org.junit.jupiter.api.Tag;

/**
 * The copy-engine contract with the whole of every held load led through the copy engine, a
 * layer at a time ({@code PEGAFLOW_CUDA_LAYER_LEAD_MIB=16384}, {@code
 * PEGAFLOW_CUDA_LAYER_LEAD_PACED=1}): a staged load then scatters before its hold opens.
 * GPU machine only: {@code -Dgroups=gpu}.
 */
@Tag("gpu")
class CudaPacedLeadContractTest extends CudaTransferContractTest {
    @Override
    CudaOptions options() {
        return CudaOptions.defaults().withLayerSplit(LayerSplit.PER_LAYER.withLead(16L << 30).withLeadPaced(true));
    }
}
