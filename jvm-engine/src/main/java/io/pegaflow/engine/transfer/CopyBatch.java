package io.pegaflow.engine.transfer;

import java.util.Arrays;

/**
 * One batch of copies between registered KV regions ("device" side: GPU memory, or host
 * memory in embedded CPU mode) and the host pool ("host" side, given as an offset into the
 * pool). All descriptors of a batch go the same {@link Direction}. Descriptors are kept in
 * the order added; implementations may merge neighbours that are contiguous on both sides.
 *
 * <p>Filled by one thread, then handed to {@link TransferEngine#submit}; not thread-safe.
 */
public final class CopyBatch {
    /** Which way the bytes move. */
    public enum Direction {
        /** Save: registered region to host pool. */
        TO_HOST,
        /** Load: host pool to registered region. */
        TO_DEVICE
    }

    private final Direction direction;
    private long waitStream;
    private java.util.concurrent.CompletableFuture<?> gate;
    private StagedLoad stage;
    private int[] groupEnds = new int[0];
    /** Piece i at [3i, 3i+3): device address, host offset, length (one array: one allocation, and a piece's three words together). */
    private long[] pieces;
    private int size;
    private long totalBytes;

    public CopyBatch(Direction direction, int expectedPieces) {
        this.direction = direction;
        pieces = PieceArrays.take(3 * Math.max(4, expectedPieces));
    }

    /** Adds one piece. {@code bytes} must be positive. */
    public void add(long device, long hostOff, long bytes) {
        if (bytes <= 0) {
            throw new IllegalArgumentException("copy piece of " + bytes + " bytes; expected > 0");
        }
        int at = 3 * size;
        if (at + 3 > pieces.length) { // a kept array's length is a power of two, not a multiple of three
            long[] grown = PieceArrays.take(2 * at + 3);
            System.arraycopy(pieces, 0, grown, 0, at);
            PieceArrays.give(pieces);
            pieces = grown;
        }
        pieces[at] = device;
        pieces[at + 1] = hostOff;
        pieces[at + 2] = bytes;
        size++;
        totalBytes += bytes;
    }

    public Direction direction() {
        return direction;
    }

    /**
     * Once the batch's copies ended (its {@link TransferEngine#submit} future completed either
     * way, or it was never submitted): a large batch's piece array goes back to {@link
     * PieceArrays} for the next batch, and this batch can no longer be read (its pieces throw
     * {@link NullPointerException}; its size, groups and bytes stay). A batch too small for
     * the pool keeps its array and stays readable. Again: no effect.
     */
    public void release() {
        long[] p = pieces;
        if (p != null && PieceArrays.kept(p.length)) {
            pieces = null;
            PieceArrays.give(p);
        }
    }

    /**
     * Orders the copy after work already queued on a CUDA stream (a {@code CUstream}, 0 =
     * none): a save must not read device memory before the kernels that write it finish.
     * The GPU engine records an event on that stream when the batch is submitted.
     */
    public CopyBatch waitFor(long stream) {
        this.waitStream = stream;
        return this;
    }

    public long waitStream() {
        return waitStream;
    }

    /**
     * Holds the batch's copies until {@code opened} completes (either way): the engine plans
     * and takes a lane at submit, and queues nothing before (a GPU engine may queue a
     * layer-wise load's first layers, {@link LayerSplit#leadBytes}). A load started where vLLM
     * allocates its blocks waits so for the step, whose input copies would otherwise queue on
     * the copy engine behind the whole load (docs/gpu.md, "Loads started at allocation").
     * Null (the default): no hold.
     */
    public CopyBatch holdUntil(java.util.concurrent.CompletableFuture<?> opened) {
        this.gate = opened;
        return this;
    }

    /** Completes (normally) once the batch may be copied: at once without a hold, else when the hold completes either way. */
    public java.util.concurrent.CompletableFuture<?> opened() {
        return gate == null ? java.util.concurrent.CompletableFuture.completedFuture(null) : gate.handle((v, e) -> null);
    }

