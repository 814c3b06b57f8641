package io.pegaflow.engine.transfer;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import org.junit.jupiter.api.Test;

/**
 * {@link PieceArrays} and {@link CopyBatch#release}: a large batch's array goes back and the
 * next batch takes it, with none of the old pieces readable; small batches keep theirs; what is
 * kept stays within its bounds.
 */
class PieceArraysTest {
    /** Pieces whose three longs just pass the smallest kept length, so the array is kept (16,384 longs). */
    private static final int LARGE = PieceArrays.MIN_LONGS / 3 + 1;

    @Test
    void aReleasedBatchsArrayGoesToTheNextBatchAndTheOldOneCannotBeRead() {
        CopyBatch first = filled(LARGE, 1_000);
        long reused = PieceArrays.reused();
        first.release();
        assertThat(first.size()).as("size and bytes stay").isEqualTo(LARGE);
        assertThat(first.totalBytes()).isEqualTo(sum(LARGE));
        assertThatThrownBy(() -> first.deviceAddress(0)).as("its pieces went with the array")
                .isInstanceOf(NullPointerException.class);
        first.release(); // again: nothing

        CopyBatch next = new CopyBatch(CopyBatch.Direction.TO_DEVICE, LARGE);
        assertThat(PieceArrays.reused() - reused).as("the next batch took the kept array").isEqualTo(1);
        assertThat(next.size()).isZero();
        assertThat(next.coalescedRanges()).as("the old pieces are past its size, never read").isZero();
        next.add(7, 8, 9);
        assertThat(next.deviceAddress(0)).isEqualTo(7);
        assertThatThrownBy(() -> next.deviceAddress(1)).isInstanceOf(IndexOutOfBoundsException.class);
        next.release();
    }

    @Test
    void aSmallBatchKeepsItsArrayAndStaysReadable() {
        CopyBatch small = filled(16, 0);
        long kept = PieceArrays.keptBytes();
        small.release();
        assertThat(PieceArrays.keptBytes()).isEqualTo(kept);
        assertThat(small.deviceAddress(15)).isEqualTo(15);
        assertThat(small.length(15)).isEqualTo(16);
    }

    /** A kept array's length is a power of two, not a multiple of three: a batch growing past it keeps every piece. */
    @Test
    void aBatchGrowsPastItsKeptArrayWithEveryPiece() {
        int pieces = 3 * LARGE + 5; // past the 16,384 longs its expected size was given
        CopyBatch b = new CopyBatch(CopyBatch.Direction.TO_HOST, LARGE);
        for (int i = 0; i < pieces; i++) {
            b.add(i, 10L * i, i + 1);
        }
        assertThat(b.size()).isEqualTo(pieces);
        for (int i = 0; i < pieces; i++) {
            assertThat(b.deviceAddress(i)).isEqualTo(i);
            assertThat(b.hostOffset(i)).isEqualTo(10L * i);
            assertThat(b.length(i)).isEqualTo(i + 1);
        }
        assertThat(b.totalBytes()).isEqualTo(sum(pieces));
        b.release();
    }

    @Test
    void whatIsKeptStaysWithinItsBounds() {
        int longs = 1 << 20; // 8 MiB: a length no other test keeps
        long before = PieceArrays.keptBytes();
        for (int i = 0; i < PieceArrays.PER_LENGTH + 3; i++) {
            PieceArrays.give(new long[longs]);
        }
        assertThat(PieceArrays.keptBytes() - before).as("%d arrays of one length at most", PieceArrays.PER_LENGTH)
                .isEqualTo(8L * longs * PieceArrays.PER_LENGTH);
        for (int i = 0; i < 3; i++) {
            PieceArrays.give(new long[PieceArrays.MAX_LONGS]); // 32 MiB each
        }
        assertThat(PieceArrays.keptBytes()).as("%d bytes in all at most", PieceArrays.MAX_KEPT_BYTES)
                .isLessThanOrEqualTo(PieceArrays.MAX_KEPT_BYTES);
        long kept = PieceArrays.keptBytes();
        PieceArrays.give(new long[PieceArrays.MIN_LONGS + 3]); // not a power of two: never kept
        PieceArrays.give(new long[PieceArrays.MIN_LONGS / 2]); // too small
        PieceArrays.give(new long[2 * PieceArrays.MAX_LONGS]); // too large
        assertThat(PieceArrays.keptBytes()).isEqualTo(kept);
        for (int size : new int[] {longs, PieceArrays.MAX_LONGS}) { // hand them out again, for the other tests
            for (int i = 0; i < PieceArrays.PER_LENGTH; i++) {
                PieceArrays.take(size);
            }
        }
    }

    private static CopyBatch filled(int pieces, long base) {
        CopyBatch b = new CopyBatch(CopyBatch.Direction.TO_DEVICE, pieces);
        for (int i = 0; i < pieces; i++) {
            b.add(base + i, base + 100L * i, i + 1);
        }
        return b;
    }

    private static long sum(int pieces) {
        return (long) pieces * (pieces + 1) / 2;
    }
}
