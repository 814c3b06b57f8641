package io.pegaflow.engine.cuda;

import static org.assertj.core.api.Assertions.assertThat;

import org.junit.jupiter.api.Test;

/** {@link CopyLane#stridedRows}: which pool stretches of a bounce slot go as one pitched copy. No GPU. */
class StridedRowsTest {
    private static final long K64 = 64 << 10;
    private static final long M2 = 2 << 20;
    private static final long ROOM = 1L << 30;

    /** Stretches of {@code len} bytes at host {@code base + i * stride}, back to back in the slot. */
    private static long[][] stretches(int n, long base, long stride, long len) {
        long[] host = new long[n];
        long[] bounce = new long[n];
        long[] lens = new long[n];
        for (int i = 0; i < n; i++) {
            host[i] = base + i * stride;
            bounce[i] = 1_000_000 + i * len;
            lens[i] = len;
        }
        return new long[][] {host, bounce, lens};
    }

    @Test
    void oneLayerOfConsecutiveBlocksIsOneCopy() {
        long[][] s = stretches(128, 4096, M2, K64);
        assertThat(CopyLane.stridedRows(s[0], s[1], s[2], 0, 128, ROOM)).isEqualTo(128);
        assertThat(CopyLane.stridedRows(s[0], s[1], s[2], 100, 128, ROOM)).as("from the middle").isEqualTo(28);
    }

    @Test
    void rowsStopAtTheEndOfThePinnedChunk() {
        long[][] s = stretches(16, 0, M2, K64);
        // room for rows whose end lies within 5 * 2 MiB of the first row's start: rows 0..4
        assertThat(CopyLane.stridedRows(s[0], s[1], s[2], 0, 16, 4 * M2 + K64)).isEqualTo(5);
        assertThat(CopyLane.stridedRows(s[0], s[1], s[2], 0, 16, 4 * M2 + K64 - 1)).isEqualTo(4);
        assertThat(CopyLane.stridedRows(s[0], s[1], s[2], 0, 16, K64)).as("only the first fits").isEqualTo(1);
    }

    @Test
    void aBrokenPatternEndsTheRun() {
        long[][] s = stretches(8, 0, M2, K64);
        s[0][5] += 4096; // block 5 elsewhere in the pool
        assertThat(CopyLane.stridedRows(s[0], s[1], s[2], 0, 8, ROOM)).isEqualTo(5);
        s = stretches(8, 0, M2, K64);
        s[2][3] = K64 / 2; // a shorter stretch
        assertThat(CopyLane.stridedRows(s[0], s[1], s[2], 0, 8, ROOM)).isEqualTo(3);
        s = stretches(8, 0, M2, K64);
        s[1][4] += 512; // not back to back in the slot
        assertThat(CopyLane.stridedRows(s[0], s[1], s[2], 0, 8, ROOM)).isEqualTo(4);
    }

    @Test
    void overlappingDescendingOrFarRowsAreNotPitched() {
        assertThat(rows(stretches(4, 0, K64 / 2, K64))).as("stride shorter than a row").isEqualTo(1);
        assertThat(rows(stretches(4, 10 * M2, -M2, K64))).as("descending").isEqualTo(1);
        assertThat(rows(stretches(4, 0, CopyLane.MAX_PITCH + 4096, K64))).as("stride past the driver's pitch").isEqualTo(1);
        assertThat(rows(stretches(1, 0, M2, K64))).as("a single stretch").isEqualTo(1);
        assertThat(rows(stretches(4, 0, K64, K64))).as("contiguous rows (merged before, but allowed)").isEqualTo(4);
    }

    private static int rows(long[][] s) {
        return CopyLane.stridedRows(s[0], s[1], s[2], 0, s[0].length, Long.MAX_VALUE);
    }
}
