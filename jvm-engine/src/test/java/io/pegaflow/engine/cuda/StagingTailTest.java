package io.pegaflow.engine.cuda;

import static org.assertj.core.api.Assertions.assertThat;

import org.junit.jupiter.api.Test;

/**
 * {@link DeviceStager#splitTail}: where a staging group's last bytes (its tail) begin, the copy
 * there split in two so that an event can be recorded between them. No GPU.
 */
class StagingTailTest {
    private static final long M = 1 << 20;
    private static final long TAIL = 8 * M;

    /** Room for one stretch and one copy more, as DeviceStager keeps. */
    private final long[] host = new long[8];
    private final long[] dev = new long[8];
    private final long[] len = new long[8];
    private final int[] at = new int[8];
    private final int[] rows = new int[8];

    /** Stretches {@code from..from+n} as rows of {@code rowBytes} at host stride {@code stride}, back to back on the device. */
    private void stretches(int from, int n, long rowBytes, long stride) {
        for (int i = from; i < from + n; i++) {
            host[i] = 1_000_000_000L + i * stride;
            dev[i] = 5_000_000_000L + i * rowBytes;
            len[i] = rowBytes;
        }
    }

    private long bytes(int ops) {
        long b = 0;
        for (int o = 0; o < ops; o++) {
            b += rows[o] * len[at[o]];
        }
        return b;
    }

    @Test
    void aPitchedCopyIsSplitAtTheRowWhereTheTailBegins() {
        stretches(0, 5, 5 * M, 8 * M); // one pitched copy of five 5 MiB rows: 25 MiB, the tail's 8 from row 3 on
        at[0] = 0;
        rows[0] = 5;
        int[] split = DeviceStager.splitTail(host, dev, len, 5, at, rows, 1, TAIL);
        assertThat(split).as("two copies, the tail from the second").containsExactly(2, 1);
        assertThat(new int[] {at[0], rows[0], at[1], rows[1]}).as("rows 0-2 before, 3-4 in the tail")
                .containsExactly(0, 3, 3, 2);
        assertThat(host[at[1] + 1] - host[at[1]]).as("the second part's rows keep the stretches' stride").isEqualTo(8 * M);
        assertThat(len).as("a pitched split moves no stretch").startsWith(5 * M, 5 * M, 5 * M, 5 * M, 5 * M);
        assertThat(bytes(2)).as("nothing lost or copied twice").isEqualTo(25 * M);
        assertThat(rows[1] * len[at[1]]).as("the tail: whole rows, at least its bytes").isGreaterThanOrEqualTo(TAIL);
    }

    @Test
    void aPlainCopyIsSplitAtTheByteAsANewStretch() {
        stretches(0, 2, 12 * M, 64 * M); // two plain copies of 12 MiB: the tail is the last 8 of the second
        at[0] = 0;
        at[1] = 1;
        rows[0] = rows[1] = 1;
        int[] split = DeviceStager.splitTail(host, dev, len, 2, at, rows, 2, TAIL);
        assertThat(split).containsExactly(3, 2);
        assertThat(at).startsWith(0, 1, 2);
        assertThat(new long[] {len[1], len[2]}).as("4 MiB before the tail, 8 in it").containsExactly(4 * M, 8 * M);
        assertThat(host[2]).as("the new stretch continues the split one").isEqualTo(host[1] + 4 * M);
        assertThat(dev[2]).isEqualTo(dev[1] + 4 * M);
        assertThat(bytes(3)).isEqualTo(24 * M);
    }

    @Test
    void aTailOnACopysStartSplitsNothing() {
        stretches(0, 3, 8 * M, 64 * M); // three plain 8 MiB copies: the tail is the third whole
        for (int o = 0; o < 3; o++) {
            at[o] = o;
            rows[o] = 1;
        }
        assertThat(DeviceStager.splitTail(host, dev, len, 3, at, rows, 3, TAIL)).containsExactly(3, 2);
        assertThat(new long[] {len[0], len[1], len[2]}).containsExactly(8 * M, 8 * M, 8 * M);
    }

    @Test
    void aGroupUnderTwiceTheTailHasNone() {
        stretches(0, 3, 5 * M, 8 * M); // 15 MiB
        at[0] = 0;
        rows[0] = 3;
        assertThat(DeviceStager.splitTail(host, dev, len, 3, at, rows, 1, TAIL)).containsExactly(1, -1);
        assertThat(rows[0]).as("left as listed").isEqualTo(3);
    }

    @Test
    void aTailThatBeginsInsideAPitchedCopysFirstRowLeavesThatRowBeforeIt() {
        stretches(0, 1, 10 * M, 64 * M); // a plain 10 MiB copy, then a pitched one of two 6 MiB rows: 22 MiB
        stretches(1, 2, 6 * M, 8 * M);
        at[0] = 0;
        rows[0] = 1;
        at[1] = 1;
        rows[1] = 2;
        // the tail's 8 MiB would begin 4 MiB into the first row: that row goes before it, whole
        assertThat(DeviceStager.splitTail(host, dev, len, 3, at, rows, 2, TAIL)).containsExactly(3, 2);
        assertThat(new int[] {at[1], rows[1], at[2], rows[2]}).containsExactly(1, 1, 2, 1);
        assertThat(bytes(3)).isEqualTo(22 * M);
    }
}
