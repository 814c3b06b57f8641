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
        /** Milliseconds queueing group 2 takes (a slow driver call). */
        volatile int queueGroup2Ms;
        int frees;

        /** Groups below this have landed. */
        volatile int landedBelow = Integer.MAX_VALUE;
        final java.util.concurrent.atomic.AtomicInteger queuedGroups = new java.util.concurrent.atomic.AtomicInteger();

        Recording() {
            super(1 << 20, "test");
        }

        Recording(int depth) {
            super(1 << 20, "test", depth);
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

        /** Groups of its layout laid when each group was queued. */
        final int[] laidAtQueue = new int[8];

        /** Milliseconds the host's part of queueing group 2 takes (its copies listed: {@link #prepareGroup}). */
        volatile int prepareGroup2Ms;
        /** The group prepared ahead of its queueing ({@code -1}: none), and how many were. */
        int prepared = -1;
        int preparedAhead;

        @Override
        protected void prepareGroup(StageLayout layout, int g) {
            preparedAhead++;
            list(g);
        }

        private void list(int g) {
            if (g == 2) {
                pause(prepareGroup2Ms);
            }
            prepared = g;
        }

        /** Sleeps {@code ms} milliseconds on the staging thread (none for 0): a slow step of its work. */
        private static void pause(int ms) {
            if (ms <= 0) {
                return;
            }
            try {
                Thread.sleep(ms);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }

        @Override
        protected void queueGroup(StageLayout layout, int g) {
            laidAtQueue[g] = layout.laidGroups();
            if (prepared != g) {
                list(g); // as DeviceStager: a group not prepared ahead is prepared here
            }
            prepared = -1;
            if (g == failAtGroup) {
                throw new IllegalStateException("copy refused (test)");
            }
            if (g == 2) {
                pause(queueGroup2Ms);
            }
            queuedGroups.incrementAndGet();
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
            return g < landedBelow;
        }
    }

    @Test
    void whenAPacedStagingsFirstGroupLandedIsCounted() throws Exception {
        Recording s = new Recording();
        s.landedBelow = 0; // group 0's copies take 20 ms to land
        StagedLoad a = s.stage(12288, StagerTest::layout);
        assertThat(queuedAfter(s, 1)).isEqualTo(1);
        Thread.sleep(20);
        s.landedBelow = Integer.MAX_VALUE;
        assertThat(queuedAfter(s, 3)).as("the rest once group 0 landed, still paced").isEqualTo(3);
        assertThat(a.claim(null)).isTrue();
        a.awaitQueued(2);
        a.finish();
        long[] t = s.startTimes();
        assertThat(t[4]).as("stagings whose first group was seen landed").isEqualTo(1);
        assertThat(t[5]).as("asked for to landed: the wait for the copies included").isGreaterThanOrEqualTo(t[3] + 20_000_000L);
        // let go by its load's claim before group 0 landed: not seen landed, not counted
        s.landedBelow = 0;
        StagedLoad b = s.stage(12288, StagerTest::layout);
        assertThat(queuedAfter(s, 4)).as("a's three groups, then b's first").isEqualTo(4);
        assertThat(b.claim(null)).isTrue();
        b.awaitQueued(2);
        b.finish();
        assertThat(s.startTimes()[0]).isEqualTo(2);
        assertThat(s.startTimes()[4]).isEqualTo(1);
        assertThat(s.startTimes()[6]).as("a's groups 1 and 2, each queued after the one before was seen landed; b's none")
                .isEqualTo(2);
        s.close();
    }

    /**
     * The groups queued while paced after the one before was seen landed, and the host's time
     * from seeing it land to the next queued (the link idles meanwhile): a slow queueing of group
     * 2 (5 ms) shows in it; a group queued once the hold opened does not count.
     */
    @Test
    void thePacedGroupsAndTheHostsGapBeforeEachAreCounted() throws Exception {
        Recording s = new Recording();
        s.queueGroup2Ms = 5;
        long[] t = stageThreePaced(s);
        assertThat(t[6]).as("groups 1 and 2").isEqualTo(2);
        assertThat(t[7]).as("group 2's queueing included").isGreaterThanOrEqualTo(5_000_000L);
        s.landedBelow = 0; // b's group 0 never lands: its load's claim lets the rest go unpaced
        s.queueGroup2Ms = 0;
        StagedLoad b = s.stage(12288, StagerTest::layout);
        assertThat(queuedAfter(s, 4)).isEqualTo(4);
        assertThat(b.claim(null)).isTrue();
        b.awaitQueued(2);
        b.finish();
        assertThat(s.startTimes()[6]).as("none of b's").isEqualTo(2);
        s.close();
    }

    /**
     * A group's host work (its copies listed) is done while the group before is in flight, so
     * the gap between seeing that group land and queueing the next leaves it out: a 5 ms listing
     * of group 2 does not show in the paced gap, where queueing it after the landing would put
     * it there.
     */
    @Test
    void theNextGroupsHostWorkIsDoneBeforeTheGroupBeforeItLands() throws Exception {
        Recording s = new Recording();
        s.prepareGroup2Ms = 5;
        long[] t = stageThreePaced(s);
        assertThat(t[6]).as("groups 1 and 2 paced").isEqualTo(2);
        assertThat(t[7]).as("their gaps leave group 2's 5 ms listing out").isLessThan(4_000_000L);
        assertThat(s.preparedAhead).as("groups 1 and 2 prepared ahead").isEqualTo(2);
        s.close();
    }

    /**
     * Stages a load of three groups on {@code s}, every group landing at once (so each is paced,
     * never held up), claims and finishes it; returns the stager's {@link Stager#startTimes}.
     */
    private static long[] stageThreePaced(Recording s) throws InterruptedException {
        StagedLoad a = s.stage(12288, StagerTest::layout);
        assertThat(queuedAfter(s, 3)).isEqualTo(3);
        assertThat(a.claim(null)).isTrue();
        a.awaitQueued(2);
        a.finish();
        return s.startTimes();
    }

    /** Spins until {@code n} groups were queued or 10 s passed; then waits a little for any more. */
    private static int queuedAfter(Recording s, int n) throws InterruptedException {
        long end = System.nanoTime() + 10_000_000_000L;
        while (s.queuedGroups.get() < n && System.nanoTime() < end) {
            Thread.sleep(1);
        }
        Thread.sleep(50); // a group queued past the pace would show by now
        return s.queuedGroups.get();
    }

    @Test
    void aPacedStagingKeepsItsDepthOfGroupsInFlight() throws Exception {
        for (int depth = 1; depth <= 2; depth++) {
            Recording s = new Recording(depth);
            assertThat(s.depth()).isEqualTo(depth);
            s.landedBelow = 0; // nothing lands until the test says so
            StagedLoad a = s.stage(12288, StagerTest::layout);
            assertThat(queuedAfter(s, depth)).as("depth %d: groups queued while none landed", depth).isEqualTo(depth);
            s.landedBelow = 1;
            assertThat(queuedAfter(s, depth + 1)).as("depth %d: one more once group 0 landed", depth)
                    .isEqualTo(Math.min(3, depth + 1));
            s.landedBelow = Integer.MAX_VALUE;
            assertThat(a.claim(null)).isTrue();
            a.awaitQueued(2);
            a.finish();
            s.close();
        }
        assertThatThrownBy(() -> new Recording(0)).hasMessageContaining("staging depth 0; expected 1 to 8");
        assertThatThrownBy(() -> Stager.depthFromEnvironment("9")).hasMessageContaining("PEGAFLOW_PRESTAGE_DEPTH=9");
        assertThat(Stager.depthFromEnvironment(null)).isEqualTo(1);
        assertThat(Stager.depthFromEnvironment("2")).isEqualTo(2);
    }

    @Test
    void howSoonEachStagingStartedIsCounted() {
        Recording s = new Recording();
        assertThat(s.startTimes()).as("nothing staged").containsExactly(0, 0, 0, 0, 0, 0, 0, 0);
        long slowLayout = 30_000_000L;
        StagedLoad a = s.stage(12288, () -> {
            long end = System.nanoTime() + slowLayout; // a layout that takes 30 ms to make
            while (System.nanoTime() < end) {
                Thread.onSpinWait();
            }
            return layout();
        });
        assertThat(a.claim(null)).isTrue();
        a.awaitQueued(2);
        a.finish();
        long[] t = s.startTimes();
        assertThat(t[0]).as("stagings whose first group was queued").isEqualTo(1);
        assertThat(t[2]).as("the layout's own time").isGreaterThanOrEqualTo(slowLayout);
        assertThat(t[3]).as("asked for to the first group queued: the thread's start, the layout and more")
                .isGreaterThanOrEqualTo(t[1] + t[2]);
        StagedLoad b = s.stage(12288, StagerTest::layout);
        assertThat(b.claim(null)).isTrue();
        b.awaitQueued(2);
        b.finish();
        assertThat(s.startTimes()[0]).isEqualTo(2);
        assertThat(s.startTimes()[3]).isGreaterThan(t[3]);
        s.close();
    }

    /**
     * A lazy layout is laid a group at a time on the staging thread, each just before its copies:
     * the first group's copies wait for its own layout, not the whole load's.
     */
    @Test
    void aLazyLayoutsGroupsAreLaidJustBeforeTheirCopies() {
        Recording s = new Recording();
        StagedLoad a = s.stage(12288, () -> StageLayout.lazy(3, 3, 12288, (g, host, len, at) -> {
            host[at] = g * 8192L;
            len[at] = 4096;
            return at + 1;
        }));
        assertThat(a.claim(null)).isTrue();
        a.awaitQueued(2);
        assertThat(s.laidAtQueue).startsWith(1, 2, 3);
        assertThat(a.layout().stretchAt(2)).isEqualTo(8192);
        a.finish();
        s.close();
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
        assertThat(s.unavailableRefusals()).as("the lookup after it, not staged").isEqualTo(1);
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
