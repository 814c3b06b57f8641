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
        LookupWarmUp.Result r = LookupWarmUp.run(16, 30, Long.MAX_VALUE, 0);

        assertThat(r.rounds()).isEqualTo(30);
        assertClean(r);
        assertThat(r.stagedLoads()).as("no staging buffer").isZero();
        assertThat(r.throughServer()).as("no server asked for: the embedded scratch engine").isFalse();
    }

    /**
     * Where the process stages loads at their lookup, the warm-up's loads are staged too (the
     * staged path compiled before vLLM's first warm request), in a buffer of its loads' size, not
     * of the process's (a GPU's 4 GiB would be host memory zeroed on the warm-up's thread).
     */
    @Test
    void whereTheProcessStagesTheWarmUpStagesInABufferOfItsOwnSize() {
        assertThat(LookupWarmUp.scratchStageBytes("4096")).isEqualTo(LookupWarmUp.SCRATCH_STAGE_BYTES).isEqualTo(1 << 20);
        assertThat(LookupWarmUp.scratchStageBytes(null)).isZero();
        assertThat(LookupWarmUp.scratchStageBytes("0")).isZero();
        assertThat(LookupWarmUp.scratchStageBytes("-1")).as("refused by the process's own engine, naming it").isZero();
        LookupWarmUp.Result r = LookupWarmUp.run(16, 30, Long.MAX_VALUE, LookupWarmUp.SCRATCH_STAGE_BYTES);
        assertClean(r);
        assertThat(r.stagedLoads()).as("the hits begun at their lookup, staged (dropped ones too)").isPositive()
                .isLessThanOrEqualTo(r.rounds());
    }

    @Test
    void theBudgetEndsItEarly() {
        LookupWarmUp.Result r = LookupWarmUp.run(16, 1_000_000, 1, 0);

        assertThat(r.rounds()).isBetween(0, 1);
    }

    @Test
    void aBadBlockSizeIsRefusedByName() {
        assertThatThrownBy(() -> LookupWarmUp.run(0, 1, Long.MAX_VALUE, 0))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("block size 0");
    }

    @Test
    void itStartsOncePerProcessAndEndsClean() throws InterruptedException {
        java.util.logging.Logger logger = java.util.logging.Logger.getLogger(LookupWarmUp.class.getName());
        java.util.List<String> lines = new java.util.concurrent.CopyOnWriteArrayList<>();
        java.util.logging.Handler capture = new java.util.logging.Handler() {
            @Override
            public void publish(java.util.logging.LogRecord r) {
                if (r.getLevel().intValue() >= java.util.logging.Level.INFO.intValue()) {
                    lines.add(r.getMessage());
                }
            }

            @Override
            public void flush() {}

            @Override
            public void close() {}
        };
        logger.addHandler(capture);
        Thread first;
        Thread second;
        try {
            first = LookupWarmUp.startOnce(32, true); // server mode asked: this module carries no scratch server
            second = LookupWarmUp.startOnce(32);
            if (first != null) {
                first.join(30_000);
            }
        } finally {
            logger.removeHandler(capture);
        }
        // one line says where the process's warm-up ran
        assertThat(lines).singleElement().asString().contains("rounds in")
                .endsWith("on an embedded scratch engine (no scratch server started)");

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
