package io.pegaflow.engine;

import io.pegaflow.engine.transfer.CopyBatch;
import io.pegaflow.engine.transfer.LayerSplit;
import io.pegaflow.engine.transfer.StageLayout;
import io.pegaflow.engine.transfer.StagedLoad;
import io.pegaflow.engine.transfer.TransferEngine;
import io.pegaflow.engine.transfer.TransferFuture;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;

/**
 * Turns a control plane's {@link CopyPlan} into the copy engine's batches: plain (a run's
 * regions, segment by segment) or layer-wise for a load whose compute waits layer by layer
 * ({@link LayeredLoad}: groups of layers, dealt over lanes as the copy engine's
 * {@link LayerSplit} asks). Stateless; {@link PegaEngine} owns what the copies are for.
 */
final class CopyBatches {
    private CopyBatches() {}

    /**
     * Starts the copy of one plan (or part of one); the future holds the bytes moved. With
     * {@code layered}, the pieces go region by region, each region a group of the batch.
     */
    static CompletableFuture<Long> copy(TransferEngine transfer, CopyPlan plan, LayerRegion[] worker, long[] blockIds, long waitStream,
            LayeredLoad layered) {
        if (layered != null) {
            return copyLayered(transfer, plan, worker, blockIds, waitStream, layered);
        }
        CopyBatch batch = new CopyBatch(plan.direction().batch(), (int) Math.min(1 << 20, plan.slots() * 2))
                .waitFor(waitStream);
        for (int j = 0; j < plan.runs(); j++) {
            checkRun(plan, j, worker, blockIds);
            int first = plan.runRegion()[j];
            int count = plan.runCount()[j];
            long blockId = blockIds[plan.runBlock()[j]];
            long host = plan.runOffset()[j];
            for (int r = first; r < first + count; r++) {
                LayerRegion region = worker[r];
                for (int s = 0; s < region.segments(); s++) {
                    batch.add(region.pieceAddress(blockId, s), host + s * region.segmentBytes(), region.segmentBytes());
                }
                host += region.slotBytes();
            }
        }
        long bytes = batch.totalBytes();
        // an engine reads a batch only until its future completes (TransferEngine): then the
        // batch's piece array goes back for the next one, before anyone waiting hears
        return transfer.submit(batch).whenComplete((v, e) -> batch.release()).thenApply(v -> bytes);
    }

    /**
     * A layered part: its layer groups ({@link #layerMajor}) dealt round-robin over the copy
     * engine's {@link LayerSplit#lanes()} batches, each submitted on its own (a lane each), so
     * one layer's copy need not wait for the previous layer's tail on one stream. A batch that
     * cannot be submitted fails the part after the batches already submitted have finished
     * (the plan is rolled back only once nothing reads or writes its slots).
     */
    private static CompletableFuture<Long> copyLayered(TransferEngine transfer, CopyPlan plan, LayerRegion[] worker, long[] blockIds, long waitStream,
            LayeredLoad layered) {
        LayerSplit split = transfer.layerSplit();
        StagedLoad staged = layered.staged;
        // a staged load goes in one batch: its staging holds the groups in the plan's order
        int lanes = staged != null ? 1 : Math.max(1, Math.min(split.lanes(), worker.length));
        List<TransferFuture> submitted = new ArrayList<>(lanes);
        List<CompletableFuture<Void>> ended = new ArrayList<>(lanes);
        long[] bytes = new long[lanes];
        try {
            for (int k = 0; k < lanes; k++) {
                long t0 = System.nanoTime();
                CopyBatch batch = new CopyBatch(plan.direction().batch(),
                        (int) Math.min(1 << 20, plan.slots() * 2 / lanes + 16)).waitFor(waitStream).holdUntil(layered.gate)
                        .fromStage(staged);
                int[] groups = layerMajor(plan, worker, blockIds, batch, split.groupBytes(), k, lanes);
                long t1 = System.nanoTime();
                layered.built(t1 - t0);
                if (batch.size() == 0) {
                    batch.release();
                    continue;
                }
                bytes[k] = batch.totalBytes();
                TransferFuture part = transfer.submit(batch);
                layered.submitted(System.nanoTime() - t1);
                submitted.add(part);
                ended.add(part.whenComplete((v, e) -> {
                    batch.release(); // as in copy
                    if (staged != null) {
                        staged.finish(); // nothing reads the staging buffer any more
                    }
                }));
                layered.add(part, groups);
            }
            if (staged != null && submitted.isEmpty()) {
                staged.finish();
            }
        } catch (RuntimeException | Error e) {
            // nothing submitted: PegaEngine.submit ends the staging with the load it failed
            for (TransferFuture f : submitted) {
                try {
                    f.join();
                } catch (RuntimeException ignored) {
                    // failing anyway
                }
            }
            throw e;
        }
        long total = java.util.Arrays.stream(bytes).sum();
        return CompletableFuture.allOf(ended.toArray(CompletableFuture[]::new)).thenApply(v -> total);
    }

