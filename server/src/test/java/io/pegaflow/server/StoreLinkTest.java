package io.pegaflow.server;

import static org.assertj.core.api.Assertions.assertThat;

import io.grpc.ForwardingServerCallListener;
import io.grpc.Metadata;
import io.grpc.ServerCall;
import io.grpc.ServerCallHandler;
import io.grpc.ServerInterceptor;
import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.inprocess.InProcessServerBuilder;
import io.pegaflow.client.EngineClient;
import io.pegaflow.client.RemoteStore;
import io.pegaflow.client.StoreLink;
import io.pegaflow.connector.SchedulerSide;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.ServerUnavailableException;
import io.pegaflow.engine.WorkerSpec;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The store link's reconnect state machine against real servers on grpc-java's in-process
 * transport, on a fake clock (the test calls {@link StoreLink#tick}): a server absent at
 * start, one stalled past the deadline, one restarted with a new id, and one that forgot the
 * instance while keeping its id. A scheduler brain on the link shows what vLLM would see:
 * misses while detached, hits once attached.
 */
class StoreLinkTest {
    private static final Duration INTERVAL = Duration.ofSeconds(1);
    private static final int BLOCK = 16;
    private static final int BLOCKS = 16;
    private static final int SEG = 1024;
    private static final InstanceSpec INSTANCE = new InstanceSpec("vllm", "ns", 1, 1);

    @TempDir
    Path dir;

    private final Arena arena = Arena.ofShared();
    private final List<PegaflowServer> servers = new ArrayList<>();
    private final Random rnd = new Random(7);
    /** The in-process name clients reach, or null: no server answers. */
    private volatile String current;
    /** While set, every call waits here (a stalled server: SIGSTOP). */
    private volatile CountDownLatch stall;
    private long now;
    private StoreLink link;
    private WorkerSpec worker;

    @BeforeEach
    void regions() {
        MemorySegment m = arena.allocate(2L * BLOCKS * SEG, 64);
        worker = new WorkerSpec(0, 0, 0, List.of(new LayerRegion("layers.0", KvLayout.SPLIT_KV, m.address(), m.byteSize(),
                BLOCKS, SEG, SEG, (long) BLOCKS * SEG)));
    }

    @AfterEach
    void stop() {
        CountDownLatch s = stall;
        if (s != null) {
            s.countDown();
        }
        if (link != null) {
            link.close();
        }
        servers.forEach(PegaflowServer::close);
        arena.close();
    }

    private final ServerInterceptor stallable = new ServerInterceptor() {
        @Override
        public <Q, R> ServerCall.Listener<Q> interceptCall(ServerCall<Q, R> call, Metadata headers,
                ServerCallHandler<Q, R> next) {
            ServerCall.Listener<Q> delegate = next.startCall(call, headers);
            return new ForwardingServerCallListener.SimpleForwardingServerCallListener<>(delegate) {
                @Override
                public void onHalfClose() {
                    CountDownLatch s = stall;
                    if (s != null) {
                        try {
                            s.await(10, TimeUnit.SECONDS);
                        } catch (InterruptedException e) {
                            Thread.currentThread().interrupt();
                        }
                    }
                    super.onHalfClose();
                }
            };
        }
    };

    private PegaflowServer startServer(String name) throws Exception {
        PegaflowServer.Config config = new PegaflowServer.Config("127.0.0.1:0", "127.0.0.1:0", 4L << 20,
                dir.resolve(name + ".pool"), Duration.ofSeconds(600), Duration.ofMillis(100), true);
        PegaflowServer s = PegaflowServer.start(config, InProcessServerBuilder.forName(name).intercept(stallable));
        servers.add(s);
        current = name;
        return s;
    }

    /** The production connector's shape over the in-process transport. */
    private EngineClient.Connection connect(String endpoint, java.util.function.Function<io.pegaflow.engine.pool.HostPool,
            io.pegaflow.engine.transfer.TransferEngine> transfer, long deadlineMs) {
        String name = current;
        if (name == null) {
            throw new ServerUnavailableException("no server answers at " + endpoint, null);
        }
        return EngineClient.open(RemoteStore.over(InProcessChannelBuilder.forName(name).build(), name, deadlineMs), transfer);
    }

    private StoreLink open() {
        StoreLink.Settings settings = new StoreLink.Settings("server", "127.0.0.1:50055", "4mb", 1, 1500, INTERVAL);
        link = StoreLink.open(settings, this::connect, () -> now);
        return link;
    }

    /** Opens the link on the current server, registers the worker, and returns a scheduler brain on it. */
    private SchedulerSide attach() {
        open();
        link.registerWorker(INSTANCE, worker, StoreLink.Copier.HOST);
        return new SchedulerSide(link, "vllm", BLOCK, true);
    }

    private void tick() {
        now += INTERVAL.toNanos();
        link.tick(now);
    }

    private BlockHashes saveTwoBlocks() {
        byte[] packed = new byte[64];
        rnd.nextBytes(packed);
        BlockHashes h = new BlockHashes(packed, 32);
        link.binding().engine().save(INSTANCE.instanceId(), 0, new long[] {0, 1}, h).join();
        link.binding().engine().flush(10_000); // the scheduler is another client: visible after the barrier
        return h;
    }

    private static long lookup(SchedulerSide sched, String request, BlockHashes h) {
        return sched.lookup(request, h, 2L * BLOCK + 1, 0);
    }

    @Test
    void absentAtStartIsAMissUntilTheServerAnswersThenRegistrationsAreReplayed() throws Exception {
        open();
        assertThat(link.mode()).isEqualTo(StoreLink.Mode.SERVER);
        assertThat(link.hasEngine()).isFalse();
        link.registerWorker(INSTANCE, worker, StoreLink.Copier.HOST); // recorded, not an error
        SchedulerSide sched = new SchedulerSide(link, "vllm", BLOCK, true);
        byte[] packed = new byte[64];
        assertThat(lookup(sched, "r0", new BlockHashes(packed, 32))).as("no server: a miss").isZero();
        tick();
        assertThat(link.hasEngine()).as("still nobody there").isFalse();

        PegaflowServer server = startServer("a");
        tick();
        assertThat(link.hasEngine()).isTrue();
        assertThat(server.store().instanceIds()).as("the recorded registration was replayed").containsExactly("vllm");
        BlockHashes h = saveTwoBlocks();
        assertThat(lookup(sched, "r1", h)).isEqualTo(2L * BLOCK);
    }

    @Test
    void aServerStalledPastTheDeadlineDetachesThenTheSameClientIsReattached() throws Exception {
        PegaflowServer server = startServer("a");
        SchedulerSide sched = attach();
        BlockHashes h = saveTwoBlocks();
        assertThat(lookup(sched, "r1", h)).isEqualTo(2L * BLOCK);
        StoreLink.Status before = link.status();
        PegaEngine client = link.binding().engine();

        stall = new CountDownLatch(1);
        tick();
        assertThat(link.status().detached()).as("one late answer: the store slowed down, the cache stays on").isFalse();
        tick();
        StoreLink.Status stalled = link.status();
        assertThat(stalled.detached()).as("late twice in a row: detached").isTrue();
        assertThat(link.hasEngine()).as("lookups miss at once instead of waiting").isFalse();
        assertThat(stalled.generation()).as("the client is kept").isEqualTo(before.generation());
        long t0 = System.nanoTime();
        assertThat(lookup(sched, "r2", h)).isZero();
        assertThat(System.nanoTime() - t0).as("no deadline wait").isLessThan(TimeUnit.MILLISECONDS.toNanos(1000));

        stall.countDown();
        stall = null;
        tick();
        StoreLink.Status back = link.status();
        assertThat(back.detached()).isFalse();
        assertThat(back.generation()).isEqualTo(before.generation());
        assertThat(back.serverId()).isEqualTo(before.serverId());
        assertThat(link.binding().engine()).as("the same client").isSameAs(client);
        assertThat(server.store().instanceIds()).containsExactly("vllm");
        assertThat(lookup(sched, "r1", h)).as("the probe of the same generation is still good").isEqualTo(2L * BLOCK);
        assertThat(lookup(sched, "r3", h)).isEqualTo(2L * BLOCK);
    }

    @Test
    void aServerRestartedWithANewIdGetsANewClientAndTheRegistrationsAgain() throws Exception {
        PegaflowServer first = startServer("a");
        SchedulerSide sched = attach();
        BlockHashes h = saveTwoBlocks();
        assertThat(lookup(sched, "r1", h)).isEqualTo(2L * BLOCK);
        StoreLink.Status before = link.status();

        first.close();
        current = null;
        tick();
        assertThat(link.status().detached()).isTrue();
        assertThat(lookup(sched, "r2", h)).isZero();

        PegaflowServer second = startServer("b");
        tick();
        StoreLink.Status after = link.status();
        assertThat(after.detached()).isFalse();
        assertThat(after.serverId()).isNotEqualTo(before.serverId());
        assertThat(after.generation()).isGreaterThan(before.generation());
        assertThat(second.store().instanceIds()).containsExactly("vllm");
        assertThat(lookup(sched, "r1", h)).as("a new pool: the old blocks are gone").isZero();
        BlockHashes again = saveTwoBlocks();
        assertThat(lookup(sched, "r3", again)).isEqualTo(2L * BLOCK);
    }

    @Test
    void anInstanceTheServerForgotIsRegisteredAgainOnTheSameClient() throws Exception {
        PegaflowServer server = startServer("a");
        SchedulerSide sched = attach();
        BlockHashes h = saveTwoBlocks();
        StoreLink.Status before = link.status();

        server.store().unregisterInstance("vllm"); // what the server does when it thinks the client died
        assertThat(lookup(sched, "r1", h)).as("unknown instance: a miss, no exception").isZero();
        tick();
        assertThat(server.store().instanceIds()).as("registered again").containsExactly("vllm");
        StoreLink.Status after = link.status();
        assertThat(after.generation()).as("same server, same client").isEqualTo(before.generation());
        assertThat(after.detached()).isFalse();
        assertThat(lookup(sched, "r2", h)).as("the cached blocks stayed").isEqualTo(2L * BLOCK);
    }

    @Test
    void ticksBeforeTheIntervalDoNothing() throws Exception {
        PegaflowServer server = startServer("a");
        open();
        link.registerWorker(INSTANCE, worker, StoreLink.Copier.HOST);
        tick();
        server.store().unregisterInstance("vllm");
        link.tick(now + INTERVAL.toNanos() / 2);
        assertThat(server.store().instanceIds()).as("not due yet").isEmpty();
        tick();
        assertThat(server.store().instanceIds()).containsExactly("vllm");
    }
}
