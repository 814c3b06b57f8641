package io.pegaflow.engine;

import static org.assertj.core.api.Assertions.assertThat;

import io.pegaflow.engine.CopyEnds.Rule;
import org.junit.jupiter.api.Test;

/** The table of when a copy ends ({@link CopyEnds#rule}), row by row. */
class CopyEndsRuleTest {
    private static final long HOLD = 10_000_000_000L;

    @Test
    void aLandedSaveEndsBesideItsFuture() {
        assertThat(CopyEnds.rule(true, false, 0, 1)).isEqualTo(Rule.BESIDE);
        assertThat(CopyEnds.rule(true, false, HOLD, HOLD)).as("a save's plan has no hold that matters").isEqualTo(Rule.BESIDE);
    }

    @Test
    void aLoadEndsBesideOnlyWithinHalfItsHold() {
        assertThat(CopyEnds.rule(false, false, HOLD, HOLD / 2 - 1)).isEqualTo(Rule.BESIDE);
        assertThat(CopyEnds.rule(false, false, HOLD, HOLD / 2)).isEqualTo(Rule.END_FIRST);
        assertThat(CopyEnds.rule(false, false, 0, 1)).as("no hold: the end proves the pins").isEqualTo(Rule.END_FIRST);
    }

    @Test
    void aFailedCopyIsRolledBackFirst() {
        assertThat(CopyEnds.rule(true, true, 0, 1)).isEqualTo(Rule.ROLL_BACK);
        assertThat(CopyEnds.rule(false, true, HOLD, 1)).isEqualTo(Rule.ROLL_BACK);
    }
}
