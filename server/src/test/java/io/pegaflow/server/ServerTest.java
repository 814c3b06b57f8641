package io.pegaflow.server;

import io.pegaflow.engine.BlockHashes;

import io.pegaflow.client.RemoteStore;
import io.pegaflow.client.Version;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.grpc.ManagedChannel;
import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.inprocess.InProcessServerBuilder;
import io.pegaflow.engine.EngineStats;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.Token;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.RegistrationIncompleteException;
import io.pegaflow.engine.CopyResult;
import io.pegaflow.engine.TopologyMismatchException;
import io.pegaflow.engine.UnknownInstanceException;
import io.pegaflow.engine.UnknownLeaseException;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.metrics.Gauge;
import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.HostTransferEngine;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The service over the in-process transport (unique name per test): a worker engine attached
 * to the server copies through the shared pool byte-exactly; bad input comes back as the same
 * typed errors with nothing changed; a dead client's session releases its leases.
 */
class ServerTest {
    private static final int BLOCKS = 16;
    private static final int SEG = 4096;

    @TempDir
    Path dir;

    private PegaflowServer server;
    private String name;
    private final Arena arena = Arena.ofShared();
    private final Random rnd = new Random(11);

    @BeforeEach
    void start() throws Exception {
        name = "pegaflow-test-" + System.nanoTime();
        PegaflowServer.Config config = new PegaflowServer.Config("127.0.0.1:0", "127.0.0.1:0", 4L << 20,
                dir.resolve("pool"), Duration.ofSeconds(600), Duration.ofMillis(100), true);
        server = PegaflowServer.start(config, InProcessServerBuilder.forName(name).directExecutor());
    }

    @AfterEach
    void stop() {
        server.close();
        arena.close();
    }

    private RemoteStore store() {
        ManagedChannel channel = InProcessChannelBuilder.forName(name).directExecutor().build();
        return RemoteStore.over(channel, name, 5000);
    }

    private PegaEngine worker() {
        RemoteStore store = store();
        return PegaEngine.attach(store, HostPool.shared(server.poolPath(), 4L << 20, false), p -> new HostTransferEngine(p, 1));
    }

    /** Two layers, each [2, BLOCKS, SEG] (K of every block, then V). */
    private List<LayerRegion> regions() {
        MemorySegment a = arena.allocate(2L * BLOCKS * SEG, 64);
        MemorySegment b = arena.allocate(2L * BLOCKS * SEG, 64);
        return List.of(
                new LayerRegion("layers.0", KvLayout.SPLIT_KV, a.address(), a.byteSize(), BLOCKS, SEG, SEG, (long) BLOCKS * SEG),
                new LayerRegion("layers.1", KvLayout.SPLIT_KV, b.address(), b.byteSize(), BLOCKS, SEG, SEG, (long) BLOCKS * SEG));
    }

    private static byte[] block(List<LayerRegion> layers, long block) {
        byte[] out = new byte[layers.size() * 2 * SEG];
        int at = 0;
        for (LayerRegion r : layers) {
            for (int s = 0; s < 2; s++) {
                MemorySegment.copy(MemorySegment.ofAddress(r.pieceAddress(block, s)).reinterpret(SEG), ValueLayout.JAVA_BYTE, 0,
                        out, at, SEG);
                at += SEG;
            }
        }
        return out;
    }

    private void fill(List<LayerRegion> layers, long block) {
        for (LayerRegion r : layers) {
            for (int s = 0; s < 2; s++) {
                byte[] b = new byte[SEG];
                rnd.nextBytes(b);
                MemorySegment.copy(b, 0, MemorySegment.ofAddress(r.pieceAddress(block, s)).reinterpret(SEG), ValueLayout.JAVA_BYTE, 0, SEG);
            }
        }
    }

    private byte[][] hashes(int n) {
        byte[][] h = new byte[n][32];
        for (byte[] x : h) {
            rnd.nextBytes(x);
        }
        return h;
    }

