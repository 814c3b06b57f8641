package io.pegaflow.engine;

import io.pegaflow.engine.transfer.CopyBatch;
import io.pegaflow.engine.transfer.HostTransferEngine;
import io.pegaflow.engine.transfer.TransferEngine;
import io.pegaflow.engine.transfer.TransferFuture;
import java.util.concurrent.CompletableFuture;
import java.util.function.Supplier;

/** Host copies that complete once the gate current at submit has (and the copy has): a test holds a copy in flight. */
record GatedTransfer(HostTransferEngine delegate, Supplier<CompletableFuture<Void>> gate) implements TransferEngine {
    @Override
    public TransferFuture submit(CopyBatch batch) {
        return TransferFuture.following(CompletableFuture.allOf(delegate.submit(batch), gate.get()), () -> { });
    }

    @Override
    public String name() {
        return "gated";
    }

    @Override
    public void close() {
        delegate.close();
    }
}