    /**
     * A layer-wise load whose pool side is staged ({@link Stager}, claimed for this batch):
     * the engine that staged it reads each piece from its staging buffer, where the piece's
     * pool offset places it ({@link StageLayout.Cursor}), not from the pool. Null: from the pool.
     */
    public CopyBatch fromStage(StagedLoad staged) {
        this.stage = staged;
        return this;
    }

    /** See {@link #fromStage}. */
    public StagedLoad stage() {
        return stage;
    }

    /** Whether the batch is held ({@link #holdUntil}). */
    public boolean held() {
        return gate != null;
    }

    /** Whether the batch may be copied now: no hold, or its hold completed ({@link #holdUntil}). */
    public boolean gateOpen() {
        return gate == null || gate.isDone();
    }

    /** Blocks the calling thread until the batch may be copied ({@link #holdUntil}). */
    public void awaitGate() {
        opened().join();
    }

    /**
     * Closes the current group (the pieces added since the previous call, e.g. one layer);
     * {@link TransferFuture#awaitGroup} can then wait for it alone. Pieces after the last
     * call form a final group.
     */
    public void endGroup() {
        int end = size;
        if (groupEnds.length > 0 && groupEnds[groupEnds.length - 1] == end) {
            return;
        }
        groupEnds = Arrays.copyOf(groupEnds, groupEnds.length + 1);
        groupEnds[groupEnds.length - 1] = end;
    }

    /** Number of groups (at least 1 when the batch is not empty). */
    public int groupCount() {
        int closed = groupEnds.length;
        boolean open = closed == 0 ? size > 0 : groupEnds[closed - 1] < size;
        return closed + (open ? 1 : 0);
    }

    /** First piece index of group {@code g}. */
    public int groupStart(int g) {
        return g == 0 ? 0 : groupEnds[g - 1];
    }

    /** One past the last piece index of group {@code g}. */
    public int groupEnd(int g) {
        return g < groupEnds.length ? groupEnds[g] : size;
    }

    public int size() {
        return size;
    }

    public long totalBytes() {
        return totalBytes;
    }

    public long deviceAddress(int i) {
        checkIndex(i);
        return pieces[3 * i];
    }

    public long hostOffset(int i) {
        checkIndex(i);
        return pieces[3 * i + 1];
    }

    public long length(int i) {
        checkIndex(i);
        return pieces[3 * i + 2];
    }

    private void checkIndex(int i) {
        if (i >= size) { // the array's spare capacity holds no pieces; below 0 the array itself throws
            throw new IndexOutOfBoundsException("piece " + i + " of a batch of " + size);
        }
    }

    /**
     * Number of ranges after merging descriptors that continue the previous one on both sides
     * (what a copy engine actually issues).
     */
    public int coalescedRanges() {
        int ranges = 0;
        for (int i = 0; i < size; i++) {
            if (i == 0 || !continuesPrevious(i)) {
                ranges++;
            }
        }
        return ranges;
    }

    /**
     * One past the last piece of the run starting at piece {@code i}: the pieces from {@code i}
     * that each continue the previous one on both sides ({@link #continuesPrevious}), stopping
     * before {@code end}. A copy engine moves {@code [i, runEnd)} as one range of
     * {@link #runBytes} bytes.
     */
    public int runEnd(int i, int end) {
        int j = i + 1;
        while (j < end && continuesPrevious(j)) {
            j++;
        }
        return j;
    }

    /** Bytes of pieces {@code [i, j)} of one run ({@link #runEnd}): back to back, so first start to last end. */
    public long runBytes(int i, int j) {
        return hostOffset(j - 1) + length(j - 1) - hostOffset(i);
    }

    /** True when piece {@code i} starts where piece {@code i-1} ends, on both sides. */
    public boolean continuesPrevious(int i) {
        if (i <= 0) {
            return false;
        }
        checkIndex(i);
        int p = 3 * (i - 1);
        return pieces[p] + pieces[p + 2] == pieces[p + 3] && pieces[p + 1] + pieces[p + 2] == pieces[p + 4];
    }
}
