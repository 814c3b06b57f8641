package io.pegaflow.server;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;

import com.google.protobuf.ByteString;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.inprocess.InProcessServerBuilder;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.stub.StreamObserver;
import io.pegaflow.client.Errors;
import io.pegaflow.client.RemoteStore;
import io.pegaflow.client.Version;
import io.pegaflow.client.Wire;
import io.pegaflow.client.proto.BeginLoadRequest;
import io.pegaflow.client.proto.EndCopyRequest;
import io.pegaflow.client.proto.EngineGrpc;
import io.pegaflow.client.proto.HealthRequest;
import io.pegaflow.client.proto.QueryRequest;
import io.pegaflow.client.proto.RegisterInstanceRequest;
import io.pegaflow.client.proto.RegisterWorkerRequest;
import io.pegaflow.client.proto.ReserveSaveRequest;
import io.pegaflow.client.proto.SessionEvent;
import io.pegaflow.client.proto.SessionRequest;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.CopyPlan;
import io.pegaflow.engine.EngineStats;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.Limits;
import io.pegaflow.engine.PegaflowException;
import io.pegaflow.engine.TopologyMismatchException;
import io.pegaflow.engine.UnknownInstanceException;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.metrics.Gauge;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;
import org.assertj.core.api.ThrowableAssert.ThrowingCallable;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Every count and length a client supplies is capped ({@link Limits}): over the cap, the
 * request is refused with {@link InvalidArgumentException} naming the cap, nothing is
 * registered or changed, and the server goes on answering. Messages a client's input ends up
 * in stay bounded, and a message over the gRPC limit fails that call only. In-process
 * transport, except where Netty's limits are the point (a real loopback server).
 */
class CapsTest {
    @TempDir
    Path dir;

    private PegaflowServer server;
    private String name;
    private final List<ManagedChannel> channels = new ArrayList<>();
    private final Random rnd = new Random(5);

    @BeforeEach
    void start() throws Exception {
        name = "pegaflow-caps-" + System.nanoTime();
        server = PegaflowServer.start(config(), InProcessServerBuilder.forName(name).directExecutor());
    }

    private PegaflowServer.Config config() {
        return new PegaflowServer.Config("127.0.0.1:0", null, 4L << 20, dir.resolve("pool-" + System.nanoTime()),
                Duration.ofSeconds(600), Duration.ofMillis(100), true);
    }

    @AfterEach
    void stop() {
        channels.forEach(ManagedChannel::shutdownNow);
        server.close();
    }

    /** What the clients of one tenant here present, so its raw calls act for the instances its stores register. */
    private static final byte[] TENANT_SECRET = "caps-test-tenant-secret".getBytes(java.nio.charset.StandardCharsets.UTF_8);

    private RemoteStore store() {
        ManagedChannel c = InProcessChannelBuilder.forName(name).directExecutor().build();
        channels.add(c);
        return RemoteStore.over(c, name, 10_000, TENANT_SECRET);
    }

    /** A raw channel to the in-process server carrying its token and the tenant's join secret (a tenant of the host). */
    private io.grpc.Channel channel() {
        ManagedChannel c = InProcessChannelBuilder.forName(name).directExecutor().build();
        channels.add(c);
        return withToken(c, server);
    }

