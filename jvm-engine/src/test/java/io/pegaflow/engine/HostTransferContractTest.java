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
}
