package io.pegaflow.server;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import com.google.protobuf.ByteString;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.stub.MetadataUtils;
import io.pegaflow.client.EngineClient;
import io.pegaflow.client.Headers;
import io.pegaflow.client.RemoteStore;
import io.pegaflow.client.Version;
import io.pegaflow.client.Wire;
import io.pegaflow.client.proto.BeginLoadRequest;
import io.pegaflow.client.proto.EndCopyRequest;
import io.pegaflow.client.proto.EngineGrpc;
import io.pegaflow.client.proto.LoadRestRequest;
import io.pegaflow.client.proto.QueryRequest;
import io.pegaflow.client.proto.RegisterInstanceRequest;
import io.pegaflow.client.proto.RegisterWorkerRequest;
import io.pegaflow.client.proto.ReleaseRequest;
import io.pegaflow.client.proto.ReserveSaveRequest;
import io.pegaflow.client.proto.SessionRequest;
import io.pegaflow.client.proto.UnregisterInstanceRequest;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.CopyPlan;
import io.pegaflow.engine.CopyResult;
import io.pegaflow.engine.ErrorCode;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.PermissionDeniedException;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.metrics.Gauge;
import io.pegaflow.engine.transfer.HostTransferEngine;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Identity bound to the caller: a tenant holding the server's token, with a client id of its
 * own, names the victim's instance on every data-path call (gRPC and the local socket) and
 * on registration. Each call is refused PERMISSION_DENIED before anything changes, and the
 * victim's blocks read back byte for byte afterwards. The processes of one instance join
 * with its join secret. A real loopback server with its local socket.
 */
class IdentityTest {
    private static final int BLOCKS = 8;
    private static final int SEG = 4096;
    private static final String ATTACKER = "a".repeat(32);

    @TempDir
    Path dir;

    private PegaflowServer server;
    private final Arena arena = Arena.ofShared();
    private final Random rnd = new Random(34);
    private final List<ManagedChannel> channels = new ArrayList<>();
    private final List<AutoCloseable> closing = new ArrayList<>();
    private RemoteStore victimStore;
    private PegaEngine victim;
    private List<LayerRegion> regions;

    @BeforeEach
    void start() throws Exception {
        server = PegaflowServer.start(new PegaflowServer.Config("127.0.0.1:0", null, 4L << 20, dir.resolve("pool"),
                Duration.ofSeconds(600), Duration.ofMillis(100), true));
        victimStore = RemoteStore.connect(endpoint(), 5000);
        victim = EngineClient.open(victimStore, p -> new HostTransferEngine(p, 1)).engine();
        regions = regions();
        victim.registerInstance(new InstanceSpec("victim", "ns", 1, 1));
        victim.registerWorker("victim", new WorkerSpec(0, 0, 0, regions));
    }

    @AfterEach
    void stop() throws Exception {
        channels.forEach(ManagedChannel::shutdownNow);
        for (AutoCloseable c : closing) {
            c.close();
        }
        victim.close();
        server.close();
        arena.close();
    }

    private String endpoint() {
        return "127.0.0.1:" + server.port();
    }

    private String token() throws Exception {
        return Files.readString(Path.of(server.poolPath() + ".token")).trim();
    }

    /** The attacker over gRPC: the server's token and a client id of its own. */
    private EngineGrpc.EngineBlockingStub attacker() throws Exception {
        return stub(ATTACKER, null);
    }

    private EngineGrpc.EngineBlockingStub stub(String client, String joinSecretHex) throws Exception {
        ManagedChannel c = NettyChannelBuilder.forTarget(endpoint()).usePlaintext().build();
        channels.add(c);
        Metadata h = new Metadata();
        h.put(Headers.AUTHORIZATION, "Bearer " + token());
        h.put(Headers.CLIENT_ID, client);
        if (joinSecretHex != null) {
            h.put(Headers.JOIN_SECRET, joinSecretHex);
        }
        return EngineGrpc.newBlockingStub(c).withInterceptors(MetadataUtils.newAttachHeadersInterceptor(h))
                .withDeadlineAfter(10, TimeUnit.SECONDS);
    }

    private static void denied(Runnable call) {
        assertThatThrownBy(call::run).isInstanceOfSatisfying(StatusRuntimeException.class,
                e -> {
                    assertThat(e.getStatus().getCode()).isEqualTo(Status.Code.PERMISSION_DENIED);
                    assertThat(e.getStatus().getDescription()).contains("'victim").doesNotContain(ATTACKER);
                });
    }

    private List<LayerRegion> regions() {
        MemorySegment a = arena.allocate(2L * BLOCKS * SEG, 64);
        return List.of(new LayerRegion("layers.0", KvLayout.SPLIT_KV, a.address(), a.byteSize(), BLOCKS, SEG, SEG,
                (long) BLOCKS * SEG));
    }