    private static io.grpc.Channel withToken(ManagedChannel c, PegaflowServer s) {
        try {
            io.grpc.Metadata auth = new io.grpc.Metadata();
            auth.put(io.pegaflow.client.Headers.AUTHORIZATION, "Bearer " + java.nio.file.Files.readString(
                    java.nio.file.Path.of(s.poolPath() + ".token")).trim());
            auth.put(io.pegaflow.client.Headers.JOIN_SECRET, java.util.HexFormat.of().formatHex(TENANT_SECRET));
            return io.grpc.ClientInterceptors.intercept(c, io.grpc.stub.MetadataUtils.newAttachHeadersInterceptor(auth));
        } catch (java.io.IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }

    /** A raw call (requests the Java client would refuse before sending), its failure typed as the client types it. */
    private <T> T raw(Function<EngineGrpc.EngineBlockingStub, T> call) {
        try {
            return call.apply(EngineGrpc.newBlockingStub(channel()).withDeadlineAfter(10, TimeUnit.SECONDS));
        } catch (StatusRuntimeException e) {
            throw Errors.fromStatus(e, name, 10_000);
        }
    }

    private static void assertCapped(ThrowingCallable call, String cap) {
        assertThatThrownBy(call).isInstanceOf(InvalidArgumentException.class).hasMessageContaining("(Limits." + cap + ")")
                .satisfies(e -> assertThat(e.getMessage().length()).isLessThan(Errors.MAX_MESSAGE_BYTES));
    }

    /** The server answers Health and its store is as {@code before} (gauges, open copies, invariants). */
    private void assertHealthyAndUnchanged(List<String> instances, EngineStats before, int openOperations) {
        try (RemoteStore s = store()) {
            assertThat(s.health().getServerVersion()).isEqualTo(Version.VERSION);
        }
        assertThat(server.store().instanceIds()).isEqualTo(instances);
        assertThat(server.store().stats().gauges()).isEqualTo(before.gauges());
        assertThat(server.store().openOperations()).isEqualTo(openOperations);
        server.store().verifyInvariants();
    }

    /** {@code n} one-block MLA layers at made-up, disjoint addresses (the server never touches them). */
    private static List<LayerRegion> layers(int n) {
        List<LayerRegion> out = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            out.add(new LayerRegion("layers." + i, KvLayout.MLA, (1L << 32) + i * 8192L, 4096, 1, 4096, 4096, 0));
        }
        return out;
    }

    private static io.pegaflow.client.proto.LayerRegion proto(LayerRegion r) {
        return io.pegaflow.client.proto.LayerRegion.newBuilder().setName(r.layerName())
                .setLayout(io.pegaflow.client.proto.KvLayout.MLA).setBaseAddress(r.baseAddress())
                .setRegionBytes(r.regionBytes()).setNumBlocks(r.numBlocks()).setBlockStride(r.blockStride())
                .setSegmentBytes(r.segmentBytes()).build();
    }

    private ByteString randomHashes(int n, int len) {
        byte[] b = new byte[n * len];
        rnd.nextBytes(b);
        return ByteString.copyFrom(b);
    }

    @Test
    void instanceSizesAndNamesAreCappedBeforeAnythingIsAllocated() {
        EngineStats before = server.store().stats();
        try (RemoteStore s = store()) {
            // Worker[2^28] was half the heap.
            assertCapped(() -> s.registerInstance(new InstanceSpec("huge", "ns", 1, 1 << 28)), "MAX_WORLD_SIZE");
            assertCapped(() -> s.registerInstance(new InstanceSpec("wide", "ns", 8192, 8192)), "MAX_TP_SIZE");
            assertCapped(() -> s.registerInstance(new InstanceSpec("x".repeat(4 << 20), "ns", 1, 1)), "MAX_NAME_BYTES");
            assertCapped(() -> s.registerInstance(new InstanceSpec("i", "n".repeat(Limits.MAX_NAME_BYTES + 1), 1, 1)),
                    "MAX_NAME_BYTES");
            // 129 chars, 258 bytes in UTF-8: the cap is on bytes.
            assertCapped(() -> s.registerInstance(new InstanceSpec("\u00e9".repeat(129), "ns", 1, 1)), "MAX_NAME_BYTES");
            s.registerInstance(new InstanceSpec("\u00e9".repeat(128), "ns", 1, Limits.MAX_WORLD_SIZE));
        }
        assertHealthyAndUnchanged(List.of("\u00e9".repeat(128)), before, 0);
    }

