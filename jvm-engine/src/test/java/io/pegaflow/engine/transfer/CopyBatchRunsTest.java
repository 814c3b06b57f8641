package io.pegaflow.engine.transfer;

import static org.assertj.core.api.Assertions.assertThat;

import org.junit.jupiter.api.Test;

/** The runs a copy engine moves as one range: pieces back to back on both sides, cut at a group's end. */
class CopyBatchRunsTest {
    @Test
    void aRunEndsWhereEitherSideJumpsOrTheGroupEnds() {
        CopyBatch b = new CopyBatch(CopyBatch.Direction.TO_HOST, 8);
        b.add(1000, 0, 100);   // 0 \
        b.add(1100, 100, 50);  // 1  one run: 150 bytes
        b.add(2000, 150, 10);  // 2  device jumps
        b.add(2010, 200, 10);  // 3  host jumps
        b.add(2020, 210, 30);  // 4 \ with 3: 40 bytes
        b.add(2050, 240, 8);   // 5  continues 4 on both sides, but past the group's end below
        assertThat(b.runEnd(0, 6)).isEqualTo(2);
        assertThat(b.runBytes(0, 2)).isEqualTo(150);
        assertThat(b.runEnd(2, 6)).isEqualTo(3);
        assertThat(b.runBytes(2, 3)).isEqualTo(10);
        assertThat(b.runEnd(3, 6)).isEqualTo(6);
        assertThat(b.runBytes(3, 6)).isEqualTo(48);
        assertThat(b.runEnd(3, 5)).as("cut at the end given").isEqualTo(5);
        assertThat(b.runBytes(3, 5)).isEqualTo(40);
        assertThat(b.coalescedRanges()).isEqualTo(3);
    }
}
