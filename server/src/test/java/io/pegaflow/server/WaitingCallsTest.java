package io.pegaflow.server;

import static org.assertj.core.api.Assertions.assertThat;

import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.stub.MetadataUtils;
import io.grpc.stub.StreamObserver;
import io.pegaflow.client.Headers;
import io.pegaflow.client.proto.Empty;
import io.pegaflow.client.proto.EngineGrpc;
import io.pegaflow.client.proto.FlushRequest;
import io.pegaflow.client.proto.HealthRequest;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.store.RemoteTier;
import io.pegaflow.engine.pool.HostPool;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Flush waits on the cluster registry (up to four Redis timeouts while Redis is down). Here a
 * registry that does not answer until the test lets it: while four Flushes wait, every other
 * client is answered at once (the handlers run on Netty's event-loop threads, which a waiting
 * Flush used to hold), and a Flush beyond the waiting pool and its queue is refused naming the
 * cap. A real loopback server.
 */
class WaitingCallsTest {
    @TempDir
    Path dir;

    private PegaflowServer server;
    private HostPool mapped;
    private final CountDownLatch registryAnswers = new CountDownLatch(1);
    private final List<ManagedChannel> channels = new ArrayList<>();

    /** A registry whose flush waits (at most 30 s) until the test releases it. */
    private final class StalledRegistry implements RemoteTier {
        @Override
        public boolean missed(String namespace, BlockHashes hashes, int from) {
            return false;
        }

        @Override
        public void resident(String namespace, byte[] hash) {}

        @Override
        public void evicted(String namespace, byte[] hash) {}

        @Override
        public void flush() throws Exception {
            if (!registryAnswers.await(30, TimeUnit.SECONDS)) {
                throw new java.util.concurrent.TimeoutException("the test never released the registry");
            }
        }
    }

    @BeforeEach
    void start() throws Exception {
        // one tenant sends every Flush here: its calls-in-flight quota above what the pool holds
        server = PegaflowServer.start(new PegaflowServer.Config("127.0.0.1:0", null, 4L << 20, dir.resolve("pool"),
                Duration.ofSeconds(600), Duration.ofMillis(100), true).withTenancy(Tenancy.DEFAULTS.calls(1000)), false);
        mapped = HostPool.shared(server.poolPath(), 4L << 20, false);
        server.store().attachRemote(new StalledRegistry(), mapped.segment());
    }

    @AfterEach
    void stop() {
        registryAnswers.countDown();
        channels.forEach(ManagedChannel::shutdownNow);
        server.close();
        mapped.close();
    }

    /** A new connection (its own event loop, round robin) with the tenants' token. */
    private EngineGrpc.EngineStub client() throws Exception {
        ManagedChannel c = NettyChannelBuilder.forTarget("127.0.0.1:" + server.port()).usePlaintext().build();
        channels.add(c);
        Metadata h = new Metadata();
        h.put(Headers.AUTHORIZATION, "Bearer " + Files.readString(Path.of(server.poolPath() + ".token")).trim());
        return EngineGrpc.newStub(c).withInterceptors(MetadataUtils.newAttachHeadersInterceptor(h));
    }

    @Test
    void waitingFlushesHoldNoOtherClientAndOneBeyondThePoolIsRefused() throws Exception {
        int flushes = EngineService.WAITING_THREADS + EngineService.MAX_WAITING_CALLS + 1;
        ConcurrentLinkedQueue<Throwable> failed = new ConcurrentLinkedQueue<>();
        CountDownLatch ended = new CountDownLatch(flushes);
        List<EngineGrpc.EngineStub> waiters = new ArrayList<>();
        for (int i = 0; i < EngineService.WAITING_THREADS; i++) {
            waiters.add(client()); // each on its own connection: one per event loop
        }
        StreamObserver<Empty> observer = new StreamObserver<>() {
            @Override
            public void onNext(Empty value) {}

            @Override
            public void onError(Throwable t) {
                failed.add(t);
                ended.countDown();
            }

            @Override
            public void onCompleted() {
                ended.countDown();
            }
        };
        for (EngineGrpc.EngineStub w : waiters) {
            w.withDeadlineAfter(60, TimeUnit.SECONDS).flush(FlushRequest.getDefaultInstance(), observer);
        }
        Thread.sleep(200); // the four reach the registry
        // every event loop has a waiting Flush's connection; other clients are still answered at once
        for (int i = 0; i < 8; i++) {
            EngineGrpc.EngineBlockingStub other = EngineGrpc.newBlockingStub(client().getChannel())
                    .withDeadlineAfter(2, TimeUnit.SECONDS);
            assertThat(other.health(HealthRequest.getDefaultInstance()).getServerVersion()).isNotEmpty();
        }
        for (int i = waiters.size(); i < flushes; i++) {
            waiters.get(i % waiters.size()).withDeadlineAfter(60, TimeUnit.SECONDS).flush(FlushRequest.getDefaultInstance(),
                    observer);
        }
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (failed.isEmpty() && System.nanoTime() < deadline) {
            Thread.sleep(10);
        }
        assertThat(failed).as("the flush beyond the pool and its queue").hasSize(1);
        StatusRuntimeException refused = (StatusRuntimeException) failed.peek();
        assertThat(refused.getStatus().getCode()).isEqualTo(Status.Code.RESOURCE_EXHAUSTED);
        assertThat(refused.getStatus().getDescription()).contains("EngineService.MAX_WAITING_CALLS");
        assertThat(ended.getCount()).as("the flushes are still waiting").isEqualTo(flushes - 1);
        registryAnswers.countDown();
        assertThat(ended.await(30, TimeUnit.SECONDS)).isTrue();
        assertThat(failed).as("the waiting flushes all succeeded").hasSize(1);
    }
}
