package io.pegaflow.server;

import io.pegaflow.engine.BlockHashes;

import io.pegaflow.client.RemoteStore;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.store.LocalStore;
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
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The local-socket fast path of a real TCP server: query and release answer through it (not
 * gRPC) with the same results and typed errors; a bad frame gets an error and the connection
 * keeps serving; a closed server falls back to gRPC, which fails within the deadline. Its
 * bounds: frames over the cap are refused before their payload (heap stays flat however much
 * is announced), connections over the cap are closed (their clients use gRPC), a frame that
 * stalls is dropped after the frame timeout.
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

    /**
     * --busy-poll-us: Health announces it, the local socket keeps answering (a thread spinning
     * for a next frame still serves it, and still notices its client leaving), a bad value is
     * refused with its name.
     */
    @Test
    void aBusyPollingServerAnswersOverTheLocalSocketAndSaysSoInHealth() throws Exception {
        server.close();
        server = PegaflowServer.start(new PegaflowServer.Config("127.0.0.1:0", null, 4L << 20, dir.resolve("pool"),
                Duration.ofSeconds(600), Duration.ofMillis(100), true), true, 5000);
        server.store().registerInstance(new InstanceSpec("inst", "ns", 1, 1));
        server.store().registerWorker("inst", new WorkerSpec(0, 0, 0,
                List.of(new LayerRegion("l", KvLayout.MLA, arena.allocate(8 * 4096, 4096).address(), 8 * 4096, 8, 4096, 4096, 0))));
        try (RemoteStore client = RemoteStore.connect("127.0.0.1:" + server.port(), 2000)) {
            assertThat(client.health().getBusyPollUs()).isEqualTo(5000);
            for (int i = 0; i < 20; i++) {
                QueryResult q = client.query("inst", BlockHashes.of(hashes));
                assertThat(q.hitBlocks()).isZero(); // a new store: nothing saved
                if (i % 5 == 0) {
                    Thread.sleep(8); // past the spin: the thread sleeps, and the next frame wakes it
                }
            }
            assertThat(client.localCalls()).isEqualTo(20);
            assertThat(client.localSpinMicros()).as("its clients spin for answers, up to 1 ms").isEqualTo(1000);
        }
        assertThatThrownBy(() -> PegaflowServer.start(new PegaflowServer.Config("127.0.0.1:0", null, 4L << 20,
                dir.resolve("other"), Duration.ofSeconds(600), Duration.ofMillis(100), true), true, -1))
                .isInstanceOf(io.pegaflow.engine.InvalidArgumentException.class).hasMessageContaining("--busy-poll-us -1");
    }

    @Test
    void aClientOfAServerThatDoesNotBusyPollSleepsForItsAnswers() throws Exception {
        try (RemoteStore client = RemoteStore.connect("127.0.0.1:" + server.port(), 2000)) {
            QueryResult q = client.query("inst", BlockHashes.of(hashes));
            client.release("inst", q.lease());
            assertThat(client.localCalls()).as("over the local socket").isEqualTo(2);
            assertThat(client.localSpinMicros()).as("PEGAFLOW_LOCAL_SPIN_US unset, the server not busy-polling").isZero();
        }
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
    void aWorkersCopyPlansAndTheirEndsGoOverTheLocalSocketAsRuns() {
        try (RemoteStore client = RemoteStore.connect("127.0.0.1:" + server.port(), 2000)) {
            long seg = 512;
            long base = arena.allocate(3 * 8 * seg, 4096).address();
            client.registerInstance(new InstanceSpec("w", "ns-w", 1, 1));
            List<LayerRegion> layers = List.of(new LayerRegion("a", KvLayout.MLA, base, 8 * seg, 8, seg, seg, 0),
                    new LayerRegion("b", KvLayout.MLA, base + 8 * seg, 8 * seg, 8, seg, seg, 0),
                    new LayerRegion("c", KvLayout.MLA, base + 16 * seg, 8 * seg, 8, seg, seg, 0));
            client.registerWorker("w", new WorkerSpec(0, 0, 0, layers));
            long before = client.localCalls();
            byte[][] h = {new byte[32], new byte[32], new byte[32]};
            h[1][0] = 1;
            h[2][0] = 2;
            CopyPlan save = client.reserveSave("w", 0, null, new long[] {5, 6, 7}, BlockHashes.of(h));
            // one run per block: each block's three slots lie back to back in the pool
            assertThat(save.runs()).isEqualTo(3);
            assertThat(save.runCount()).containsExactly(3, 3, 3);
            assertThat(save.slots()).isEqualTo(9);
            client.endCopy("w", save.id(), true, 9 * seg, 1);
            QueryResult q = client.query("w", BlockHashes.of(h));
            CopyPlan load = client.beginLoad("w", 0, q.lease(), new long[] {0, 1, 2});
            assertThat(load.runOffset()).containsExactly(save.runOffset());
            client.endCopy("w", load.id(), true, 9 * seg, 1);
            assertThat(client.localCalls() - before).isEqualTo(5); // reserve, end, query, begin, end
            // a load planned in parts: the head with the lease, the rest over the same socket
            CopyPlan head = client.beginLoad("w", 0, client.query("w", BlockHashes.of(h)).lease(), new long[] {0, 1, 2}, 1);
            assertThat(head.runBlock()).containsExactly(0);
            CopyPlan rest = client.planRest("w", 0, head.id(), 1, 3);
            assertThat(rest.runBlock()).containsExactly(1, 2);
            assertThat(rest.runOffset()).containsExactly(save.runOffset()[1], save.runOffset()[2]);
            client.endCopy("w", head.id(), true, 9 * seg, 1);
            assertThat(client.localCalls() - before).isEqualTo(9); // + query, begin, rest, end
            assertThatThrownBy(() -> client.endCopy("w", load.id(), true, 0, 0)).isInstanceOf(InvalidArgumentException.class)
                    .hasMessageContaining("unknown");
        }
    }

    @Test
    void aBadFrameIsAnsweredAndTheConnectionKeepsServing() throws Exception {
        try (SocketChannel c = SocketChannel.open(StandardProtocolFamily.UNIX)) {
            c.connect(UnixDomainSocketAddress.of(Path.of(dir.resolve("pool") + ".sock")));
            authenticate(c, socket());
            ByteBuffer bad = ByteBuffer.allocate(8).putInt(4).put((byte) 9).put(new byte[3]).flip();
            c.write(bad);
            ByteBuffer header = ByteBuffer.allocate(5);
            readFully(c, header);
            byte[] body = new byte[header.getInt(0) - 1];
            readFully(c, ByteBuffer.wrap(body));
            assertThat(header.get(4)).isEqualTo((byte) io.pegaflow.engine.ErrorCode.INVALID_ARGUMENT.value());
            assertThat(new String(body, StandardCharsets.UTF_8)).contains("method 9; expected 1 (query), 2 (release), 3 (auth), 4 (reserve save), 5 (begin load), 6 (end copy) or 7 (load rest)");
            byte[] query = io.pegaflow.client.proto.QueryRequest.newBuilder().setInstanceId("inst")
                    .setHashes(com.google.protobuf.ByteString.copyFrom(hashes[0])).setHashLen(32).build().toByteArray();
            c.write(ByteBuffer.allocate(5 + query.length).putInt(1 + query.length).put(LocalSocketServer.QUERY).put(query).flip());
            header.clear();
            readFully(c, header);
            byte[] answer = new byte[header.getInt(0) - 1];
            readFully(c, ByteBuffer.wrap(answer));
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

    // ---------------------------------------------------------------- bounds

    private Path socket() {
        return Path.of(dir.resolve("pool") + ".sock");
    }

    /** A raw connection that has passed the first frame (the server's token). */
    private static SocketChannel connect(Path sock) throws Exception {
        SocketChannel c = SocketChannel.open(StandardProtocolFamily.UNIX);
        c.connect(UnixDomainSocketAddress.of(sock));
        authenticate(c, sock);
        c.configureBlocking(false);
        return c;
    }

    private static final java.util.concurrent.atomic.AtomicLong CLIENTS = new java.util.concurrent.atomic.AtomicLong();

    /**
     * Sends the auth frame with the token beside the pool ({@code <pool>.sock} -> {@code <pool>.token})
     * and a client id of its own (each raw connection is a tenant of its own, within the
     * per-tenant connection quota).
     */
    private static void authenticate(SocketChannel c, Path sock) throws Exception {
        String s = sock.toString();
        Path tokenFile = Path.of(s.substring(0, s.length() - ".sock".length()) + ".token");
        byte[] token = Files.exists(tokenFile) ? (Files.readString(tokenFile).trim() + "\0"
                + String.format("%032x", CLIENTS.incrementAndGet())).getBytes(StandardCharsets.UTF_8) : new byte[0];
        c.write(ByteBuffer.allocate(5 + token.length).putInt(1 + token.length).put(LocalSocketServer.AUTH).put(token).flip());
        ByteBuffer header = ByteBuffer.allocate(5);
        readFully(c, header);
        readFully(c, ByteBuffer.allocate(header.getInt(0) - 1));
        assertThat(header.get(4)).as("the token is accepted").isZero();
    }

    @Test
    void aConnectionWithoutTheTokenIsRefusedAndClosed() throws Exception {
        try (SocketChannel c = SocketChannel.open(StandardProtocolFamily.UNIX)) {
            c.connect(UnixDomainSocketAddress.of(socket()));
            c.write(queryFrame("inst"));
            ByteBuffer header = ByteBuffer.allocate(5);
            readFully(c, header);
            byte[] body = new byte[header.getInt(0) - 1];
            readFully(c, ByteBuffer.wrap(body));
            assertThat(header.get(4)).isEqualTo((byte) io.pegaflow.engine.ErrorCode.PERMISSION_DENIED.value());
            assertThat(new String(body, StandardCharsets.UTF_8)).contains("first frame");
            assertThat(c.read(ByteBuffer.allocate(1))).as("closed").isEqualTo(-1);
        }
        try (SocketChannel c = SocketChannel.open(StandardProtocolFamily.UNIX)) {
            c.connect(UnixDomainSocketAddress.of(socket()));
            byte[] wrong = "0".repeat(64).getBytes(StandardCharsets.UTF_8);
            c.write(ByteBuffer.allocate(5 + wrong.length).putInt(1 + wrong.length).put(LocalSocketServer.AUTH).put(wrong).flip());
            ByteBuffer header = ByteBuffer.allocate(5);
            readFully(c, header);
            readFully(c, ByteBuffer.allocate(header.getInt(0) - 1));
            assertThat(header.get(4)).isEqualTo((byte) io.pegaflow.engine.ErrorCode.PERMISSION_DENIED.value());
        }
    }

    private static void send(SocketChannel c, ByteBuffer frame) throws Exception {
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (frame.hasRemaining()) {
            if (c.write(frame) == 0) {
                assertThat(System.nanoTime()).as("write within 10 s").isLessThan(deadline);
                Thread.sleep(1);
            }
        }
    }

    private static ByteBuffer header(int length, byte method, int extraBytes) {
        return ByteBuffer.allocate(5 + extraBytes).putInt(length).put(method).put(new byte[extraBytes]).flip();
    }

    private ByteBuffer queryFrame(String instance) {
        byte[] q = io.pegaflow.client.proto.QueryRequest.newBuilder().setInstanceId(instance)
                .setHashes(com.google.protobuf.ByteString.copyFrom(hashes[0])).setHashLen(32).build().toByteArray();
        return ByteBuffer.allocate(5 + q.length).putInt(1 + q.length).put(LocalSocketServer.QUERY).put(q).flip();
    }

    private record Answer(byte status, byte[] body) {
        String text() {
            return new String(body, StandardCharsets.UTF_8);
        }
    }

    /** The next answer on a non-blocking channel, or null when the server closed (or reset) it first; fails after 10 s. */
    private static Answer answer(SocketChannel c) throws Exception {
        try (Selector sel = Selector.open()) {
            c.register(sel, SelectionKey.OP_READ);
            long deadline = System.nanoTime() + 10_000_000_000L;
            ByteBuffer header = ByteBuffer.allocate(5);
            if (!fill(c, sel, header, deadline)) {
                return null;
            }
            ByteBuffer body = ByteBuffer.allocate(header.getInt(0) - 1);
            fill(c, sel, body, deadline);
            return new Answer(header.get(4), body.array());
        }
    }

    private static boolean fill(SocketChannel c, Selector sel, ByteBuffer buf, long deadline) throws Exception {
        while (buf.hasRemaining()) {
            int n;
            try {
                n = c.read(buf);
            } catch (java.io.IOException reset) {
                n = -1; // closed with our unread request bytes in its buffer: a reset, not an end of stream
            }
            if (n < 0) {
                assertThat(buf.position()).as("closed mid-answer").isZero();
                return false;
            }
            if (n == 0) {
                long left = (deadline - System.nanoTime()) / 1_000_000;
                assertThat(left).as("an answer or a close within 10 s").isPositive();
                sel.select(left);
                sel.selectedKeys().clear();
            }
        }
        return true;
    }

    private static long usedHeap() throws InterruptedException {
        Runtime rt = Runtime.getRuntime();
        for (int i = 0; i < 3; i++) {
            System.gc();
            Thread.sleep(50);
        }
        return rt.totalMemory() - rt.freeMemory();
    }

    /**
     * 40 connections announce 64 MiB frames (2.5 GiB in all; today's cap made the server
     * allocate each before a byte arrived, and it ran out of memory), 40 more announce frames at
     * the cap and send 1 KiB: the first get an error naming the cap before their payload is
     * read, the others cost what arrived, and an honest client is answered meanwhile.
     */
    @Test
    void framesOverTheCapAreRefusedAndAnnouncedBytesCostNothing() throws Exception {
        int n = 40;
        List<SocketChannel> open = new ArrayList<>();
        long before = usedHeap();
        try {
            for (int i = 0; i < n; i++) {
                SocketChannel c = connect(socket());
                open.add(c);
                send(c, header(64 << 20, LocalSocketServer.QUERY, 1024));
            }
            for (SocketChannel c : open) {
                Answer a = answer(c);
                assertThat(a).as("an error answer before the payload").isNotNull();
                assertThat(a.status()).isEqualTo((byte) io.pegaflow.engine.ErrorCode.INVALID_ARGUMENT.value());
                assertThat(a.text()).contains("frame of 67108864 bytes").contains("(Wire.MAX_FRAME)");
                assertThat(answer(c)).as("then the connection closes").isNull();
                c.close();
            }
            open.clear();
            for (int i = 0; i < n; i++) {
                SocketChannel c = connect(socket());
                open.add(c);
                send(c, header(LocalSocketServer.MAX_FRAME, LocalSocketServer.QUERY, 1024));
            }
            try (RemoteStore client = RemoteStore.connect("127.0.0.1:" + server.port(), 5000)) {
                QueryResult q = client.query("inst", BlockHashes.of(hashes));
                assertThat(q.hitBlocks()).isEqualTo(2);
                client.release("inst", q.lease());
                assertThat(client.localCalls()).as("answered over the local socket").isEqualTo(2);
                assertThat(client.health().getInstances()).isEqualTo(1);
            }
            long grown = usedHeap() - before;
            System.out.printf("heap grew %.1f MiB with %d x 64 MiB refused and %d x %d MiB frames announced%n",
                    grown / 1048576.0, n, n, LocalSocketServer.MAX_FRAME >> 20);
            assertThat(grown).as("heap growth, bytes").isLessThan(32L << 20);
        } finally {
            for (SocketChannel c : open) {
                c.close();
            }
        }
    }

    /** A raw connection whose first frame names client {@code client}; the first frame's status and text. */
    private static Answer hello(Path sock, String client, List<SocketChannel> keep) throws Exception {
        SocketChannel c = SocketChannel.open(StandardProtocolFamily.UNIX);
        keep.add(c);
        c.connect(UnixDomainSocketAddress.of(sock));
        byte[] token = (Files.readString(Path.of(sock.toString().replace(".sock", ".token"))).trim() + "\0" + client)
                .getBytes(StandardCharsets.UTF_8);
        c.write(ByteBuffer.allocate(5 + token.length).putInt(1 + token.length).put(LocalSocketServer.AUTH).put(token).flip());
        c.configureBlocking(false);
        return answer(c);
    }

    /** One tenant holds at most --max-calls-per-tenant connections; the next is refused naming it; another tenant is served. */
    @Test
    void aTenantsConnectionsAreCappedAndAnotherTenantIsServed() throws Exception {
        List<SocketChannel> held = new ArrayList<>();
        try {
            String one = "1".repeat(32);
            for (int i = 0; i < Tenancy.DEFAULTS.maxCallsPerTenant(); i++) {
                assertThat(hello(socket(), one, held).status()).isZero();
            }
            Answer refused = hello(socket(), one, held);
            assertThat(refused.status()).isEqualTo((byte) io.pegaflow.engine.ErrorCode.POOL_EXHAUSTED.value());
            assertThat(refused.text()).contains("--max-calls-per-tenant").contains("local-socket connections");
            assertThat(hello(socket(), "2".repeat(32), held).status()).as("another tenant").isZero();
            held.remove(0).close();
            long deadline = System.nanoTime() + 5_000_000_000L;
            byte status;
            do {
                Thread.sleep(20);
                status = hello(socket(), one, held).status();
            } while (status != 0 && System.nanoTime() < deadline);
            assertThat(status).as("a closed connection gives its slot back").isZero();
        } finally {
            for (SocketChannel c : held) {
                c.close();
            }
        }
    }

    /**
     * MAX_CONNECTIONS connections are served; the next is closed at accept (and logged), and a
     * client that meets a full server is answered over gRPC; a freed slot serves again.
     */
    @Test
    void connectionsOverTheCapAreClosedAndTheirClientsUseGrpc() throws Exception {
        LocalSocketServer local = server.localSocket();
        List<SocketChannel> held = new ArrayList<>();
        try {
            for (int i = 0; i < LocalSocketServer.MAX_CONNECTIONS; i++) {
                SocketChannel c = connect(socket());
                held.add(c);
                send(c, queryFrame("nope"));
                assertThat(answer(c).text()).contains("instance 'nope' is not registered");
            }
            SocketChannel extra = SocketChannel.open(StandardProtocolFamily.UNIX);
            extra.connect(UnixDomainSocketAddress.of(socket()));
            extra.configureBlocking(false);
            assertThat(answer(extra)).as("closed at accept").isNull();
            extra.close();
            assertThat(local.refusedConnections()).isEqualTo(1);
            long threads = Thread.getAllStackTraces().keySet().stream()
                    .filter(t -> t.getName().startsWith("pegaflow-local-conn-")).count();
            assertThat(threads).isLessThanOrEqualTo(LocalSocketServer.MAX_CONNECTIONS + 2);
            try (RemoteStore client = RemoteStore.connect("127.0.0.1:" + server.port(), 5000)) {
                QueryResult q = client.query("inst", BlockHashes.of(hashes));
                assertThat(q.hitBlocks()).isEqualTo(2);
                client.release("inst", q.lease());
                assertThat(client.localCalls()).as("answered over gRPC").isZero();
            }
            held.remove(0).close();
            assertThat(servedWithin(socket(), 5000)).as("a freed slot serves again").isTrue();
        } finally {
            for (SocketChannel c : held) {
                c.close();
            }
        }
    }

    /** Whether a new connection gets an answer within {@code ms} (a closing connection frees its slot just after). */
    private boolean servedWithin(Path sock, long ms) throws Exception {
        long deadline = System.nanoTime() + ms * 1_000_000;
        while (System.nanoTime() < deadline) {
            try (SocketChannel c = connect(sock)) {
                send(c, queryFrame("nope"));
                Answer a = answer(c);
                if (a != null) {
                    return a.text().contains("'nope'");
                }
            } catch (java.io.IOException refused) {
                // closed before the query was written
            }
            Thread.sleep(20);
        }
        return false;
    }

    /** A frame that stops arriving is dropped after the timeout; a connection idle between frames is not. */
    @Test
    void aFrameThatStallsIsDroppedAfterTheTimeoutAndIdleConnectionsStay() throws Exception {
        Path sock = dir.resolve("stall.sock");
        try (LocalSocketServer local = LocalSocketServer.start(sock, server.store(), null, null, 2, Duration.ofMillis(300))) {
            SocketChannel idle = connect(sock);
            SocketChannel stalled = connect(sock);
            send(stalled, header(101, LocalSocketServer.QUERY, 10));
            long t0 = System.nanoTime();
            assertThat(answer(stalled)).as("closed without an answer").isNull();
            System.out.printf("stalled frame dropped after %d ms%n", (System.nanoTime() - t0) / 1_000_000);
            stalled.close();
            Thread.sleep(400); // idle past the frame timeout
            send(idle, queryFrame("inst"));
            Answer a = answer(idle);
            assertThat(a.status()).isZero();
            io.pegaflow.client.proto.QueryResponse r = io.pegaflow.client.proto.QueryResponse.parseFrom(a.body());
            assertThat(r.getHitBlocks()).isEqualTo(1);
            server.store().release("inst", io.pegaflow.engine.Token.fromBytes(r.getLease().toByteArray()));
            assertThat(servedWithin(sock, 5000)).as("the stalled connection's slot serves again").isTrue();
            idle.close();
        }
    }

    /** A query over the frame cap goes over gRPC (the server would refuse the frame), with the same answer. */
    @Test
    void aQueryOverTheFrameCapGoesOverGrpc() {
        int n = LocalSocketServer.MAX_FRAME / 32 + 1000;
        byte[][] many = new byte[n][];
        java.util.Random rnd = new java.util.Random(3);
        for (int i = 0; i < n; i++) {
            many[i] = i < 2 ? hashes[i] : new byte[32];
            if (i >= 2) {
                rnd.nextBytes(many[i]);
            }
        }
        try (RemoteStore client = RemoteStore.connect("127.0.0.1:" + server.port(), 5000)) {
            QueryResult q = client.query("inst", BlockHashes.of(many));
            assertThat(q.hitBlocks()).isEqualTo(2);
            assertThat(client.localCalls()).isZero();
            client.release("inst", q.lease());
            assertThat(client.localCalls()).isEqualTo(1);
        }
    }

    /** Fills {@code buf} from a blocking channel; false at a clean end of stream before any byte. */
    static boolean readFully(SocketChannel c, ByteBuffer buf) throws java.io.IOException {
        boolean any = false;
        while (buf.hasRemaining()) {
            int n = c.read(buf);
            if (n < 0) {
                if (any) {
                    throw new java.io.IOException("connection closed mid-frame");
                }
                return false;
            }
            any |= n > 0;
        }
        return true;
    }
    /**
     * A connection whose key was cancelled under it (the server closing it, or the client gone)
     * ends as an IOException, which the connection's thread handles, not as an unchecked
     * CancelledKeyException escaping that thread (it reached stderr, breaking JSON logs).
     */
    @Test
    void aCancelledKeyEndsTheConnectionAsAnIoError() throws Exception {
        try (java.nio.channels.ServerSocketChannel listener = java.nio.channels.ServerSocketChannel.open()) {
            listener.bind(new java.net.InetSocketAddress(java.net.InetAddress.getLoopbackAddress(), 0));
            try (SocketChannel client = SocketChannel.open(listener.getLocalAddress());
                    SocketChannel served = listener.accept(); Selector selector = Selector.open()) {
                served.configureBlocking(false);
                SelectionKey key = served.register(selector, SelectionKey.OP_READ);
                LocalSocketServer.Conn conn = new LocalSocketServer.Conn(served, selector);
                LocalSocketServer.interest(conn, SelectionKey.OP_READ); // a live key: no error
                key.cancel();
                assertThatThrownBy(() -> LocalSocketServer.interest(conn, SelectionKey.OP_READ))
                        .isInstanceOf(java.io.IOException.class).hasMessageContaining("closed");
                served.close();
                assertThatThrownBy(() -> LocalSocketServer.interest(conn, SelectionKey.OP_READ))
                        .isInstanceOf(java.io.IOException.class);
            }
        }
    }
}