    @Test
    void twoWorkerProcessesShareBlocksThroughTheServer() {
        try (PegaEngine a = worker(); PegaEngine b = worker()) {
            List<LayerRegion> ra = regions();
            List<LayerRegion> rb = regions();
            a.registerInstance(new InstanceSpec("vllm-a", "ns", 1, 1));
            a.registerWorker("vllm-a", new WorkerSpec(0, 0, 0, ra));
            b.registerInstance(new InstanceSpec("vllm-b", "ns", 1, 1));
            b.registerWorker("vllm-b", new WorkerSpec(0, 0, 0, rb));
            for (long blk = 0; blk < 3; blk++) {
                fill(ra, blk);
            }
            byte[][] h = hashes(3);
            CopyResult saved = a.save("vllm-a", 0, new long[] {0, 1, 2}, BlockHashes.of(h)).join();
            assertThat(saved.blocks()).isEqualTo(3);
            a.flush(10_000); // the visibility barrier: b is another client of the server
            QueryResult q = b.query("vllm-b", BlockHashes.of(h));
            assertThat(q.hitBlocks()).isEqualTo(3);
            b.load("vllm-b", 0, q.lease(), new long[] {7, 9, 11}).join();
            for (int i = 0; i < 3; i++) {
                assertThat(block(rb, new long[] {7, 9, 11}[i])).isEqualTo(block(ra, i));
            }
            b.flush(10_000); // b's load has ended with the server too
            EngineStats stats = server.store().stats();
            assertThat(stats.get(Gauge.RESIDENT_BLOCKS)).isEqualTo(3);
            assertThat(stats.get(Gauge.ACTIVE_LEASES)).isZero();
            server.store().verifyInvariants();
        }
    }

    @Test
    void badInputIsRefusedWithTheSameTypedErrorAndNothingChanges() {
        try (PegaEngine w = worker(); RemoteStore raw = store()) {
            List<LayerRegion> r = regions();
            w.registerInstance(new InstanceSpec("i", "ns", 1, 1));
            w.registerWorker("i", new WorkerSpec(0, 0, 0, r));
            EngineStats before = server.store().stats();
            assertThatThrownBy(() -> w.query("nope", BlockHashes.of(hashes(1)))).isInstanceOf(UnknownInstanceException.class)
                    .hasMessageContaining("instance 'nope' is not registered");
            assertThatThrownBy(() -> w.release("nope", new Token(1, 2))).isInstanceOf(UnknownLeaseException.class);
            assertThatThrownBy(() -> w.save("i", 0, new long[] {BLOCKS}, BlockHashes.of(hashes(1)))).isInstanceOf(InvalidArgumentException.class)
                    .hasMessageContaining("blockIds[0] = 16 out of range [0, 16)");
            assertThatThrownBy(() -> w.query("i", BlockHashes.of(new byte[][] {new byte[32], new byte[8]})))
                    .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("hashes[1] is 8 bytes");
            raw.registerInstance(new InstanceSpec("half", "ns2", 1, 2));
            assertThatThrownBy(() -> raw.query("half", BlockHashes.of(hashes(1)))).isInstanceOf(RegistrationIncompleteException.class);
            assertThatThrownBy(() -> raw.registerWorker("half", new WorkerSpec(0, 0, 0,
                    List.of(new LayerRegion("x", KvLayout.MLA, 4096, 100, 4, 64, 64, 0)))))
                    .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("regionBytes is 100");
            assertThat(server.store().stats().gauges()).isEqualTo(before.gauges());
            server.store().verifyInvariants();
        }
    }

    private String token() throws java.io.IOException {
        return Files.readString(Path.of(server.poolPath() + ".token")).trim();
    }

    private static io.grpc.Metadata auth(String value) {
        io.grpc.Metadata m = new io.grpc.Metadata();
        m.put(io.pegaflow.client.Headers.AUTHORIZATION, value);
        return m;
    }

    @Test
    void everyCallButHealthNeedsTheServersTokenAndTheTokenFileIsPrivate() throws Exception {
        assertThat(java.nio.file.Files.getPosixFilePermissions(Path.of(server.poolPath() + ".token")))
                .containsExactlyInAnyOrder(java.nio.file.attribute.PosixFilePermission.OWNER_READ,
                        java.nio.file.attribute.PosixFilePermission.OWNER_WRITE);
        io.grpc.ManagedChannel ch = InProcessChannelBuilder.forName(name).directExecutor().build();
        try {
            io.pegaflow.client.proto.EngineGrpc.EngineBlockingStub bare = io.pegaflow.client.proto.EngineGrpc.newBlockingStub(ch);
            assertThat(bare.health(io.pegaflow.client.proto.HealthRequest.getDefaultInstance()).getTokenPath())
                    .isEqualTo(server.poolPath() + ".token");
            var request = io.pegaflow.client.proto.RegisterInstanceRequest.newBuilder().setClientVersion(Version.VERSION)
                    .setInstanceId("x").setNamespace("ns").setTpSize(1).setWorldSize(1).build();
            for (var stub : List.of(bare, bare.withInterceptors(io.grpc.stub.MetadataUtils.newAttachHeadersInterceptor(
                    auth("Bearer " + "0".repeat(64)))))) {
                assertThatThrownBy(() -> stub.registerInstance(request)).hasMessageContaining("UNAUTHENTICATED");
                assertThatThrownBy(() -> stub.shutdown(io.pegaflow.client.proto.Empty.getDefaultInstance()))
                        .hasMessageContaining("UNAUTHENTICATED");
            }
            assertThat(server.store().instanceIds()).isEmpty();
            try (RemoteStore honest = store()) {
                assertThat(honest.health().getServerId()).isNotEmpty();
            }
        } finally {
            ch.shutdownNow();
        }
    }