    private byte[] block(long b) {
        byte[] out = new byte[2 * SEG];
        LayerRegion r = regions.get(0);
        for (int s = 0; s < 2; s++) {
            MemorySegment.copy(MemorySegment.ofAddress(r.pieceAddress(b, s)).reinterpret(SEG), ValueLayout.JAVA_BYTE, 0,
                    out, s * SEG, SEG);
        }
        return out;
    }

    private byte[] fill(long b) {
        LayerRegion r = regions.get(0);
        for (int s = 0; s < 2; s++) {
            byte[] x = new byte[SEG];
            rnd.nextBytes(x);
            MemorySegment.copy(x, 0, MemorySegment.ofAddress(r.pieceAddress(b, s)).reinterpret(SEG), ValueLayout.JAVA_BYTE, 0,
                    SEG);
        }
        return block(b);
    }

    private byte[] hash() {
        byte[] h = new byte[32];
        rnd.nextBytes(h);
        return h;
    }

    /** The victim saves {@code src} under {@code h} (stored, not skipped), loads it into {@code dst}: same bytes. */
    private void victimSavesAndReadsBack(long src, byte[] h, long dst) {
        byte[] want = fill(src);
        CopyResult saved = victim.save("victim", 0, new long[] {src}, BlockHashes.of(new byte[][] {h})).join();
        assertThat(saved.skippedBlocks()).as("the victim's save was not pre-empted").isZero();
        assertThat(saved.blocks()).isEqualTo(1);
        assertVictimReadsBack(h, dst, want);
    }

    private void assertVictimReadsBack(byte[] h, long dst, byte[] want) {
        QueryResult q = victim.query("victim", BlockHashes.of(new byte[][] {h}));
        assertThat(q.hitBlocks()).isEqualTo(1);
        victim.load("victim", 0, q.lease(), new long[] {dst}).join();
        assertThat(block(dst)).as("the victim's bytes").isEqualTo(want);
    }

    @Test
    void aTenantWithTheTokenCannotReserveOrSealASaveAsAnotherInstance() throws Exception {
        var a = attacker();
        byte[] h = hash(); // the hash of a block the victim will save (vLLM's hashes are of tokens)
        denied(() -> a.reserveSave(ReserveSaveRequest.newBuilder().setInstanceId("victim").setWorkerRank(0).addBlockIds(0)
                .setHashes(ByteString.copyFrom(h)).setHashLen(32).build()));
        denied(() -> a.endCopy(EndCopyRequest.newBuilder().setInstanceId("victim").setId(ByteString.copyFrom(new byte[16]))
                .setOk(true).build()));
        assertThat(server.store().openOperations()).as("nothing reserved").isZero();
        assertThat(server.store().stats().get(Gauge.RESIDENT_BLOCKS)).isZero();
        victimSavesAndReadsBack(0, h, 5);
        server.store().verifyInvariants();
    }

    @Test
    void aTenantCannotEndAnotherInstancesOpenSave() throws Exception {
        var a = attacker();
        byte[] h = hash();
        CopyPlan open = victimStore.reserveSave("victim", 0, null, new long[] {2}, BlockHashes.of(new byte[][] {h}));
        // the plan's id leaked (a log, a shared process): naming the victim's instance does not help
        denied(() -> a.endCopy(EndCopyRequest.newBuilder().setInstanceId("victim").setId(ByteString.copyFrom(open.id().toBytes()))
                .setOk(true).build()));
        assertThat(server.store().openOperations()).as("the victim's save is still open").isEqualTo(1);
        victimStore.endCopy("victim", open.id(), false, 0, 0); // the victim rolls it back itself
        victimSavesAndReadsBack(2, h, 6);
    }

    @Test
    void aTenantCannotQueryLoadOrReleaseAsAnotherInstance() throws Exception {
        byte[] h = hash();
        victimSavesAndReadsBack(1, h, 4);
        byte[] want = block(1);
        var a = attacker();
        denied(() -> a.query(QueryRequest.newBuilder().setInstanceId("victim").setHashes(ByteString.copyFrom(h)).setHashLen(32)
                .build()));
        QueryResult leaked = victimStore.query("victim", BlockHashes.of(new byte[][] {h}));
        ByteString lease = ByteString.copyFrom(leaked.lease().toBytes());
        denied(() -> a.beginLoad(BeginLoadRequest.newBuilder().setInstanceId("victim").setWorkerRank(0).setLease(lease)
                .addDstBlockIds(7).build()));
        denied(() -> a.release(ReleaseRequest.newBuilder().setInstanceId("victim").setLease(lease).build()));
        denied(() -> a.loadRest(LoadRestRequest.newBuilder().setInstanceId("victim").setWorkerRank(0)
                .setId(ByteString.copyFrom(new byte[16])).setFromBlock(0).setToBlock(1).build()));
        assertThat(server.store().stats().get(Gauge.ACTIVE_LEASES)).as("the leaked lease is still the victim's").isEqualTo(1);
        victimStore.release("victim", leaked.lease());
        assertVictimReadsBack(h, 3, want);
    }