    @Test
    void registerWorkerCapsItsLayerListAndNamesBeforeBuildingRegions() {
        try (RemoteStore s = store()) {
            s.registerInstance(new InstanceSpec("w", "ns", 1, 1));
            EngineStats before = server.store().stats();
            List<LayerRegion> tooMany = layers(Limits.MAX_LAYERS_PER_WORKER + 1);
            RegisterWorkerRequest.Builder req = RegisterWorkerRequest.newBuilder().setInstanceId("w");
            tooMany.forEach(r -> req.addLayers(proto(r)));
            assertCapped(() -> raw(stub -> stub.registerWorker(req.build())), "MAX_LAYERS_PER_WORKER");
            assertCapped(() -> s.registerWorker("w", new WorkerSpec(0, 0, 0, tooMany)), "MAX_LAYERS_PER_WORKER");
            LayerRegion r = layers(1).get(0);
            assertCapped(() -> s.registerWorker("w", new WorkerSpec(0, 0, 0, List.of(new LayerRegion("l".repeat(300),
                    r.layout(), r.baseAddress(), r.regionBytes(), 1, r.blockStride(), r.segmentBytes(), 0)))), "MAX_NAME_BYTES");
            assertCapped(() -> s.registerWorker("w".repeat(1 << 20), new WorkerSpec(0, 0, 0, layers(1))), "MAX_NAME_BYTES");
            assertThat(s.isSealed("w")).isFalse();
            assertHealthyAndUnchanged(List.of("w"), before, 0);
            s.registerWorker("w", new WorkerSpec(0, 0, 0, layers(Limits.MAX_LAYERS_PER_WORKER)));
            assertThat(s.isSealed("w")).isTrue();
        }
    }

    @Test
    void slotsPerBlockAreCappedWhenTheInstanceSeals() {
        int tp = 8;
        int perWorker = Limits.MAX_SLOTS_PER_BLOCK / tp + 1;
        try (RemoteStore s = store()) {
            s.registerInstance(new InstanceSpec("slots", "ns", tp, tp));
            for (int rank = 0; rank < tp - 1; rank++) {
                s.registerWorker("slots", new WorkerSpec(rank, rank, rank, layers(perWorker)));
            }
            EngineStats before = server.store().stats();
            // Every block of this layout would hold 65,544 slot offsets and states.
            assertCapped(() -> s.registerWorker("slots", new WorkerSpec(tp - 1, tp - 1, 0, layers(perWorker))),
                    "MAX_SLOTS_PER_BLOCK");
            assertThat(s.isSealed("slots")).isFalse();
            assertHealthyAndUnchanged(List.of("slots"), before, 0);
        }
    }

    @Test
    void hashAndBlockIdCountsAreCappedBeforeTheyAreCopied() {
        int layers = 17;
        try (RemoteStore s = store()) {
            s.registerInstance(new InstanceSpec("h", "ns", 1, 1));
            s.registerWorker("h", new WorkerSpec(0, 0, 0, layers(layers)));
            EngineStats before = server.store().stats();
            int over = Limits.MAX_HASHES_PER_CALL + 1;
            assertCapped(() -> raw(stub -> stub.query(QueryRequest.newBuilder().setInstanceId("h")
                    .setHashes(randomHashes(over, 8)).setHashLen(8).build())), "MAX_HASHES_PER_CALL");
            assertCapped(() -> BlockHashes.of(new byte[over][8]), "MAX_HASHES_PER_CALL");
            assertCapped(() -> new BlockHashes(new byte[over * 8], 8), "MAX_HASHES_PER_CALL");
            List<Long> ids = new ArrayList<>(over);
            for (int i = 0; i < over; i++) {
                ids.add(0L);
            }
            assertCapped(() -> raw(stub -> stub.reserveSave(ReserveSaveRequest.newBuilder().setInstanceId("h")
                    .addAllBlockIds(ids).build())), "MAX_HASHES_PER_CALL");
            assertCapped(() -> raw(stub -> stub.beginLoad(BeginLoadRequest.newBuilder().setInstanceId("h")
                    .setLease(ByteString.copyFrom(new byte[16])).addAllDstBlockIds(ids).build())), "MAX_HASHES_PER_CALL");
            ReserveSaveRequest.Builder names = ReserveSaveRequest.newBuilder().setInstanceId("h");
            for (int i = 0; i <= Limits.MAX_LAYERS_PER_WORKER; i++) {
                names.addLayerNames("layers." + i);
            }
            assertCapped(() -> raw(stub -> stub.reserveSave(names.build())), "MAX_LAYERS_PER_WORKER");
            // Within the hash cap, but 262,144 blocks x 17 layers is a plan of 4.5M copies.
            int max = Limits.MAX_HASHES_PER_CALL;
            assertCapped(() -> raw(stub -> stub.reserveSave(ReserveSaveRequest.newBuilder().setInstanceId("h")
                    .addAllBlockIds(ids.subList(0, max)).setHashes(randomHashes(max, 8)).setHashLen(8).build())),
                    "MAX_PLAN_SLOTS");
            assertHealthyAndUnchanged(List.of("h"), before, 0);
            assertThat(server.store().stats().get(Counter.SAVE_REQUESTS)).isEqualTo(before.get(Counter.SAVE_REQUESTS));
        }
    }