    @Test
    void onlyTheRegistrantsOfAnInstanceMayUnregisterItOrHoldItsSession() throws Exception {
        try (PegaEngine victim = worker()) {
            victim.registerInstance(new InstanceSpec("victim", "ns", 1, 1));
            victim.registerWorker("victim", new WorkerSpec(0, 0, 0, regions()));
            io.grpc.Metadata h = auth("Bearer " + token());
            h.put(io.pegaflow.client.Headers.CLIENT_ID, "f".repeat(32));
            io.grpc.ManagedChannel ch = InProcessChannelBuilder.forName(name).directExecutor().build();
            try {
                var hostile = io.pegaflow.client.proto.EngineGrpc.newBlockingStub(ch)
                        .withInterceptors(io.grpc.stub.MetadataUtils.newAttachHeadersInterceptor(h));
                assertThatThrownBy(() -> hostile.unregisterInstance(io.pegaflow.client.proto.UnregisterInstanceRequest
                        .newBuilder().setInstanceId("victim").build())).hasMessageContaining("PERMISSION_DENIED")
                        .hasMessageContaining("did not register it");
                var session = hostile.session(io.pegaflow.client.proto.SessionRequest.newBuilder().setInstanceId("victim")
                        .setClientId("f".repeat(32)).build());
                assertThatThrownBy(session::hasNext).hasMessageContaining("PERMISSION_DENIED");
            } finally {
                ch.shutdownNow();
            }
            Thread.sleep(300); // past the session grace: a hijacked-then-cancelled session would have unregistered it
            assertThat(server.store().instanceIds()).containsExactly("victim");
            assertThat(victim.query("victim", BlockHashes.of(hashes(1))).hitBlocks()).isZero();
        }
    }

    /** A TP rank in another process joins the instance with its join secret, and so may hold the instance's session. */
    @Test
    void aProcessThatJoinsAnInstanceThroughItsWorkerHoldsItsSession() throws Exception {
        InstanceSpec spec = new InstanceSpec("tp2", "ns", 2, 2);
        RemoteStore rank0 = store();
        rank0.registerInstance(spec);
        rank0.registerWorker("tp2", new WorkerSpec(0, 0, 0, regions()));
        try (RemoteStore stranger = store()) {
            assertThatThrownBy(() -> stranger.registerInstance(spec)).as("no join secret")
                    .isInstanceOf(io.pegaflow.engine.PermissionDeniedException.class);
        }
        RemoteStore rank1 = RemoteStore.over(InProcessChannelBuilder.forName(name).directExecutor().build(), name, 5000,
                rank0.joinSecret("tp2"));
        try {
            rank1.registerInstance(spec); // exists: joins it with the secret rank 0 was handed
            rank1.registerWorker("tp2", new WorkerSpec(1, 1, 0, regions()));
            rank0.close(); // its session ends; rank 1's (the newest) keeps the instance
            Thread.sleep(400); // past the 100 ms grace
            assertThat(server.store().instanceIds()).containsExactly("tp2");
        } finally {
            rank1.close();
        }
        long deadline = System.nanoTime() + 5_000_000_000L;
        while (!server.store().instanceIds().isEmpty() && System.nanoTime() < deadline) {
            Thread.sleep(50);
        }
        assertThat(server.store().instanceIds()).as("the last session's end unregisters it").isEmpty();
    }