    @Test
    void aTenantCannotTakeAFreeTpRankRegisterUnregisterOrHoldTheSessionOfAnotherInstance() throws Exception {
        InstanceSpec spec = new InstanceSpec("victim-tp", "ns-tp", 2, 2);
        victim.registerInstance(spec);
        victim.registerWorker("victim-tp", new WorkerSpec(0, 0, 0, regions()));
        var a = stub(ATTACKER, null);
        var rank1 = io.pegaflow.client.proto.LayerRegion.newBuilder().setName("layers.0").setLayoutValue(0)
                .setBaseAddress(1L << 40).setRegionBytes(2L * BLOCKS * SEG).setNumBlocks(BLOCKS).setBlockStride(SEG)
                .setSegmentBytes(SEG).setSegmentOffset((long) BLOCKS * SEG).build();
        for (var s : List.of(a, stub(ATTACKER, "00".repeat(16)))) { // without a secret, and with a wrong one
            assertThatThrownBy(() -> s.registerWorker(RegisterWorkerRequest.newBuilder().setInstanceId("victim-tp")
                    .setWorkerRank(1).setTpRank(1).addLayers(rank1).build()))
                    .isInstanceOfSatisfying(StatusRuntimeException.class,
                            e -> assertThat(e.getStatus().getCode()).isEqualTo(Status.Code.PERMISSION_DENIED));
        }
        assertThatThrownBy(() -> a.registerInstance(RegisterInstanceRequest.newBuilder().setClientVersion(Version.VERSION)
                .setInstanceId("victim-tp").setNamespace("ns-tp").setTpSize(2).setWorldSize(2)
                .setJoinSecret(ByteString.copyFrom(new byte[16])).build()))
                .isInstanceOfSatisfying(StatusRuntimeException.class,
                        e -> assertThat(e.getStatus().getCode()).isEqualTo(Status.Code.PERMISSION_DENIED));
        denied(() -> a.unregisterInstance(UnregisterInstanceRequest.newBuilder().setInstanceId("victim").build()));
        var session = a.session(SessionRequest.newBuilder().setInstanceId("victim").setClientId(ATTACKER).build());
        assertThatThrownBy(session::hasNext).hasMessageContaining("PERMISSION_DENIED");
        assertThat(server.store().isSealed("victim-tp")).as("rank 1 is still free").isFalse();

        // the victim's own rank 1, another process, joins with the join secret its registration was handed
        byte[] secret = victimStore.joinSecret("victim-tp");
        assertThat(secret).hasSize(16);
        try (RemoteStore other = RemoteStore.connect(endpoint(), 5000, true, secret)) {
            other.registerInstance(spec);
            other.registerWorker("victim-tp", new WorkerSpec(1, 1, 0, regions()));
            assertThat(other.isSealed("victim-tp")).isTrue();
            Thread.sleep(300); // past the session grace: the refused session unregistered nothing
            assertThat(server.store().instanceIds()).contains("victim", "victim-tp");
        }
        victimSavesAndReadsBack(0, hash(), 7);
    }

    @Test
    void aSchedulerProcessActsForItsInstanceWithTheJoinSecretAndAnotherLaunchDoesNot() throws Exception {
        byte[] launch = "launch-secret-of-vllm-1".getBytes(StandardCharsets.UTF_8);
        try (RemoteStore worker = RemoteStore.connect(endpoint(), 5000, true, launch);
                RemoteStore scheduler = RemoteStore.connect(endpoint(), 5000, true, launch);
                RemoteStore otherLaunch = RemoteStore.connect(endpoint(), 5000, true,
                        "launch-secret-of-vllm-2".getBytes(StandardCharsets.UTF_8))) {
            worker.registerInstance(new InstanceSpec("vllm-1", "ns", 1, 1));
            assertThat(worker.joinSecret("vllm-1")).as("the creator's proposal").isEqualTo(launch);
            worker.registerWorker("vllm-1", new WorkerSpec(0, 0, 0, regions()));
            assertThat(scheduler.query("vllm-1", BlockHashes.EMPTY).hitBlocks()).isZero(); // over the local socket
            assertThat(scheduler.localCalls()).isEqualTo(1);
            assertThatThrownBy(() -> otherLaunch.query("vllm-1", BlockHashes.EMPTY))
                    .isInstanceOf(PermissionDeniedException.class).hasMessageContaining("instance 'vllm-1'");
            assertThatThrownBy(() -> otherLaunch.registerInstance(new InstanceSpec("vllm-1", "ns", 1, 1)))
                    .isInstanceOf(PermissionDeniedException.class);
        }
    }

