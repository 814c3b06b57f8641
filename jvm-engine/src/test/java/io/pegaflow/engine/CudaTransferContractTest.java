package io.pegaflow.engine;

import io.pegaflow.engine.cuda.CudaOptions;
import io.pegaflow.engine.cuda.CudaTransferEngine;
import org.junit.jupiter.api.Tag;

/**
 * The copy-engine contract on GPU memory with the CUDA engine (pinned pool, gather kernel,
 * several lanes). GPU machine only: {@code -Dgroups=gpu}.
 */
@Tag("gpu")
class CudaTransferContractTest extends TransferContract {
    @Override
    DeviceMemory memory() {
        return new CudaMemory(0);
    }

    @Override
    EngineConfig.Builder config() {
        return EngineConfig.builder().transfer(pool -> CudaTransferEngine.create(pool, options()));
    }

    @Override
    EngineConfig.Builder stagedConfig(long stageBytes, java.util.concurrent.atomic.AtomicReference<io.pegaflow.engine.transfer.TransferEngine> made) {
        return EngineConfig.builder().transfer(pool -> {
            io.pegaflow.engine.transfer.TransferEngine t = CudaTransferEngine.create(pool, options().withStage(stageBytes));
            made.set(t);
            return t;
        });
    }

    @Override
    boolean queuesOnDevice() {
        return true;
    }

    /** The engine's options (subclasses run the contract with others). */
    CudaOptions options() {
        return CudaOptions.defaults();
    }
}
