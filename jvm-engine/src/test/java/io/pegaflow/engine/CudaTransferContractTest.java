package io.pegaflow.engine;

import static org.assertj.core.api.Assertions.assertThat;

import io.pegaflow.engine.cuda.CudaOptions;
import io.pegaflow.engine.cuda.CudaTransferEngine;
import java.util.concurrent.CompletableFuture;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

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

    /**
     * A staged load whose groups are past twice the device stager's tail (a layer's K and V pieces of
     * 40 blocks, 512 KiB each: 40 MiB), paced while its hold is shut, so each group is queued behind the
     * tail of the one before rather than its landing (DeviceStager.splitTail): every layer
     * still lands byte-exact, each where its own wait returns.
     */
    @Test
    void aPacedStagingsGroupsQueuedBehindTheTailBeforeLandByteExact() throws Exception {
        withStagedLookup(KvWorld.Kind.SPLIT_KFIRST, 40, 4, 512 << 10, "512mb", 83, (engine, world, stager, q, src, dst, hashes) -> {
            CompletableFuture<Void> hold = new CompletableFuture<>();
            LayeredLoad load = engine.loadLayered("inst", 0, q.lease(), dst, hold);
            assertThat(load.fromStage()).as("the load reads its staging").isTrue();
            long end = System.nanoTime() + 10_000_000_000L;
            while (stager.startTimes()[6] < 3 && System.nanoTime() < end) {
                Thread.sleep(1); // the staging paces its groups (one a layer: four) while the hold is shut
            }
            assertThat(stager.startTimes()[6]).as("groups queued paced behind the one before").isGreaterThanOrEqualTo(3);
            hold.complete(null);
            awaitEveryLayerAndCheck(load, world, 4, src, dst, hashes);
            assertThat(stager.startTimes()[8]).as("of them, queued while the one before still moved its tail").isPositive();
        });
    }

    /** The engine's options (subclasses run the contract with others). */
    CudaOptions options() {
        return CudaOptions.defaults();
    }
}
