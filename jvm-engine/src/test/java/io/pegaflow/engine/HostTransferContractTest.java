package io.pegaflow.engine;

/** The copy-engine contract on host memory with the host memcpy engine. */
class HostTransferContractTest extends TransferContract {
    @Override
    DeviceMemory memory() {
        return DeviceMemory.host();
    }

    @Override
    EngineConfig.Builder config() {
        return EngineConfig.builder();
    }

    @Override
    EngineConfig.Builder stagedConfig(long stageBytes, java.util.concurrent.atomic.AtomicReference<io.pegaflow.engine.transfer.TransferEngine> made) {
        return EngineConfig.builder().transfer(pool -> {
            io.pegaflow.engine.transfer.TransferEngine t = new io.pegaflow.engine.transfer.HostTransferEngine(pool, 2, stageBytes);
            made.set(t);
            return t;
        });
    }
}