    @Test
    void aClientOfAnotherVersionIsRefusedClearly() throws Exception {
        try (RemoteStore raw = store()) {
            io.pegaflow.client.proto.EngineGrpc.EngineBlockingStub stub = io.pegaflow.client.proto.EngineGrpc.newBlockingStub(
                    InProcessChannelBuilder.forName(name).directExecutor().build()).withInterceptors(
                    io.grpc.stub.MetadataUtils.newAttachHeadersInterceptor(auth("Bearer " + token())));
            assertThatThrownBy(() -> stub.registerInstance(io.pegaflow.client.proto.RegisterInstanceRequest.newBuilder()
                    .setClientVersion("0.0.9").setInstanceId("old").setNamespace("ns").setTpSize(1).setWorldSize(1).build()))
                    .hasMessageContaining("FAILED_PRECONDITION")
                    .hasMessageContaining("PegaFlow version mismatch: client 0.0.9, server " + Version.VERSION);
            assertThat(server.store().instanceIds()).doesNotContain("old");
            assertThat(raw.health().getServerVersion()).isEqualTo(Version.VERSION);
        }
    }

    @Test
    void whenAClientsSessionEndsItsLeasesAreReleasedAndItsInstanceGoes() throws Exception {
        PegaEngine w = worker();
        List<LayerRegion> r = regions();
        w.registerInstance(new InstanceSpec("dies", "ns", 1, 1));
        w.registerWorker("dies", new WorkerSpec(0, 0, 0, r));
        fill(r, 0);
        byte[][] h = hashes(1);
        w.save("dies", 0, new long[] {0}, BlockHashes.of(h)).join();
        QueryResult q = w.query("dies", BlockHashes.of(h));
        assertThat(server.store().stats().get(Gauge.ACTIVE_LEASES)).isEqualTo(1);
        w.close(); // the session stream ends, as it does when the process dies
        long deadline = System.nanoTime() + Duration.ofSeconds(5).toNanos();
        while (server.store().instanceIds().contains("dies") && System.nanoTime() < deadline) {
            Thread.sleep(20);
        }
        assertThat(server.store().instanceIds()).doesNotContain("dies");
        assertThat(server.store().stats().get(Gauge.ACTIVE_LEASES)).isZero();
        assertThat(server.store().stats().get(Gauge.RESIDENT_BLOCKS)).as("the cache stays").isEqualTo(1);
        assertThat(server.sessionsCleaned()).isEqualTo(1);
        assertThat(q.hasLease()).isTrue();
    }

    @Test
    void healthMetricsAndInstancesOverHttp() throws Exception {
        try (PegaEngine w = worker()) {
            w.registerInstance(new InstanceSpec("web", "ns", 1, 1));
            w.registerWorker("web", new WorkerSpec(0, 0, 0, regions()));
            w.query("web", BlockHashes.of(hashes(2)));
            HttpClient http = HttpClient.newHttpClient();
            String base = "http://127.0.0.1:" + server.httpPort();
            HttpResponse<String> health = http.send(HttpRequest.newBuilder(URI.create(base + "/health")).build(),
                    HttpResponse.BodyHandlers.ofString());
            assertThat(health.statusCode()).isEqualTo(200);
            assertThat(health.body()).contains("\"status\":\"serving\"").contains("\"version\":\"" + Version.VERSION + "\"");
            String metrics = http.send(HttpRequest.newBuilder(URI.create(base + "/metrics")).build(),
                    HttpResponse.BodyHandlers.ofString()).body();
            assertThat(metrics).contains("pegaflow_rpc_requests_total{method=\"RegisterInstance\",status=\"OK\"} 1")
                    .contains("# TYPE pegaflow_pool_capacity_bytes gauge")
                    .contains("pegaflow_cache_block_hits_total")
                    .contains("pegaflow_save_transfer_seconds_total");
            assertThat(http.send(HttpRequest.newBuilder(URI.create(base + "/instances")).build(),
                    HttpResponse.BodyHandlers.ofString()).body()).as("ids hashed without the token")
                    .isEqualTo("{\"ids\":\"sha256\",\"instances\":[\"" + HttpEndpoints.sha256("web") + "\"]}");
            assertThat(http.send(HttpRequest.newBuilder(URI.create(base + "/instances")).header("Authorization", "Bearer "
                    + token()).build(), HttpResponse.BodyHandlers.ofString()).body())
                    .isEqualTo("{\"ids\":\"plain\",\"instances\":[\"web\"]}");
        }
        assertThat(Files.exists(server.poolPath())).isTrue();
    }
}
