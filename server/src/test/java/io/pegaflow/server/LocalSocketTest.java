package io.pegaflow.server;

import io.pegaflow.engine.BlockHashes;

import io.pegaflow.client.RemoteStore;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.LocalStore;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.CopyPlan;
import io.pegaflow.engine.ServerUnavailableException;
import io.pegaflow.engine.UnknownInstanceException;
import io.pegaflow.engine.UnknownLeaseException;
import io.pegaflow.engine.WorkerSpec;
import java.lang.foreign.Arena;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The local-socket fast path of a real TCP server: query and release answer through it (not
 * gRPC) with the same results and typed errors; a bad frame gets an error and the connection
 * keeps serving; a closed server falls back to gRPC, which fails within the deadline.
 */
class LocalSocketTest {
    @TempDir
    Path dir;

    private PegaflowServer server;
    private final Arena arena = Arena.ofShared();
    private byte[][] hashes;

    @BeforeEach
    void start() throws Exception {
        server = PegaflowServer.start(new PegaflowServer.Config("127.0.0.1:0", null, 4L << 20, dir.resolve("pool"),
                Duration.ofSeconds(600), Duration.ofMillis(100), true));
        LocalStore store = server.store();
        long seg = 4096;
        long base = arena.allocate(8 * seg, 4096).address();
        store.registerInstance(new InstanceSpec("inst", "ns", 1, 1));
        store.registerWorker("inst", new WorkerSpec(0, 0, 0,
                List.of(new LayerRegion("l", KvLayout.MLA, base, 8 * seg, 8, seg, seg, 0))));
        hashes = new byte[][] {new byte[32], new byte[32]};
        hashes[1][0] = 1;
        CopyPlan p = store.reserveSave("inst", 0, null, new long[] {0, 1}, BlockHashes.of(hashes));
        store.endCopy("inst", p.id(), true, 0, 0);
    }

    @AfterEach
    void stop() {
        if (server != null) {
            server.close();
        }
        arena.close();
    }

    @Test
    void queryAndReleaseGoOverTheLocalSocket() {
        assertThat(Files.exists(Path.of(dir.resolve("pool") + ".sock"))).isTrue();
        try (RemoteStore client = RemoteStore.connect("127.0.0.1:" + server.port(), 2000)) {
            QueryResult q = client.query("inst", BlockHashes.of(hashes));
            assertThat(q.hitBlocks()).isEqualTo(2);
            client.release("inst", q.lease());
            assertThat(client.localCalls()).isEqualTo(2);
            assertThatThrownBy(() -> client.release("inst", q.lease())).isInstanceOf(UnknownLeaseException.class)
                    .hasMessageContaining(q.lease().toString());
            assertThatThrownBy(() -> client.query("nope", BlockHashes.of(hashes))).isInstanceOf(UnknownInstanceException.class)
                    .hasMessageContaining("'nope'");
            assertThat(client.localCalls()).isEqualTo(4);
            assertThat(server.store().stats().get(io.pegaflow.engine.metrics.Gauge.ACTIVE_LEASES)).isZero();
        }
    }

    @Test
    void aBadFrameIsAnsweredAndTheConnectionKeepsServing() throws Exception {
        try (SocketChannel c = SocketChannel.open(StandardProtocolFamily.UNIX)) {
            c.connect(UnixDomainSocketAddress.of(Path.of(dir.resolve("pool") + ".sock")));
            ByteBuffer bad = ByteBuffer.allocate(8).putInt(4).put((byte) 9).put(new byte[3]).flip();
            c.write(bad);
            ByteBuffer header = ByteBuffer.allocate(5);
            LocalSocketServer.readFully(c, header);
            byte[] body = new byte[header.getInt(0) - 1];
            LocalSocketServer.readFully(c, ByteBuffer.wrap(body));
            assertThat(header.get(4)).isEqualTo((byte) io.pegaflow.engine.ErrorCode.INVALID_ARGUMENT.value());
            assertThat(new String(body, StandardCharsets.UTF_8)).contains("method 9; expected 1 (query) or 2 (release)");
            byte[] query = io.pegaflow.client.proto.QueryRequest.newBuilder().setInstanceId("inst")
                    .setHashes(com.google.protobuf.ByteString.copyFrom(hashes[0])).setHashLen(32).build().toByteArray();
            c.write(ByteBuffer.allocate(5 + query.length).putInt(1 + query.length).put(LocalSocketServer.QUERY).put(query).flip());
            header.clear();
            LocalSocketServer.readFully(c, header);
            byte[] answer = new byte[header.getInt(0) - 1];
            LocalSocketServer.readFully(c, ByteBuffer.wrap(answer));
            assertThat(header.get(4)).isZero();
            io.pegaflow.client.proto.QueryResponse r = io.pegaflow.client.proto.QueryResponse.parseFrom(answer);
            assertThat(r.getHitBlocks()).isEqualTo(1);
            server.store().release("inst", io.pegaflow.engine.Token.fromBytes(r.getLease().toByteArray()));
        }
    }

    @Test
    void aClosedServerFallsBackToGrpcAndFailsWithinTheDeadline() {
        try (RemoteStore client = RemoteStore.connect("127.0.0.1:" + server.port(), 1500)) {
            client.release("inst", client.query("inst", BlockHashes.of(hashes)).lease());
            server.close();
            server = null;
            long t0 = System.nanoTime();
            assertThatThrownBy(() -> client.query("inst", BlockHashes.of(hashes))).isInstanceOf(ServerUnavailableException.class);
            assertThat((System.nanoTime() - t0) / 1_000_000).isLessThan(3500);
        }
    }
}
