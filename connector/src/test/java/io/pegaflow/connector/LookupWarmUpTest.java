package io.pegaflow.connector;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.InvalidArgumentException;
import org.junit.jupiter.api.Test;

/**
 * The warm-up runs the hit path (not only misses), the in-step loads and the rest of a
 * request's path on its scratch engine without a failure or a request left behind, and starts
 * once per process.
 */
class LookupWarmUpTest {
    private static void assertClean(LookupWarmUp.Result r) {
        assertThat(r.expectedHitTokens()).isPositive();
        assertThat(r.hitTokens()).isEqualTo(r.expectedHitTokens());
        assertThat(r.missTokens()).isZero();
        assertThat(r.loads()).isEqualTo(r.rounds() - r.rounds() / 3); // every round's hit but every third's
        assertThat(r.atAllocLoads()).isPositive().isLessThan(r.loads()); // both ways a load starts
        assertThat(r.loadFailures()).isZero();
        assertThat(r.expectedLoadedBlocks()).isPositive();
        assertThat(r.loadedBlocks()).isEqualTo(r.expectedLoadedBlocks()); // the blocks were copied, not only planned
        assertThat(r.lookupFailures()).isZero();
        assertThat(r.contractViolations()).isZero();
        assertThat(r.tracked()).isZero();
        assertThat(WorkerSide.colocated("pegaflow-lookup-warm-up")).isNull(); // the scratch worker left the registry
    }

    @Test
    void everyHitLookupAnswersItsStoredPrefixAndEveryRequestEnds() {
        LookupWarmUp.Result r = LookupWarmUp.run(16, 30, Long.MAX_VALUE);

        assertThat(r.rounds()).isEqualTo(30);
        assertClean(r);
    }

    @Test
    void theBudgetEndsItEarly() {
        LookupWarmUp.Result r = LookupWarmUp.run(16, 1_000_000, 1);

        assertThat(r.rounds()).isBetween(0, 1);
    }

    @Test
    void aBadBlockSizeIsRefusedByName() {
        assertThatThrownBy(() -> LookupWarmUp.run(0, 1, Long.MAX_VALUE))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("block size 0");
    }

    @Test
    void itStartsOncePerProcessAndEndsClean() throws InterruptedException {
        Thread first = LookupWarmUp.startOnce(32);
        Thread second = LookupWarmUp.startOnce(32);

        assertThat(first).isNotNull();
        assertThat(first.isDaemon()).isTrue();
        assertThat(second).isNull();
        first.join(30_000);
        assertThat(first.isAlive()).isFalse();
        assertThat(LookupWarmUp.outcome).isInstanceOf(LookupWarmUp.Result.class);
        LookupWarmUp.Result r = (LookupWarmUp.Result) LookupWarmUp.outcome;
        assertThat(r.rounds()).isPositive();
        assertClean(r);
    }
}