    @Test
    void aSessionForAnOverlongIdIsRefused() throws Exception {
        CompletableFuture<Throwable> ended = new CompletableFuture<>();
        EngineGrpc.newStub(channel()).session(SessionRequest.newBuilder().setInstanceId("s".repeat(1 << 16)).build(),
                new StreamObserver<SessionEvent>() {
                    @Override
                    public void onNext(SessionEvent value) {}

                    @Override
                    public void onError(Throwable t) {
                        ended.complete(t);
                    }

                    @Override
                    public void onCompleted() {
                        ended.complete(null);
                    }
                });
        Throwable t = ended.get(10, TimeUnit.SECONDS);
        assertThat(t).isInstanceOf(StatusRuntimeException.class);
        assertThat(((StatusRuntimeException) t).getStatus().getCode()).isEqualTo(Status.Code.INVALID_ARGUMENT);
        assertThat(t).hasMessageContaining("(Limits.MAX_NAME_BYTES)");
    }

    /** A copy ended with negative bytes or nanos is refused and stays open: nothing was committed. */
    @Test
    void endCopyWithNegativeBytesChangesNothing() {
        try (RemoteStore s = store()) {
            s.registerInstance(new InstanceSpec("e", "ns", 1, 1));
            s.registerWorker("e", new WorkerSpec(0, 0, 0, List.of(
                    new LayerRegion("l", KvLayout.MLA, 1L << 32, 4 * 4096, 4, 4096, 4096, 0))));
            byte[] h = new byte[32];
            rnd.nextBytes(h);
            CopyPlan p = s.reserveSave("e", 0, null, new long[] {1}, BlockHashes.of(h));
            EngineStats before = server.store().stats();
            assertThatThrownBy(() -> s.endCopy("e", p.id(), true, -1, 0)).isInstanceOf(InvalidArgumentException.class)
                    .hasMessageContaining("bytes -1");
            assertThatThrownBy(() -> raw(stub -> stub.endCopy(EndCopyRequest.newBuilder().setInstanceId("e").setId(com.google.protobuf.ByteString.copyFrom(p.id().toBytes())).setOk(true)
                    .setBytes(4096).setNanos(-5).build()))).isInstanceOf(InvalidArgumentException.class)
                    .hasMessageContaining("nanos -5");
            assertHealthyAndUnchanged(List.of("e"), before, 1);
            assertThat(server.store().stats().counters()).isEqualTo(before.counters());
            assertThat(s.query("e", BlockHashes.of(h)).hitBlocks()).isZero();
            s.endCopy("e", p.id(), true, 4096, 1000);
            assertThat(server.store().stats().get(Gauge.RESIDENT_BLOCKS)).isEqualTo(1);
            assertThat(server.store().stats().get(Counter.SAVE_BYTES)).isEqualTo(4096);
        }
    }

