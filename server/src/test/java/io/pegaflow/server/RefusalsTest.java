package io.pegaflow.server;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.grpc.CallOptions;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.stub.ClientCalls;
import io.grpc.stub.MetadataUtils;
import io.pegaflow.client.Headers;
import io.pegaflow.client.RemoteStore;
import io.pegaflow.client.Version;
import io.pegaflow.client.proto.Empty;
import io.pegaflow.client.proto.EngineGrpc;
import io.pegaflow.client.proto.RegisterInstanceRequest;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.PermissionDeniedException;
import io.pegaflow.engine.TopologyMismatchException;
import io.pegaflow.engine.UnknownInstanceException;
import io.pegaflow.engine.WorkerSpec;
import java.io.ByteArrayInputStream;
import java.io.InputStream;
import java.net.StandardProtocolFamily;
import java.net.URI;
import java.net.UnixDomainSocketAddress;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermission;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * What the server refuses before any tenant's state is touched, and how it says so: Shutdown
 * only with the operator's token; errors that name only the caller's own ids; ids with control
 * characters; a flood of malformed requests (no credential needed) answered INVALID_ARGUMENT,
 * counted, and logged once per interval; a local-socket connection that never authenticates
 * closed after {@link LocalSocketServer#AUTH_TIMEOUT}. A real loopback server.
 */
class RefusalsTest {
    @TempDir
    Path dir;

    private PegaflowServer server;
    private final List<ManagedChannel> channels = new ArrayList<>();

    @BeforeEach
    void start() throws Exception {
        server = PegaflowServer.start(new PegaflowServer.Config("127.0.0.1:0", "127.0.0.1:0", 4L << 20, dir.resolve("pool"),
                Duration.ofSeconds(600), Duration.ofMillis(100), true));
    }

    @AfterEach
    void stop() {
        channels.forEach(ManagedChannel::shutdownNow);
        server.close();
    }

    private String endpoint() {
        return "127.0.0.1:" + server.port();
    }

    private ManagedChannel channel() {
        ManagedChannel c = NettyChannelBuilder.forTarget(endpoint()).usePlaintext().build();
        channels.add(c);
        return c;
    }

    private EngineGrpc.EngineBlockingStub stub(String bearer) {
        Metadata h = new Metadata();
        h.put(Headers.AUTHORIZATION, "Bearer " + bearer);
        return EngineGrpc.newBlockingStub(channel()).withInterceptors(MetadataUtils.newAttachHeadersInterceptor(h))
                .withDeadlineAfter(10, TimeUnit.SECONDS);
    }

    private String file(String suffix) throws Exception {
        return Files.readString(Path.of(server.poolPath() + suffix)).trim();
    }

    @Test
    void shutdownNeedsTheOperatorsTokenNotTheTenantsOne() throws Exception {
        Path operator = Path.of(server.poolPath() + ".operator-token");
        assertThat(Files.getPosixFilePermissions(operator))
                .containsExactlyInAnyOrder(PosixFilePermission.OWNER_READ, PosixFilePermission.OWNER_WRITE);
        assertThat(file(".operator-token")).isNotEqualTo(file(".token"));
        assertThatThrownBy(() -> stub(file(".token")).shutdown(Empty.getDefaultInstance()))
                .isInstanceOfSatisfying(StatusRuntimeException.class, e -> {
                    assertThat(e.getStatus().getCode()).isEqualTo(Status.Code.PERMISSION_DENIED);
                    assertThat(e.getStatus().getDescription()).contains("operator token").contains(operator.toString());
                });
        try (RemoteStore tenant = RemoteStore.connect(endpoint(), 5000, false)) {
            assertThatThrownBy(() -> tenant.shutdownServer(file(".token"))).isInstanceOf(PermissionDeniedException.class);
            tenant.registerInstance(new InstanceSpec("still-here", "ns", 1, 1));
            assertThat(server.store().instanceIds()).containsExactly("still-here");
            tenant.shutdownServer(file(".operator-token"));
        }
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (Files.exists(server.poolPath()) && System.nanoTime() < deadline) {
            Thread.sleep(20);
        }
        assertThat(server.poolPath()).as("the operator stopped it").doesNotExist();
        assertThat(operator).as("its files go with it").doesNotExist();
    }

    @Test
    void errorsNameOnlyTheCallersOwnIdsAndLayouts() {
        MemorySegments m = new MemorySegments();
        try (RemoteStore a = RemoteStore.connect(endpoint(), 5000, false);
                RemoteStore b = RemoteStore.connect(endpoint(), 5000, false)) {
            a.registerInstance(new InstanceSpec("tenant-a-secret-name", "shared", 1, 1));
            a.registerWorker("tenant-a-secret-name", new WorkerSpec(0, 0, 0, List.of(m.mla("layer-of-a", 1024))));
            assertThatThrownBy(() -> b.query("nope", BlockHashes.EMPTY)).isInstanceOf(UnknownInstanceException.class)
                    .hasMessageContaining("instance 'nope' is not registered")
                    .hasMessageNotContaining("tenant-a-secret-name");
            b.registerInstance(new InstanceSpec("b", "shared", 1, 1));
            assertThatThrownBy(() -> b.registerWorker("b", new WorkerSpec(0, 0, 0, List.of(m.mla("layer-of-b", 2048)))))
                    .isInstanceOf(TopologyMismatchException.class).hasMessageContaining("namespace 'shared'")
                    .hasMessageContaining("layer-of-b").hasMessageNotContaining("layer-of-a")
                    .hasMessageNotContaining("tenant-a-secret-name");
        } finally {
            m.close();
        }
    }

    /** Native regions for workers' layers (never copied here). */
    private static final class MemorySegments implements AutoCloseable {
        private final java.lang.foreign.Arena arena = java.lang.foreign.Arena.ofShared();

        LayerRegion mla(String name, long segment) {
            long base = arena.allocate(4 * segment, 4096).address();
            return new LayerRegion(name, KvLayout.MLA, base, 4 * segment, 4, segment, segment, 0);
        }

        @Override
        public void close() {
            arena.close();
        }
    }

    @Test
    void instanceIdsWithControlCharactersAreRefusedAndInstancesStayValidJson() throws Exception {
        var tenant = stub(file(".token"));
        for (String id : List.of("a\u0000b", "line\nbreak", "bell\u0007", "sep\u2028")) {
            assertThatThrownBy(() -> tenant.registerInstance(RegisterInstanceRequest.newBuilder().setClientVersion(Version.VERSION)
                    .setInstanceId(id).setNamespace("ns").setTpSize(1).setWorldSize(1).build()))
                    .isInstanceOfSatisfying(StatusRuntimeException.class, e -> {
                        assertThat(e.getStatus().getCode()).isEqualTo(Status.Code.INVALID_ARGUMENT);
                        assertThat(e.getStatus().getDescription()).contains("instance id").contains("U+")
                                .contains("expected printable characters");
                    });
        }
        assertThatThrownBy(() -> new InstanceSpec("ok", "ns\r", 1, 1).validate()).isInstanceOf(InvalidArgumentException.class)
                .hasMessageContaining("U+000D");
        assertThat(server.store().instanceIds()).isEmpty();
        String body = HttpClient.newHttpClient().send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + server.httpPort()
                + "/instances")).header("Authorization", "Bearer " + file(".token")).build(),
                HttpResponse.BodyHandlers.ofString()).body();
        assertThat(body).isEqualTo("{\"ids\":\"plain\",\"instances\":[]}");
    }

    /** Collects the log records of the server's loggers and grpc-java's while it runs. */
    private static final class Captured extends Handler implements AutoCloseable {
        final List<LogRecord> records = java.util.Collections.synchronizedList(new ArrayList<>());
        private final Logger root = Logger.getLogger("");

        Captured() {
            root.addHandler(this);
        }

        @Override
        public void publish(LogRecord r) {
            records.add(r);
        }

        @Override
        public void flush() {}

        @Override
        public void close() {
            root.removeHandler(this);
        }

        long count(java.util.function.Predicate<LogRecord> p) {
            synchronized (records) {
                return records.stream().filter(p).count();
            }
        }
    }

    @Test
    void aThousandMalformedRequestsWithoutACredentialAreCountedAndLoggedOnce() throws Exception {
        MethodDescriptor.Marshaller<byte[]> bytes = new MethodDescriptor.Marshaller<>() {
            @Override
            public InputStream stream(byte[] value) {
                return new ByteArrayInputStream(value);
            }

            @Override
            public byte[] parse(InputStream in) {
                try {
                    return in.readAllBytes();
                } catch (java.io.IOException e) {
                    throw new java.io.UncheckedIOException(e);
                }
            }
        };
        MethodDescriptor<byte[], byte[]> health = EngineGrpc.getHealthMethod().toBuilder(bytes, bytes).build();
        ManagedChannel c = channel();
        try (Captured log = new Captured()) {
            for (int i = 0; i < 1000; i++) {
                assertThatThrownBy(() -> ClientCalls.blockingUnaryCall(c, health, CallOptions.DEFAULT
                        .withDeadlineAfter(10, TimeUnit.SECONDS), new byte[] {(byte) 0xff, (byte) 0xff, (byte) 0xff}))
                        .isInstanceOfSatisfying(StatusRuntimeException.class, e -> {
                            assertThat(e.getStatus().getCode()).isEqualTo(Status.Code.INVALID_ARGUMENT);
                            assertThat(e.getStatus().getDescription()).startsWith("malformed Health request");
                        });
            }
            assertThat(EngineGrpc.newBlockingStub(c).health(io.pegaflow.client.proto.HealthRequest.getDefaultInstance())
                    .getServerVersion()).as("a good request is still answered").isEqualTo(Version.VERSION);
            assertThat(log.count(r -> r.getLevel().intValue() >= Level.SEVERE.intValue())).as("no SEVERE line").isZero();
            assertThat(log.count(r -> r.getThrown() != null)).as("no stack trace").isZero();
            assertThat(log.count(r -> String.valueOf(r.getMessage()).startsWith("refused requests"))).as("one line per 10 s")
                    .isBetween(1L, 2L);
        }
        String metrics = HttpClient.newHttpClient().send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:"
                + server.httpPort() + "/metrics")).build(), HttpResponse.BodyHandlers.ofString()).body();
        assertThat(metrics).contains("pegaflow_rejected_requests_total{reason=\"malformed\"} 1000.0");
    }

    @Test
    void aLocalSocketConnectionThatNeverAuthenticatesIsClosedAfterTheAuthTimeout() throws Exception {
        try (SocketChannel idle = SocketChannel.open(StandardProtocolFamily.UNIX);
                java.nio.channels.Selector selector = java.nio.channels.Selector.open()) {
            idle.connect(UnixDomainSocketAddress.of(Path.of(server.poolPath() + ".sock")));
            idle.configureBlocking(false);
            idle.register(selector, java.nio.channels.SelectionKey.OP_READ);
            long t0 = System.nanoTime();
            selector.select(LocalSocketServer.AUTH_TIMEOUT.toMillis() + 5_000); // until the server closes it
            int n = idle.read(ByteBuffer.allocate(1));
            long ms = (System.nanoTime() - t0) / 1_000_000;
            assertThat(n).as("closed by the server").isEqualTo(-1);
            assertThat(ms).isGreaterThanOrEqualTo(LocalSocketServer.AUTH_TIMEOUT.toMillis() - 100)
                    .isLessThan(LocalSocketServer.AUTH_TIMEOUT.toMillis() + 5_000);
        }
        try (RemoteStore honest = RemoteStore.connect(endpoint(), 5000)) {
            honest.registerInstance(new InstanceSpec("honest", "ns", 1, 1));
            assertThatThrownBy(() -> honest.query("honest", BlockHashes.EMPTY))
                    .isInstanceOf(io.pegaflow.engine.RegistrationIncompleteException.class);
            assertThat(honest.localCalls()).as("an authenticated idle client keeps its connection").isEqualTo(1);
            Thread.sleep(LocalSocketServer.AUTH_TIMEOUT.toMillis() + 500);
            assertThatThrownBy(() -> honest.query("honest", BlockHashes.EMPTY))
                    .isInstanceOf(io.pegaflow.engine.RegistrationIncompleteException.class);
            assertThat(honest.localCalls()).isEqualTo(2);
        }
    }
}