    /**
     * Fills {@code batch} with the plan's pieces layer-group by layer-group, closing a group of
     * the batch after each: consecutive regions join one group until each block's slots of
     * the group reach {@code groupBytes} (0: one region per group), and within a group the
     * pieces go block by block, so a block's slots of the group stay one stretch of the pool
     * (what the CUDA engine's bounce path moves at the line). Of the groups, in order, only
     * those whose ordinal is {@code lane} modulo {@code lanes} go into this batch. Returns each
     * region's group index in this batch (-1: no pieces of this batch).
     */
    static int[] layerMajor(CopyPlan plan, LayerRegion[] worker, long[] blockIds, CopyBatch batch, long groupBytes,
            int lane, int lanes) {
        long[] before = slotStarts(worker);
        for (int j = 0; j < plan.runs(); j++) {
            checkRun(plan, j, worker, blockIds);
        }
        int[] groups = new int[worker.length];
        java.util.Arrays.fill(groups, -1);
        int next = 0; // groups in this batch
        int ordinal = 0; // groups of the plan
        for (int[] range : layerGroups(plan, worker, groupBytes)) {
            int from = range[0];
            int to = range[1];
            if (ordinal++ % lanes != lane) {
                continue;
            }
            int start = batch.size();
            for (int j = 0; j < plan.runs(); j++) {
                int first = plan.runRegion()[j];
                int lo = Math.max(from, first);
                int hi = Math.min(to, first + plan.runCount()[j]);
                long blockId = blockIds[plan.runBlock()[j]];
                for (int r = lo; r < hi; r++) {
                    LayerRegion region = worker[r];
                    long host = plan.runOffset()[j] + before[r] - before[first];
                    for (int s = 0; s < region.segments(); s++) {
                        batch.add(region.pieceAddress(blockId, s), host + s * region.segmentBytes(), region.segmentBytes());
                    }
                }
            }
            if (batch.size() > start) {
                batch.endGroup();
                java.util.Arrays.fill(groups, from, to, next++);
            }
        }
        return groups;
    }

    /** Pool offset of each region's slot within a block's run of slots; the last entry is the run's bytes. */
    private static long[] slotStarts(LayerRegion[] worker) {
        long[] before = new long[worker.length + 1];
        for (int r = 0; r < worker.length; r++) {
            before[r + 1] = before[r] + worker[r].slotBytes();
        }
        return before;
    }