    /** The overlap check is O(n log n): a worker at the layer cap, interleaved in one tensor, registers at once. */
    @Test
    void aWorkerAtTheLayerCapInterleavedInOneTensorRegistersPromptly() {
        int n = Limits.MAX_LAYERS_PER_WORKER;
        long slot = 64;
        List<LayerRegion> regions = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            regions.add(new LayerRegion("layers." + i, KvLayout.MLA, (1L << 32) + i * slot, 4 * n * slot, 4, n * slot, slot, 0));
        }
        try (RemoteStore s = store()) {
            s.registerInstance(new InstanceSpec("tensor", "ns", 1, 1));
            assertTimeoutPreemptively(Duration.ofSeconds(10), () -> {
                long t0 = System.nanoTime();
                s.registerWorker("tensor", new WorkerSpec(0, 0, 0, regions));
                System.out.printf("RegisterWorker of %d interleaved layers: %.0f ms%n", n, (System.nanoTime() - t0) / 1e6);
            });
            assertThat(s.isSealed("tensor")).isTrue();
            assertThat(s.health().getInstances()).isEqualTo(1);
        }
    }

    @Test
    void theLargestRequestsTheCapsAllowFitTheInboundLimit() {
        int hashes = Limits.MAX_HASHES_PER_CALL;
        ReserveSaveRequest.Builder save = ReserveSaveRequest.newBuilder().setInstanceId("i".repeat(Limits.MAX_NAME_BYTES))
                .setWorkerRank(Integer.MIN_VALUE).setHashes(ByteString.copyFrom(new byte[hashes * Limits.MAX_HASH_BYTES]))
                .setHashLen(Limits.MAX_HASH_BYTES);
        RegisterWorkerRequest.Builder worker = RegisterWorkerRequest.newBuilder().setInstanceId("i".repeat(Limits.MAX_NAME_BYTES))
                .setWorkerRank(Integer.MIN_VALUE).setTpRank(Integer.MIN_VALUE).setDeviceId(Integer.MIN_VALUE);
        for (int i = 0; i < hashes; i++) {
            save.addBlockIds(Long.MIN_VALUE);
        }
        for (int i = 0; i < Limits.MAX_LAYERS_PER_WORKER; i++) {
            save.addLayerNames("n".repeat(Limits.MAX_NAME_BYTES));
            worker.addLayers(io.pegaflow.client.proto.LayerRegion.newBuilder().setName("n".repeat(Limits.MAX_NAME_BYTES))
                    .setLayoutValue(Integer.MIN_VALUE).setBaseAddress(Long.MIN_VALUE).setRegionBytes(Long.MIN_VALUE)
                    .setNumBlocks(Integer.MIN_VALUE).setBlockStride(Long.MIN_VALUE).setSegmentBytes(Long.MIN_VALUE)
                    .setSegmentOffset(Long.MIN_VALUE));
        }
        System.out.printf("largest ReserveSave %d bytes, RegisterWorker %d bytes, limit %d%n",
                save.build().getSerializedSize(), worker.build().getSerializedSize(), Wire.MAX_REQUEST_BYTES);
        assertThat(save.build().getSerializedSize()).isLessThanOrEqualTo(Wire.MAX_REQUEST_BYTES);
        assertThat(worker.build().getSerializedSize()).isLessThanOrEqualTo(Wire.MAX_REQUEST_BYTES);
    }

    // ---------------------------------------------------------------- over Netty (real loopback)

    private PegaflowServer tcp() throws Exception {
        return PegaflowServer.start(config(), false);
    }

    private io.grpc.Channel loopback(PegaflowServer s) {
        ManagedChannel c = NettyChannelBuilder.forTarget("127.0.0.1:" + s.port()).usePlaintext().build();
        channels.add(c);
        return withToken(c, s);
    }

    @Test
    void aMessageOverTheInboundLimitFailsThatCallOnly() throws Exception {
        try (PegaflowServer s = tcp(); RemoteStore other = RemoteStore.connect("127.0.0.1:" + s.port(), 10_000, false)) {
            other.registerInstance(new InstanceSpec("other", "ns", 1, 1));
            EngineGrpc.EngineBlockingStub stub = EngineGrpc.newBlockingStub(loopback(s)).withDeadlineAfter(30, TimeUnit.SECONDS);
            int bytes = Wire.MAX_REQUEST_BYTES + (1 << 20);
            QueryRequest big = QueryRequest.newBuilder().setInstanceId("other").setHashLen(64)
                    .setHashes(ByteString.copyFrom(new byte[bytes / 64 * 64])).build();
            assertThatThrownBy(() -> stub.query(big)).isInstanceOfSatisfying(StatusRuntimeException.class,
                    e -> assertThat(e.getStatus().getCode()).isEqualTo(Status.Code.RESOURCE_EXHAUSTED));
            try {
                stub.query(big);
            } catch (StatusRuntimeException e) {
                PegaflowException typed = Errors.fromStatus(e, "loopback", 30_000);
                assertThat(typed).isInstanceOf(InvalidArgumentException.class).hasMessageContaining("refused the request");
            }
            assertThat(stub.health(HealthRequest.getDefaultInstance()).getInstances()).isEqualTo(1);
            assertThat(other.health().getInstances()).isEqualTo(1);
            assertThat(other.isSealed("other")).isFalse();
        }
    }

    /** A client's megabytes of input end in its own error, cut short; another client's errors stay typed. */
    @Test
    void errorMessagesStayBoundedWhateverAClientSends() throws Exception {
        try (PegaflowServer s = tcp(); RemoteStore honest = RemoteStore.connect("127.0.0.1:" + s.port(), 10_000, false)) {
            EngineGrpc.EngineBlockingStub stub = EngineGrpc.newBlockingStub(loopback(s)).withDeadlineAfter(30, TimeUnit.SECONDS);
            assertThatThrownBy(() -> {
                try {
                    stub.registerInstance(RegisterInstanceRequest.newBuilder().setClientVersion("v".repeat(1 << 20))
                            .setInstanceId("old").setNamespace("ns").setTpSize(1).setWorldSize(1).build());
                } catch (StatusRuntimeException e) {
                    throw Errors.fromStatus(e, "loopback", 30_000);
                }
            }).isInstanceOf(TopologyMismatchException.class).hasMessageContaining("PegaFlow version mismatch")
                    .satisfies(e -> assertThat(e.getMessage().length()).isLessThan(Errors.MAX_MESSAGE_BYTES));
            try (RemoteStore tenant = RemoteStore.connect("127.0.0.1:" + s.port(), 10_000, false)) {
                assertCapped(() -> tenant.registerInstance(new InstanceSpec("x".repeat(4 << 20), "ns", 1, 1)), "MAX_NAME_BYTES");
                for (int i = 0; i < 8; i++) {
                    tenant.registerInstance(new InstanceSpec(i + "\u00e9".repeat(127), "ns", 1, 1));
                }
                // This error lists the registered ids: 8 of 255 bytes, 763 each once percent-encoded.
                assertThatThrownBy(() -> honest.query("nope", BlockHashes.of(new byte[32])))
                        .isInstanceOf(UnknownInstanceException.class).hasMessageContaining("instance 'nope' is not registered");
                assertThat(honest.health().getInstances()).isEqualTo(8);
            }
        }
    }

    @Test
    void boundedCutsMessagesToTheLimitOncePercentEncoded() {
        assertThat(Errors.bounded("short, with % and \u00e9")).isEqualTo("short, with % and \u00e9");
        for (String unit : new String[] {"x", "%", "\u00e9", "\u4e2d", "\ud83d\ude00", "\n"}) {
            String huge = unit.repeat(1 << 18);
            String cut = Errors.bounded(huge);
            assertThat(cut).endsWith("...").startsWith(unit);
            assertThat(encodedLength(cut)).isLessThanOrEqualTo(Errors.MAX_MESSAGE_BYTES).isGreaterThan(Errors.MAX_MESSAGE_BYTES - 16);
            String description = Errors.toStatus(new InvalidArgumentException(huge)).getStatus().getDescription();
            assertThat(encodedLength(description)).isLessThanOrEqualTo(Errors.MAX_MESSAGE_BYTES);
        }
    }

    /** Length of {@code s} as grpc-message percent-encodes it. */
    private static int encodedLength(String s) {
        int n = 0;
        for (byte b : s.getBytes(java.nio.charset.StandardCharsets.UTF_8)) {
            n += b >= 0x20 && b < 0x7f && b != '%' ? 1 : 3;
        }
        return n;
    }
}
