package io.pegaflow.engine;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.metrics.Gauge;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

/**
 * Every public operation refuses bad input with a typed exception whose message names the
 * value and the expectation, and leaves index, leases and pool exactly as they were: after
 * all cases, the blocks saved up front still load byte-exact.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class BadInputTest {
    private final Random rnd = new Random(7);
    private PegaEngine engine;
    private KvWorld world;
    private KvWorld half;
    private byte[][] saved;
    private Token lease;
    private Map<Gauge, Long> gaugesBefore;

    @BeforeAll
    void setUp() {
        engine = PegaEngine.create(EngineConfig.builder().poolSize("1mb").sweepInterval(Duration.ZERO).build());
        world = new KvWorld("inst", "ns", KvWorld.Kind.SPLIT_KFIRST, 2, 1, 2, 16, 128, 0);
        world.register(engine);
        half = new KvWorld("half", "ns2", KvWorld.Kind.COMBINED, 2, 1, 2, 16, 128, 0);
        engine.registerInstance(half.spec);
        engine.registerWorker("half", half.workers.get(0));
        saved = KvWorld.randomHashes(rnd, 3);
        for (int i = 0; i < 3; i++) {
            world.fillPattern(i, saved[i]);
        }
        for (WorkerSpec w : world.workers) {
            engine.save("inst", w.workerRank(), new long[] {0, 1, 2}, BlockHashes.of(saved)).join();
        }
        lease = engine.query("inst", BlockHashes.of(saved)).lease();
        gaugesBefore = engine.stats().gauges();
    }

    @AfterAll
    void tearDown() {
        engine.close();
        world.close();
        half.close();
    }

    interface Call {
        void run(BadInputTest t);
    }

    static Stream<Arguments> cases() {
        byte[] ok = new byte[32];
        List<Arguments> c = new ArrayList<>();
        add(c, "instance spec null", InvalidArgumentException.class, "instance spec is null", t -> t.engine.registerInstance(null));
        add(c, "blank instance id", InvalidArgumentException.class, "instance id ' '", t -> t.engine.registerInstance(new InstanceSpec(" ", "ns", 1, 1)));
        add(c, "tp size 0", InvalidArgumentException.class, "tpSize 0", t -> t.engine.registerInstance(new InstanceSpec("x", "ns", 0, 1)));
        add(c, "world not multiple of tp", InvalidArgumentException.class, "worldSize 3", t -> t.engine.registerInstance(new InstanceSpec("x", "ns", 2, 3)));
        add(c, "same id, other spec", TopologyMismatchException.class, "instance 'inst' is registered as", t -> t.engine.registerInstance(new InstanceSpec("inst", "ns", 1, 1)));
        add(c, "worker of unknown instance", UnknownInstanceException.class, "instance 'nope' is not registered", t -> t.engine.registerWorker("nope", t.world.workers.get(0)));
        add(c, "worker of sealed instance", InvalidArgumentException.class, "already sealed", t -> t.engine.registerWorker("inst", t.world.workers.get(0)));
        add(c, "worker rank out of range", InvalidArgumentException.class, "worker rank 5 out of range [0, 2)", t -> t.engine.registerWorker("half", rank(t.half.workers.get(1), 5, 1)));
        add(c, "tp rank out of range", InvalidArgumentException.class, "tp rank 2 out of range [0, 2)", t -> t.engine.registerWorker("half", rank(t.half.workers.get(1), 1, 2)));
        add(c, "worker rank registered twice", InvalidArgumentException.class, "worker rank 0 of instance 'half' is already registered", t -> t.engine.registerWorker("half", t.half.workers.get(0)));
        add(c, "worker without layers", InvalidArgumentException.class, "registers no layers", t -> t.engine.registerWorker("half", new WorkerSpec(1, 1, 0, List.of())));
        add(c, "layer listed twice", InvalidArgumentException.class, "appears twice", t -> {
            LayerRegion r = t.half.workers.get(1).layers().get(0);
            t.engine.registerWorker("half", new WorkerSpec(1, 1, 0, List.of(r, r)));
        });
        add(c, "overlapping layers", InvalidArgumentException.class, "overlap in memory", t -> {
            LayerRegion r = t.half.workers.get(1).layers().get(0);
            LayerRegion shifted = new LayerRegion("other", r.layout(), r.baseAddress() + 64, r.regionBytes() - 64, r.numBlocks() - 1,
                    r.blockStride(), r.segmentBytes(), r.segmentOffset());
            t.engine.registerWorker("half", new WorkerSpec(1, 1, 0, List.of(r, shifted)));
        });
        add(c, "region past its bounds", InvalidArgumentException.class, "expected regionBytes >= 4096", t -> {
            LayerRegion r = t.half.workers.get(1).layers().get(0);
            t.engine.registerWorker("half", new WorkerSpec(1, 1, 0, List.of(new LayerRegion(r.layerName(), r.layout(),
                    r.baseAddress(), 100, r.numBlocks(), r.blockStride(), r.segmentBytes(), 0))));
        });
        add(c, "geometry differs across tp ranks", TopologyMismatchException.class, "expected the same geometry on every rank", t -> {
            List<LayerRegion> rs = new ArrayList<>();
            for (LayerRegion r : t.half.workers.get(1).layers()) {
                rs.add(new LayerRegion(r.layerName(), r.layout(), r.baseAddress(), r.regionBytes(), r.numBlocks() / 2,
                        r.blockStride(), r.segmentBytes() / 2, 0));
            }
            t.engine.registerWorker("half", new WorkerSpec(1, 1, 0, rs));
        });
        add(c, "tp rank missing for a layer", TopologyMismatchException.class,
                "layer 'model.layers.1.self_attn.attn' of instance 'half' has no worker for tp rank 1", t ->
                t.engine.registerWorker("half", new WorkerSpec(1, 1, 0, List.of(t.half.workers.get(1).layers().get(0)))));
        add(c, "two owners of one slot", TopologyMismatchException.class, "tp rank 0 of instance 'half' is registered by workers 0 and 1", t ->
                t.engine.registerWorker("half", rank(t.half.workers.get(1), 1, 0)));
        add(c, "save to unknown instance", UnknownInstanceException.class, "instance 'nope'", t -> t.engine.save("nope", 0, new long[] {0}, BlockHashes.of(new byte[][] {ok})));
        add(c, "save before sealing", RegistrationIncompleteException.class, "1 of 2 workers registered", t -> t.engine.save("half", 0, new long[] {0}, BlockHashes.of(new byte[][] {ok})));
        add(c, "save from unknown worker", UnknownInstanceException.class, "worker rank 7 is not registered", t -> t.engine.save("inst", 7, new long[] {0}, BlockHashes.of(new byte[][] {ok})));
        add(c, "save with null arrays", InvalidArgumentException.class, "must not be null", t -> t.engine.save("inst", 0, null, null));
        add(c, "save with mismatched lengths", InvalidArgumentException.class, "2 block ids but 1 hashes", t -> t.engine.save("inst", 0, new long[] {0, 1}, BlockHashes.of(new byte[][] {ok})));
        add(c, "save block id out of range", InvalidArgumentException.class, "blockIds[1] = 16 out of range [0, 16) for layer 'model.layers.0.self_attn.attn'", t ->
                t.engine.save("inst", 0, new long[] {3, 16}, BlockHashes.of(new byte[][] {ok, ok})));
        add(c, "save negative block id", InvalidArgumentException.class, "blockIds[0] = -1 out of range", t -> t.engine.save("inst", 0, new long[] {-1}, BlockHashes.of(new byte[][] {ok})));
        add(c, "save empty hash", InvalidArgumentException.class, "hashes[0] is 0 bytes; expected 1..64 bytes", t -> t.engine.save("inst", 0, new long[] {0}, BlockHashes.of(new byte[][] {new byte[0]})));
        add(c, "save oversized hash", InvalidArgumentException.class, "hashes[0] is 65 bytes", t -> t.engine.save("inst", 0, new long[] {0}, BlockHashes.of(new byte[][] {new byte[65]})));
        add(c, "save null hash", InvalidArgumentException.class, "hashes[0] is null", t -> t.engine.save("inst", 0, new long[] {0}, BlockHashes.of(new byte[][] {null})));
        add(c, "save unknown layer", InvalidArgumentException.class, "layer 'lm_head' is not registered by worker 0", t ->
                t.engine.save("inst", 0, List.of("lm_head"), new long[] {0}, BlockHashes.of(new byte[][] {ok}), 0));
        add(c, "query unknown instance", UnknownInstanceException.class, "instance 'nope'", t -> t.engine.query("nope", BlockHashes.of(new byte[][] {ok})));
        add(c, "query before sealing", RegistrationIncompleteException.class, "instance 'half' has 1 of 2", t -> t.engine.query("half", BlockHashes.of(new byte[][] {ok})));
        add(c, "query null hashes", InvalidArgumentException.class, "hashes must not be null", t -> t.engine.query("inst", null));
        add(c, "query bad hash", InvalidArgumentException.class, "hashes[1] is null", t -> t.engine.query("inst", BlockHashes.of(new byte[][] {ok, null})));
        add(c, "load unknown lease", UnknownLeaseException.class, "lease 00000000000000010000000000000002 is unknown", t ->
                t.engine.load("inst", 0, new Token(1, 2), new long[] {5}));
        add(c, "load wrong count", InvalidArgumentException.class, "2 destination block ids for 3 leased blocks", t ->
                t.engine.load("inst", 0, t.lease, new long[] {5, 6}));
        add(c, "load destination out of range", InvalidArgumentException.class, "dstBlockIds[2] = 99 out of range [0, 16)", t ->
                t.engine.load("inst", 0, t.lease, new long[] {5, 6, 99}));
        add(c, "load null lease", InvalidArgumentException.class, "must not be null", t -> t.engine.load("inst", 0, null, new long[] {1}));
        add(c, "release unknown lease", UnknownLeaseException.class, "is unknown", t -> t.engine.release("inst", new Token(3, 4)));
        add(c, "release null", InvalidArgumentException.class, "lease is null", t -> t.engine.release("inst", null));
        add(c, "lease of wrong length", InvalidArgumentException.class, "lease of 15 bytes; expected exactly 16 bytes", t -> Token.fromBytes(new byte[15]));
        add(c, "unregister unknown", UnknownInstanceException.class, "instance 'ghost'", t -> t.engine.unregisterInstance("ghost"));
        add(c, "bad pool size", InvalidArgumentException.class, "size '12 parsecs'", t -> EngineConfig.builder().poolSize("12 parsecs"));
        add(c, "tiny pool", InvalidArgumentException.class, "pool size 100 bytes", t -> EngineConfig.builder().poolBytes(100).build());
        return c.stream();
    }

    private static void add(List<Arguments> c, String name, Class<? extends PegaflowException> type, String message, Call call) {
        c.add(Arguments.of(name, type, message, call));
    }

    private static WorkerSpec rank(WorkerSpec w, int rank, int tpRank) {
        return new WorkerSpec(rank, tpRank, w.deviceId(), w.layers());
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("cases")
    void refusedWithATypedErrorAndNothingChanged(String name, Class<? extends PegaflowException> type, String message, Call call) {
        assertThatThrownBy(() -> call.run(this)).isInstanceOf(type).hasMessageContaining(message);
        assertThat(engine.stats().gauges()).isEqualTo(gaugesBefore);
        assertThat(engine.isSealed("half")).isFalse();
        engine.verifyInvariants();
    }

    @Test
    void errorCodesAreStable() {
        assertThat(new UnknownLeaseException("x").code().value()).isEqualTo(3);
        assertThat(new PoolExhaustedException("x").code().value()).isEqualTo(6);
    }

    /** Runs last by name order is not guaranteed, so it re-checks integrity on its own data. */
    @Test
    void savedBlocksStillLoadByteExactAfterRefusals() {
        cases().forEach(a -> {
            try {
                ((Call) a.get()[3]).run(this);
            } catch (PegaflowException expected) {
                // every case throws; we only care that nothing changed
            }
        });
        QueryResult q = engine.query("inst", BlockHashes.of(saved));
        assertThat(q.hitBlocks()).isEqualTo(3);
        for (WorkerSpec w : world.workers) {
            engine.load("inst", w.workerRank(), q.lease(), new long[] {10, 11, 12}).join();
        }
        for (int i = 0; i < 3; i++) {
            assertThat(world.holdsPattern(10 + i, saved[i])).isTrue();
        }
    }
}
