package io.pegaflow.engine;

import io.pegaflow.engine.cuda.CudaOptions;
import org.junit.jupiter.api.Tag;

/** The contract again with descriptors uploaded to device memory before each launch (the non-default mode). */
@Tag("gpu")
class CudaUploadedDescriptorsContractTest extends CudaTransferContractTest {
    @Override
    CudaOptions options() {
        return CudaOptions.defaults().withHostDescriptors(false);
    }
}
