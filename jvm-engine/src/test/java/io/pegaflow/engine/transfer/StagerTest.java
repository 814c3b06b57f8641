package io.pegaflow.engine.transfer;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * {@link Stager}'s own rules, on a stager that records instead of copying: the buffer is taken
 * at the first load asked to stage (never where nothing stages), on the staging thread (never the
 * lookup's) and, where it cannot be had, staging stays off; one load holds it at a time; a staging that failed frees it unclaimed and
 * fails the load that claimed it, naming the cause; a released staging never serves a load.
 */
class StagerTest {
    /** Three groups of one 4 KiB stretch each. */
    private static StageLayout layout() {
        return new StageLayout(new long[] {0, 8192, 16384}, new long[] {4096, 4096, 4096}, new int[] {1, 2, 3});
    }

    private static final class Recording extends Stager {
        volatile int allocations;
        volatile String allocatedOn;
        volatile boolean refuseAllocation;
        volatile int failAtGroup = -1;
        volatile CountDownLatch holdGroup1;
        int frees;

        Recording() {
            super(1 << 20, "test");
        }

        @Override
        protected void allocate() {
            allocations++;
            allocatedOn = Thread.currentThread().getName();
            if (refuseAllocation) {
                throw new IllegalStateException("out of memory (test)");
            }
        }

        @Override
        protected void free() {
            frees++;
        }

        @Override
        public long address() {
            return 0;
        }

        @Override
        protected void queueGroup(StageLayout layout, int g) {
            if (g == failAtGroup) {
                throw new IllegalStateException("copy refused (test)");
            }
            CountDownLatch hold = holdGroup1;
            if (g == 1 && hold != null) {
                try {
                    hold.await(10, TimeUnit.SECONDS);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
        }

        @Override
        protected boolean landed(int g) {
            return true;
        }
    }

    @Test
    void theBufferIsTakenAtTheFirstStagingAndFreedAtClose() {
        Recording s = new Recording();
        assertThat(s.allocated()).as("nothing staged yet: no buffer").isFalse();
        StagedLoad a = s.stage(12288, StagerTest::layout);
        assertThat(a).isNotNull();
        assertThat(a.claim(null)).isTrue();
        a.awaitQueued(2);
        assertThat(s.allocated()).isTrue();
        assertThat(s.allocatedOn).as("taken on the staging thread, not the lookup's")
                .isNotEqualTo(Thread.currentThread().getName()).startsWith("pegaflow-stage-");
        a.finish();
        assertThat(s.stage(12288, StagerTest::layout)).as("free again once its load ended").isNotNull();
        assertThat(s.allocations).isEqualTo(1);
        s.close();
        assertThat(s.frees).isEqualTo(1);
    }

    @Test
    void aBufferThatCannotBeHadLeavesStagingOff() {
        Recording s = new Recording();
        s.refuseAllocation = true;
        StagedLoad first = s.stage(12288, StagerTest::layout);
        assertThat(first).as("asked for on the staging thread").isNotNull();
        assertThatThrownBy(() -> first.awaitQueued(0)).hasMessageContaining("no staging buffer of 1048576 bytes");
        assertThat(first.claim(null)).as("failed: its load reads the pool").isFalse();
        assertThat(s.stage(12288, StagerTest::layout)).as("asked once").isNull();
        assertThat(s.allocations).isEqualTo(1);
        assertThat(s.failedStagings()).isEqualTo(1);
        assertThat(s.allocated()).isFalse();
        s.close();
        assertThat(s.frees).as("nothing to free").isZero();
    }

    @Test
    void oneLoadHoldsTheBufferAndAReleasedOneServesNone() {
        Recording s = new Recording();
        s.holdGroup1 = new CountDownLatch(1);
        StagedLoad a = s.stage(12288, StagerTest::layout);
        assertThat(s.stage(12288, StagerTest::layout)).as("taken").isNull();
        assertThat(s.busyRefusals()).isEqualTo(1);
        assertThat(s.stage(1 << 21, StagerTest::layout)).as("larger than the buffer").isNull();
        assertThat(s.tooLargeRefusals()).isEqualTo(1);
        a.release();
        assertThat(a.claim(null)).as("released: no load takes it").isFalse();
        assertThatThrownBy(() -> a.awaitQueued(2)).hasMessageContaining("released before group 2");
        s.holdGroup1.countDown();
        StagedLoad b = s.stage(12288, StagerTest::layout);
        assertThat(b).as("a release frees the buffer").isNotNull();
        assertThat(b.claim(null)).isTrue();
        b.awaitQueued(2);
        b.finish();
        s.close();
    }

    @Test
    void aFailedStagingFreesTheBufferUnclaimedAndFailsTheLoadThatClaimedIt() throws Exception {
        Recording s = new Recording();
        s.failAtGroup = 0;
        StagedLoad unclaimed = s.stage(12288, StagerTest::layout);
        assertThatThrownBy(() -> unclaimed.awaitQueued(0)).hasMessageContaining("copy refused (test)");
        assertThat(unclaimed.claim(null)).as("failed: its load reads the pool").isFalse();
        assertThat(s.failedStagings()).as("counted (and the first logged)").isEqualTo(1);
        s.failAtGroup = 2;
        s.holdGroup1 = new CountDownLatch(1); // the claim comes before the failure
        StagedLoad claimed = null;
        for (int i = 0; i < 100 && claimed == null; i++) {
            claimed = s.stage(12288, StagerTest::layout); // the failed one frees the buffer on the staging thread
            Thread.sleep(10);
        }
        assertThat(claimed).isNotNull();
        assertThat(claimed.claim(new CompletableFuture<>())).isTrue();
        s.holdGroup1.countDown();
        claimed.awaitQueued(1);
        StagedLoad c = claimed;
        assertThatThrownBy(() -> c.awaitQueued(2)).hasMessageContaining("staging group 2").hasMessageContaining("copy refused");
        assertThat(s.stage(12288, StagerTest::layout)).as("held by the claimed load until it ends").isNull();
        claimed.finish();
        s.failAtGroup = -1;
        assertThat(s.stage(12288, StagerTest::layout)).isNotNull();
        s.close();
    }

    @Test
    void sizesAreCheckedNamingTheValue() {
        assertThat(Stager.checkBytes(0)).isZero();
        assertThat(Stager.checkBytes(4096L << 20)).isEqualTo(4096L << 20);
        assertThatThrownBy(() -> Stager.checkBytes(-4096)).hasMessageContaining("-4096").hasMessageContaining(Stager.ENV);
        assertThatThrownBy(() -> Stager.checkBytes(4097)).hasMessageContaining("4097");
        assertThatThrownBy(() -> Stager.checkBytes((65536L << 20) + 4096)).hasMessageContaining("up to");
        assertThatThrownBy(() -> new HostTransferEngine(null, 1, -1)).hasMessageContaining("staging buffer of -1 bytes");
    }
}