    /**
     * The plan's layer groups as {@code [from, to)} region ranges, in order: consecutive
     * regions some run covers join one group until each block's slots of the group reach
     * {@code groupBytes} (0: one region per group). {@link #layerMajor} and {@link
     * #stageLayout} cut a load the same way.
     */
    private static List<int[]> layerGroups(CopyPlan plan, LayerRegion[] worker, long groupBytes) {
        boolean[] used = new boolean[worker.length];
        for (int j = 0; j < plan.runs(); j++) {
            java.util.Arrays.fill(used, plan.runRegion()[j], plan.runRegion()[j] + plan.runCount()[j], true);
        }
        List<int[]> out = new ArrayList<>();
        int from = 0;
        while (from < worker.length) {
            if (!used[from]) {
                from++;
                continue;
            }
            int to = from + 1;
            long stretch = worker[from].slotBytes();
            while (to < worker.length && used[to] && stretch < groupBytes) {
                stretch += worker[to].slotBytes();
                to++;
            }
            out.add(new int[] {from, to});
            from = to;
        }
        return out;
    }

    /**
     * Bytes of the pool a load of {@code plan} reads for {@code worker}: each run's slots of the
     * worker's regions, as {@link #stageLayout} stages them. Refuses a run outside the worker's
     * regions.
     */
    static long stageBytes(CopyPlan plan, LayerRegion[] worker) {
        long[] before = slotStarts(worker);
        long bytes = 0;
        for (int j = 0; j < plan.runs(); j++) {
            int first = plan.runRegion()[j];
            int count = plan.runCount()[j];
            if (first < 0 || count < 1 || first + count > worker.length) {
                throw new InvalidArgumentException("copy plan run " + j + " covers regions " + first + ".."
                        + (first + count - 1) + " of a worker with " + worker.length);
            }
            bytes += before[first + count] - before[first];
        }
        return bytes;
    }

    /**
     * Where a layer-wise load of {@code plan} for {@code worker} stages its pool side: per layer
     * group ({@link #layerGroups}, all in one batch), each run's slots of the group as one
     * stretch, in run order, the order {@link #layerMajor} lists the group's pieces in. Needs
     * no destination: the staging starts before the blocks are allocated. Laid a group at a time
     * ({@link StageLayout#lazy}) as the staging thread queues them, {@link #stageBytes} in all.
     */
    static StageLayout stageLayout(CopyPlan plan, LayerRegion[] worker, long groupBytes) {
        long[] before = slotStarts(worker);
        List<int[]> groups = layerGroups(plan, worker, groupBytes);
        return StageLayout.lazy(groups.size(), plan.runs() * groups.size(), stageBytes(plan, worker), (g, host, len, at) -> {
            int from = groups.get(g)[0];
            int to = groups.get(g)[1];
            int k = at;
            for (int j = 0; j < plan.runs(); j++) {
                int first = plan.runRegion()[j];
                int lo = Math.max(from, first);
                int hi = Math.min(to, first + plan.runCount()[j]);
                if (lo < hi) {
                    host[k] = plan.runOffset()[j] + before[lo] - before[first];
                    len[k] = before[hi] - before[lo];
                    k++;
                }
            }
            return k;
        });
    }

    /** The caller's block ids a save plan writes, each once, in plan order. */
    static long[] distinctBlocks(CopyPlan plan, long[] blockIds) {
        long[] ids = new long[plan.blocks()];
        int last = -1;
        int n = 0;
        for (int j = 0; j < plan.runs() && n < ids.length; j++) {
            if (plan.runBlock()[j] != last) {
                last = plan.runBlock()[j];
                ids[n++] = blockIds[last];
            }
        }
        return ids;
    }

    /** Refuses run {@code j} of {@code plan} when its regions or its block fall outside the worker's. */
    private static void checkRun(CopyPlan plan, int j, LayerRegion[] worker, long[] blockIds) {
        int first = plan.runRegion()[j];
        int count = plan.runCount()[j];
        if (first < 0 || count < 1 || first + count > worker.length) {
            throw new InvalidArgumentException("copy plan run " + j + " covers regions " + first + ".."
                    + (first + count - 1) + " of a worker with " + worker.length);
        }
        int index = plan.runBlock()[j];
        if (index < 0 || index >= blockIds.length) {
            throw new InvalidArgumentException("copy plan run " + j + " is for block " + index + " of "
                    + blockIds.length);
        }
    }
}
