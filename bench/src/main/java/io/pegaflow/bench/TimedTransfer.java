package io.pegaflow.bench;

import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.transfer.CopyBatch;
import io.pegaflow.engine.transfer.TransferEngine;
import io.pegaflow.engine.transfer.TransferFuture;

/**
 * A copy engine that records when each batch is submitted and when its copy completes, into
 * the run's {@link Timeline}: the server-mode worker's copies, placed among its calls to the
 * server. Everything else goes to {@code delegate}.
 */
record TimedTransfer(TransferEngine delegate, Timeline timeline) implements TransferEngine {
    @Override
    public TransferFuture submit(CopyBatch batch) {
        timeline.add("submit", batch.totalBytes());
        // recorded before anything that waits on the copy runs (the store's end, the caller)
        return TransferFuture.following(delegate.submit(batch), () -> timeline.add("done", 0));
    }

    @Override
    public void checkRegion(LayerRegion region) {
        delegate.checkRegion(region);
    }

    @Override
    public void checkRegions(java.util.List<LayerRegion> regions) {
        delegate.checkRegions(regions);
    }

    @Override
    public String name() {
        return delegate.name();
    }

    @Override
    public void close() {
        delegate.close();
    }
}
