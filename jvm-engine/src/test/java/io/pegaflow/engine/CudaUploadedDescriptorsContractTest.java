package io.pegaflow.engine;

import io.pegaflow.engine.cuda.CudaOptions;
import io.pegaflow.engine.cuda.CudaTransferEngine;
import org.junit.jupiter.api.Tag;

/** The contract again with descriptors uploaded to device memory before each launch (the non-default mode). */
@Tag("gpu")
class CudaUploadedDescriptorsContractTest extends CudaTransferContractTest {
    @Override
    EngineConfig.Builder config() {
        return EngineConfig.builder().transfer(pool ->
                CudaTransferEngine.create(pool, CudaOptions.defaults().withHostDescriptors(false)));
    }
}
