package io.pegaflow.engine;

import io.pegaflow.engine.cuda.CudaOptions;
import org.junit.jupiter.api.Tag;

/**
 * The contract again with saves on the copy kernel alone, 16 thread blocks a launch
 * ({@link CudaOptions#saveKernelBlocks}): no bounce buffer and no copy engine on the way to the
 * pool, every byte still where the contract expects it.
 */
@Tag("gpu")
class CudaSaveKernelContractTest extends CudaTransferContractTest {
    @Override
    CudaOptions options() {
        return CudaOptions.defaults().withSaveKernelBlocks(16);
    }
}
