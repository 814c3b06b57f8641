package io.pegaflow.connector;

import static io.pegaflow.connector.TestBlocks.ids;
import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.EngineSource;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.metrics.Gauge;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The brains with two KV-cache groups (vLLM's hybrid manager), each its own store instance:
 * group 0 full attention, group 1 a sliding window or a recurrent state. Block 0 is vLLM's
 * null block in group 1's tables (what the group dropped). Checks which blocks are saved,
 * which hit is offered and that exactly the hit's blocks of each group are loaded.
 */
class HybridBrainTest {
    private static final int BLOCK = 16;
    private static final int BLOCKS = 64;
    private static final int SEG = 512;
    private static final long NULL = 0;

    private final Arena arena = Arena.ofShared();
    private final Random rnd = new Random(33);
    private PegaEngine engine;
    private SchedulerSide sched;
    private WorkerSide worker;
    private final List<LayerRegion> full = new ArrayList<>();
    private final List<LayerRegion> other = new ArrayList<>();

    /** Two instances, "h" (full attention) and "h/g1" ({@code kind}, {@code window} tokens). */
    private void start(CacheGroup.Kind kind, int window) {
        engine = PegaEngine.create(EngineConfig.builder().poolSize("8mb").sweepInterval(Duration.ZERO)
                .leaseTtl(Duration.ofSeconds(30)).build());
        full.add(region("full.0"));
        other.add(region("other.0"));
        engine.registerInstance(new InstanceSpec("h", "ns-full", 1, 1));
        engine.registerWorker("h", new WorkerSpec(0, 0, 0, full));
        engine.registerInstance(new InstanceSpec("h/g1", "ns-" + kind, 1, 1));
        engine.registerWorker("h/g1", new WorkerSpec(0, 0, 0, other));
        EngineSource src = () -> new EngineSource.Binding(engine, 1);
        List<CacheGroup> groups = List.of(CacheGroup.full("h"), new CacheGroup("h/g1", kind, window));
        sched = new SchedulerSide(src, groups, BLOCK, true, false);
        worker = new WorkerSide(src, groups, 0);
    }

    @AfterEach
    void stop() {
        if (engine != null) {
            engine.close();
        }
        arena.close();
    }

    private LayerRegion region(String name) {
        MemorySegment m = arena.allocate(2L * BLOCKS * SEG, 64);
        return new LayerRegion(name, KvLayout.SPLIT_KV, m.address(), m.byteSize(), BLOCKS, SEG, SEG, (long) BLOCKS * SEG);
    }

    private static byte[] bytes(List<LayerRegion> layers, long id) {
        byte[] out = new byte[layers.size() * 2 * SEG];
        int at = 0;
        for (LayerRegion r : layers) {
            for (int s = 0; s < 2; s++) {
                MemorySegment.copy(MemorySegment.ofAddress(r.pieceAddress(id, s)).reinterpret(SEG), ValueLayout.JAVA_BYTE,
                        0, out, at, SEG);
                at += SEG;
            }
        }
        return out;
    }

    private void fill(List<LayerRegion> layers, long id) {
        for (LayerRegion r : layers) {
            for (int s = 0; s < 2; s++) {
                byte[] b = new byte[SEG];
                rnd.nextBytes(b);
                MemorySegment.copy(b, 0, MemorySegment.ofAddress(r.pieceAddress(id, s)).reinterpret(SEG),
                        ValueLayout.JAVA_BYTE, 0, SEG);
            }
        }
    }

    private BlockHashes hashes(int n) {
        return TestBlocks.hashes(rnd, n);
    }

    /** One step of a request with both tables ({@code tables[g]}: its new ids), its saves submitted. */
    private StepPlan step(String id, BlockHashes h, long[][] tables, long computed, long scheduled) {
        for (long[] t : tables) {
            for (long b : t) {
                if (b != NULL) {
                    fill(t == tables[0] ? full : other, b);
                }
            }
        }
        sched.schedule(id, h, 0, tables, false, computed, scheduled);
        byte[] plan = sched.buildPlan();
        worker.submitSaves(plan, 0);
        return StepPlan.decode(plan);
    }

    /** Request {@code id} ends; returns once its saves are done (vLLM frees its blocks then). */
    private void finish(String id) throws InterruptedException {
        assertThat(sched.requestFinished(id)).isTrue();
        for (int i = 0; i < 400; i++) {
            WorkerSide.Finished f = worker.getFinished(i == 0 ? List.of(id) : List.of());
            if (f.sending().contains(id)) {
                sched.finished(f.sending(), List.of());
                return;
            }
            Thread.sleep(5);
        }
        throw new AssertionError("the saves of " + id + " never finished");
    }

    /** Polls get_finished until a load is reported. */
    private WorkerSide.Finished loadDone() throws InterruptedException {
        for (int i = 0; i < 400; i++) {
            WorkerSide.Finished f = worker.getFinished(List.of());
            if (!f.recving().isEmpty()) {
                return f;
            }
            Thread.sleep(5);
        }
        throw new AssertionError("no load finished");
    }

    private List<String> recving() throws InterruptedException {
        WorkerSide.Finished f = loadDone();
        assertThat(f.failed()).isEmpty();
        return f.recving();
    }

    /** Loads {@code id}'s committed hit; returns the plan's loads. */
    private List<StepPlan.Load> load(String id) throws InterruptedException {
        byte[] plan = sched.buildPlan();
        worker.startLoads(plan);
        assertThat(recving()).containsExactly(id);
        assertThat(worker.drainLoadErrors()).isEmpty();
        return StepPlan.decode(plan).loads();
    }

    @Test
    void slidingWindowHitLoadsTheFullPrefixAndOnlyTheWindowAndNeverSavesTheNullBlock() throws Exception {
        start(CacheGroup.Kind.SLIDING, 40);
        BlockHashes h = hashes(9);
        // a request vLLM served blocks 0..4 of from its own cache: the window group holds its null block there
        long[] windowTable = {NULL, NULL, NULL, NULL, NULL, 45, 46, 47, 48};
        StepPlan p = step("a", h, new long[][] {ids(1, 9), windowTable}, 0, 9 * BLOCK);
        assertThat(p.saves()).extracting(StepPlan.Save::group).containsExactly(0, 1);
        assertThat(p.saves().get(1).blockIds()).as("vLLM's null block is never saved").containsExactly(45, 46, 47, 48);
        byte[][] want = new byte[9][];
        for (int i = 0; i < 9; i++) {
            want[i] = bytes(full, 1 + i);
        }
        byte[] lastWindow = bytes(other, 48);
        finish("a");

        // 9 blocks and a token: a hit of 9 blocks needs tokens 105..143 of the window group, blocks 6..8
        assertThat(sched.lookup("b", h, 9 * BLOCK + 1, 0)).isEqualTo(9 * BLOCK);
        long[] window = new long[9];
        Arrays.fill(window, 0, 6, NULL);
        window[6] = 56;
        window[7] = 57;
        window[8] = 58;
        sched.afterAlloc("b", new long[][] {ids(20, 10), window}, 9 * BLOCK);
        List<StepPlan.Load> loads = load("b");
        assertThat(loads).extracting(StepPlan.Load::group).containsExactly(0, 1);
        assertThat(loads.get(1).blockIds()).containsExactly(56, 57, 58);
        for (int i = 0; i < 9; i++) {
            assertThat(bytes(full, 20 + i)).as("full block %d", i).isEqualTo(want[i]);
        }
        assertThat(bytes(other, 58)).isEqualTo(lastWindow);
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).isZero();
    }

    @Test
    void aWindowMissingABlockMovesTheHitLeftAndTheFullPrefixIsReLeasedExactly() throws Exception {
        start(CacheGroup.Kind.SLIDING, 40);
        BlockHashes h = hashes(8);
        step("a", h, new long[][] {ids(1, 8), ids(31, 6)}, 0, 6 * BLOCK); // the window group stored blocks 0..5
        step("a", h, new long[][] {new long[0], new long[] {NULL, NULL}}, 6 * BLOCK, 2 * BLOCK); // 6, 7: dropped
        finish("a");
        // k = 8 needs window blocks 5..7: 6 is missing, so the window must end at 6: blocks 3..5 are there
        assertThat(sched.lookup("b", h, 8 * BLOCK + 1, 0)).isEqualTo(6 * BLOCK);
        assertThat(sched.hitShrinks()).isEqualTo(1);
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).as("one lease per group, the longer one released").isEqualTo(2);
        long[] window = {NULL, NULL, NULL, 43, 44, 45, 46};
        sched.afterAlloc("b", new long[][] {ids(20, 7), window}, 6 * BLOCK);
        List<StepPlan.Load> loads = load("b");
        assertThat(loads.get(0).blockIds()).containsExactly(ids(20, 6));
        assertThat(loads.get(1).blockIds()).containsExactly(43, 44, 45);
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).isZero();
    }

    @Test
    void recurrentStatesAreSavedAtStepBoundariesAndTheRightmostOneIsLoadedAlone() throws Exception {
        start(CacheGroup.Kind.RECURRENT, 0);
        BlockHashes h = hashes(11);
        // steps end at 64 (state in block 3), 128 (block 7) and 170 (inside block 10: no state)
        StepPlan s1 = step("a", h, new long[][] {ids(1, 4), ids(41, 4)}, 0, 64);
        StepPlan s2 = step("a", h, new long[][] {ids(5, 4), ids(45, 4)}, 64, 64);
        StepPlan s3 = step("a", h, new long[][] {ids(9, 3), ids(49, 3)}, 128, 42);
        assertThat(s1.saves().get(1).blockIds()).containsExactly(44);
        assertThat(s2.saves().get(1).blockIds()).containsExactly(48);
        assertThat(s3.saves()).extracting(StepPlan.Save::group).containsExactly(0);
        byte[] state = bytes(other, 48);
        finish("a");

        // the full prefix is 10 blocks; the states stored are after 4 and 8 blocks: a hit of 8
        assertThat(sched.lookup("b", h, 11 * BLOCK + 1, 0)).isEqualTo(8 * BLOCK);
        long[] states = new long[12];
        states[7] = 60;
        states[11] = 61;
        sched.afterAlloc("b", new long[][] {ids(20, 12), states}, 8 * BLOCK);
        List<StepPlan.Load> loads = load("b");
        assertThat(loads.get(0).blockIds()).containsExactly(ids(20, 8));
        assertThat(loads.get(1).blockIds()).as("only the final state").containsExactly(60);
        assertThat(bytes(other, 60)).isEqualTo(state);
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).isZero();
    }

    @Test
    void aHitWhereVllmHoldsNoBlockForTheGroupIsNotLoadedAndAFailedGroupFailsTheRequest() throws Exception {
        start(CacheGroup.Kind.RECURRENT, 0);
        BlockHashes h = hashes(4);
        step("a", h, new long[][] {ids(1, 4), ids(41, 4)}, 0, 64);
        finish("a");
        assertThat(sched.lookup("b", h, 4 * BLOCK + 1, 0)).isEqualTo(4 * BLOCK);
        // vLLM allocated the null block where the state goes: not the contract; the loads fail
        sched.afterAlloc("b", new long[][] {ids(20, 5), new long[5]}, 4 * BLOCK);
        assertThat(sched.contractViolations()).isEqualTo(1);
        worker.startLoads(sched.buildPlan());
        WorkerSide.Finished f = loadDone();
        assertThat(f.recving()).containsExactly("b");
        assertThat(f.failed()).as("reported by request").containsExactly("b");
        sched.failedLoads(f.failed());
        sched.finished(List.of(), f.recving());
        assertThat(sched.loadFailures()).isEqualTo(1);
        assertThat(sched.lookup("b", h, 4 * BLOCK + 1, 0)).as("not offered again").isZero();
        assertThat(engine.stats().get(Gauge.ACTIVE_LEASES)).isZero();
    }

    @Test
    void groupsAreCheckedWhenMadeAndEveryCallCarriesEachGroupsTable() {
        start(CacheGroup.Kind.SLIDING, 40);
        assertThatThrownBy(() -> new CacheGroup("x", CacheGroup.Kind.SLIDING, 0))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("window 0 tokens; expected >= 1");
        assertThatThrownBy(() -> new CacheGroup("x", CacheGroup.Kind.RECURRENT, 8))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("expected 0");
        assertThatThrownBy(() -> CacheGroup.Kind.of(3)).isInstanceOf(InvalidArgumentException.class)
                .hasMessageContaining("kind 3");
        assertThatThrownBy(() -> new SchedulerSide(() -> null, List.of(CacheGroup.full("x"), CacheGroup.full("x")), BLOCK,
                true, false)).isInstanceOf(InvalidArgumentException.class).hasMessageContaining("share an instance id");
        assertThatThrownBy(() -> sched.afterAlloc("r", new long[][] {ids(1, 2)}, 0))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("1 KV-cache groups; expected 2");
        assertThatThrownBy(() -> sched.schedule("r", hashes(1), 0, new long[][] {ids(1, 1)}, false, 0, BLOCK))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("expected 2");
        assertThat(sched.trackedRequests()).isZero();
    }
}