    // ---------------------------------------------------------------- the local socket

    /** A raw local-socket connection that sent {@code hello} as its first frame; the answer's status. */
    private static byte exchange(SocketChannel c, byte method, byte[] body) throws Exception {
        c.write(ByteBuffer.allocate(5 + body.length).putInt(1 + body.length).put(method).put(body).flip());
        ByteBuffer header = ByteBuffer.allocate(5);
        while (header.hasRemaining()) {
            if (c.read(header) < 0) {
                throw new java.io.EOFException();
            }
        }
        ByteBuffer payload = ByteBuffer.allocate(header.getInt(0) - 1);
        while (payload.hasRemaining()) {
            if (c.read(payload) < 0) {
                throw new java.io.EOFException();
            }
        }
        return header.get(4);
    }

    @Test
    void theLocalSocketActsOnlyForTheInstancesOfTheClientItsFirstFrameNames() throws Exception {
        byte[] h = hash();
        victimSavesAndReadsBack(0, h, 5);
        byte[] want = block(0);
        assertThat(victimStore.localCalls()).as("the victim's calls took the local socket").isPositive();
        QueryResult leaked = victimStore.query("victim", BlockHashes.of(new byte[][] {h}));
        Path sock = Path.of(server.poolPath() + ".sock");
        byte denied = (byte) ErrorCode.PERMISSION_DENIED.value();
        for (String hello : List.of(token(), token() + "\0" + ATTACKER)) { // the old first frame, and one naming a client
            try (SocketChannel c = SocketChannel.open(StandardProtocolFamily.UNIX)) {
                c.connect(UnixDomainSocketAddress.of(sock));
                assertThat(exchange(c, Wire.AUTH, hello.getBytes(StandardCharsets.UTF_8))).isZero();
                assertThat(exchange(c, Wire.QUERY, QueryRequest.newBuilder().setInstanceId("victim")
                        .setHashes(ByteString.copyFrom(h)).setHashLen(32).build().toByteArray())).isEqualTo(denied);
                assertThat(exchange(c, Wire.RESERVE_SAVE, ReserveSaveRequest.newBuilder().setInstanceId("victim")
                        .addBlockIds(1).setHashes(ByteString.copyFrom(hash())).setHashLen(32).build().toByteArray()))
                        .isEqualTo(denied);
                assertThat(exchange(c, Wire.END_COPY, EndCopyRequest.newBuilder().setInstanceId("victim")
                        .setId(ByteString.copyFrom(new byte[16])).setOk(true).build().toByteArray())).isEqualTo(denied);
                assertThat(exchange(c, Wire.BEGIN_LOAD, BeginLoadRequest.newBuilder().setInstanceId("victim")
                        .setLease(ByteString.copyFrom(leaked.lease().toBytes())).addDstBlockIds(3).build().toByteArray()))
                        .isEqualTo(denied);
                assertThat(exchange(c, Wire.RELEASE, ReleaseRequest.newBuilder().setInstanceId("victim")
                        .setLease(ByteString.copyFrom(leaked.lease().toBytes())).build().toByteArray())).isEqualTo(denied);
            }
        }
        // the victim's read-back load ends beside its future: wait until this engine has told the server
        victim.localStore();
        assertThat(server.store().openOperations()).as("the attacker opened nothing").isZero();
        assertThat(server.store().stats().get(Gauge.ACTIVE_LEASES)).isEqualTo(1);
        victimStore.release("victim", leaked.lease());
        assertVictimReadsBack(h, 6, want);
    }

    @Test
    void aClientIdOrJoinSecretOutsideItsBoundsIsRefusedClearly() throws Exception {
        for (String[] bad : new String[][] {{"x".repeat(65), null}, {"bad id", null}, {ATTACKER, "zz".repeat(16)},
                {ATTACKER, "00".repeat(8)}}) {
            var s = stub(bad[0], bad[1]);
            assertThatThrownBy(() -> s.query(QueryRequest.newBuilder().setInstanceId("victim").build()))
                    .isInstanceOfSatisfying(StatusRuntimeException.class,
                            e -> assertThat(e.getStatus().getCode()).isEqualTo(Status.Code.INVALID_ARGUMENT));
        }
    }
}
