package io.pegaflow.server;

import com.google.protobuf.ByteString;
import com.google.protobuf.UnsafeByteOperations;
import io.grpc.ManagedChannel;
import io.grpc.StatusRuntimeException;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import io.pegaflow.engine.BlockStore;
import io.pegaflow.engine.EngineStats;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.LeaseId;
import io.pegaflow.engine.LoadPlan;
import io.pegaflow.engine.LoadResult;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.SavePlan;
import io.pegaflow.engine.SaveResult;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.metrics.Gauge;
import io.pegaflow.server.proto.BeginLoadRequest;
import io.pegaflow.server.proto.CommitSaveRequest;
import io.pegaflow.server.proto.Empty;
import io.pegaflow.server.proto.EndLoadRequest;
import io.pegaflow.server.proto.EngineGrpc;
import io.pegaflow.server.proto.HealthRequest;
import io.pegaflow.server.proto.HealthResponse;
import io.pegaflow.server.proto.KvLayout;
import io.pegaflow.server.proto.QueryRequest;
import io.pegaflow.server.proto.QueryResponse;
import io.pegaflow.server.proto.RegisterInstanceRequest;
import io.pegaflow.server.proto.RegisterWorkerRequest;
import io.pegaflow.server.proto.ReleaseRequest;
import io.pegaflow.server.proto.ReserveSaveRequest;
import io.pegaflow.server.proto.SessionEvent;
import io.pegaflow.server.proto.SessionRequest;
import io.pegaflow.server.proto.StatsRequest;
import io.pegaflow.server.proto.UnregisterInstanceRequest;
import java.util.EnumMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;

/**
 * The control plane of a pegaflow-server, as a {@link BlockStore}. Every call has a deadline;
 * an unreachable or slow server surfaces as {@link io.pegaflow.engine.ServerUnavailableException}
 * within it (never a hang), other failures as the server's own typed exception. Registering an
 * instance also opens its liveness session, which the server uses to clean up after this
 * process if it dies; the session is re-opened if the server restarts. The channel reconnects
 * by itself when the server comes back.
 */
public final class RemoteStore implements BlockStore {
    private final String endpoint;
    private final ManagedChannel channel;
    private final long deadlineMs;
    private final String clientId = UUID.randomUUID().toString();
    private final Map<String, ClientCallStreamObserver<SessionRequest>> sessions = new ConcurrentHashMap<>();
    private final LocalSocketClient local = new LocalSocketClient(this);

    private RemoteStore(String endpoint, ManagedChannel channel, long deadlineMs) {
        this.endpoint = endpoint;
        this.channel = channel;
        this.deadlineMs = deadlineMs;
    }

    /**
     * A client of the server at {@code HOST:PORT}; nothing is sent until the first call. Query
     * and release go over the server's local socket when it has one on this host (see
     * {@link LocalSocketServer}), everything else over gRPC.
     */
    public static RemoteStore connect(String endpoint, long deadlineMs) {
        return connect(endpoint, deadlineMs, true);
    }

    /** As {@link #connect(String, long)}; {@code localSocket} false sends every call over gRPC. */
    public static RemoteStore connect(String endpoint, long deadlineMs, boolean localSocket) {
        RemoteStore s = open(endpoint, deadlineMs);
        if (!localSocket) {
            s.local.close();
        }
        return s;
    }

    private static RemoteStore open(String endpoint, long deadlineMs) {
        PegaflowServer.hostPort(endpoint, "endpoint");
        if (deadlineMs <= 0) {
            throw new InvalidArgumentException("deadline " + deadlineMs + " ms; expected > 0");
        }
        ManagedChannel channel = NettyChannelBuilder.forTarget(endpoint).usePlaintext()
                .maxInboundMessageSize(64 << 20)
                .keepAliveTime(5, TimeUnit.SECONDS)
                .keepAliveTimeout(5, TimeUnit.SECONDS)
                .keepAliveWithoutCalls(true)
                .build();
        return new RemoteStore(endpoint, channel, deadlineMs);
    }

    /** Over a caller's channel (in-process transport in tests). */
    public static RemoteStore over(ManagedChannel channel, String name, long deadlineMs) {
        return new RemoteStore(name, channel, deadlineMs);
    }

    public String endpoint() {
        return endpoint;
    }

    long deadlineMs() {
        return deadlineMs;
    }

    /** Calls answered over the server's local socket instead of gRPC. */
    long localCalls() {
        return local.answered();
    }

    private <T> T call(Function<EngineGrpc.EngineBlockingStub, T> rpc) {
        try {
            return rpc.apply(EngineGrpc.newBlockingStub(channel).withDeadlineAfter(deadlineMs, TimeUnit.MILLISECONDS));
        } catch (StatusRuntimeException e) {
            throw Errors.fromStatus(e, endpoint, deadlineMs);
        }
    }

    public HealthResponse health() {
        return call(s -> s.health(HealthRequest.getDefaultInstance()));
    }

    @Override
    public void registerInstance(InstanceSpec spec) {
        call(s -> s.registerInstance(RegisterInstanceRequest.newBuilder().setClientVersion(Version.VERSION)
                .setInstanceId(spec.instanceId()).setNamespace(spec.namespace()).setTpSize(spec.tpSize())
                .setWorldSize(spec.worldSize()).build()));
        openSession(spec.instanceId());
    }

    /** The liveness stream: held open, never answered; the server notices when it breaks. */
    private void openSession(String instanceId) {
        ClientCallStreamObserver<SessionRequest> previous = sessions.remove(instanceId);
        if (previous != null) {
            previous.cancel("superseded", null);
        }
        EngineGrpc.newStub(channel).session(SessionRequest.newBuilder().setInstanceId(instanceId).setClientId(clientId).build(),
                new ClientResponseObserver<SessionRequest, SessionEvent>() {
                    @Override
                    public void beforeStart(ClientCallStreamObserver<SessionRequest> stream) {
                        sessions.put(instanceId, stream);
                    }

                    @Override
                    public void onNext(SessionEvent value) {}

                    @Override
                    public void onError(Throwable t) {
                        // The server went away or the session was cancelled; a later
                        // registerInstance (after a server restart) opens a new one.
                    }

                    @Override
                    public void onCompleted() {}
                });
    }

    @Override
    public void registerWorker(String instanceId, WorkerSpec worker) {
        RegisterWorkerRequest.Builder b = RegisterWorkerRequest.newBuilder().setInstanceId(instanceId)
                .setWorkerRank(worker.workerRank()).setTpRank(worker.tpRank()).setDeviceId(worker.deviceId());
        if (worker.layers() != null) {
            for (LayerRegion r : worker.layers()) {
                if (r == null) {
                    throw new InvalidArgumentException("worker " + worker.workerRank() + " of instance '" + instanceId
                            + "' has a null layer region");
                }
                b.addLayers(io.pegaflow.server.proto.LayerRegion.newBuilder().setName(r.layerName() == null ? "" : r.layerName())
                        .setLayout(switch (r.layout()) {
                            case SPLIT_KV -> KvLayout.SPLIT_KV;
                            case COMBINED -> KvLayout.COMBINED;
                            case MLA -> KvLayout.MLA;
                        })
                        .setBaseAddress(r.baseAddress()).setRegionBytes(r.regionBytes()).setNumBlocks(r.numBlocks())
                        .setBlockStride(r.blockStride()).setSegmentBytes(r.segmentBytes()).setSegmentOffset(r.segmentOffset()));
            }
        }
        call(s -> s.registerWorker(b.build()));
    }

    @Override
    public boolean isSealed(String instanceId) {
        // Sealed instances answer queries; an unsealed one is refused with REGISTRATION_INCOMPLETE.
        try {
            query(instanceId, new byte[0][]);
            return true;
        } catch (io.pegaflow.engine.RegistrationIncompleteException e) {
            return false;
        }
    }

    @Override
    public void unregisterInstance(String instanceId) {
        try {
            call(s -> s.unregisterInstance(UnregisterInstanceRequest.newBuilder().setInstanceId(instanceId).build()));
        } finally {
            ClientCallStreamObserver<SessionRequest> session = sessions.remove(instanceId);
            if (session != null) {
                session.cancel("unregistered", null);
            }
        }
    }

    static ByteString pack(byte[][] hashes) {
        return UnsafeByteOperations.unsafeWrap(packBytes(hashes)); // the array is ours and never written again
    }

    /** The hashes end to end (one length per call). */
    static byte[] packBytes(byte[][] hashes) {
        if (hashes == null) {
            throw new InvalidArgumentException("hashes must not be null");
        }
        if (hashes.length == 0) {
            return new byte[0];
        }
        int len = hashes[0] == null ? 0 : hashes[0].length;
        byte[] out = new byte[hashes.length * len];
        for (int i = 0; i < hashes.length; i++) {
            if (hashes[i] == null || hashes[i].length != len) {
                throw new InvalidArgumentException("hashes[" + i + "] is " + (hashes[i] == null ? "null" : hashes[i].length
                        + " bytes") + "; expected " + len + " bytes like hashes[0] (one length per call)");
            }
            System.arraycopy(hashes[i], 0, out, i * len, len);
        }
        return out;
    }

    private static int hashLen(byte[][] hashes) {
        return hashes.length == 0 || hashes[0] == null ? 0 : hashes[0].length;
    }

    @Override
    public SavePlan reserveSave(String instanceId, int workerRank, List<String> layerNames, long[] blockIds,
            byte[][] hashes) {
        if (blockIds == null || hashes == null) {
            throw new InvalidArgumentException("save: blockIds and hashes must not be null");
        }
        ReserveSaveRequest.Builder b = ReserveSaveRequest.newBuilder().setInstanceId(instanceId).setWorkerRank(workerRank)
                .setHashes(pack(hashes)).setHashLen(hashLen(hashes));
        if (layerNames != null) {
            b.addAllLayerNames(layerNames);
        }
        for (long id : blockIds) {
            b.addBlockIds(id);
        }
        io.pegaflow.server.proto.SavePlan p = call(s -> s.reserveSave(b.build()));
        int n = p.getHostOffsetCount();
        int[] blockIndex = new int[n];
        int[] regionIndex = new int[n];
        long[] hostOffset = new long[n];
        for (int k = 0; k < n; k++) {
            blockIndex[k] = p.getBlockIndex(k);
            regionIndex[k] = p.getRegionIndex(k);
            hostOffset[k] = p.getHostOffset(k);
        }
        return new SavePlan(p.getReservationId(), p.getSkippedBlocks(), p.getPlannedBlocks(), blockIndex, regionIndex, hostOffset);
    }

    @Override
    public SaveResult commitSave(long reservationId, boolean ok, long bytes, long nanos) {
        io.pegaflow.server.proto.SaveResult r = call(s -> s.commitSave(CommitSaveRequest.newBuilder()
                .setReservationId(reservationId).setOk(ok).setBytes(bytes).setNanos(nanos).build()));
        return new SaveResult(r.getSavedBlocks(), 0, r.getBytes());
    }

    @Override
    public QueryResult query(String instanceId, byte[][] hashes) {
        return query(instanceId, packBytes(hashes), hashLen(hashes));
    }

    @Override
    public QueryResult query(String instanceId, byte[] packed, int hashLen) {
        if (packed == null) {
            throw new InvalidArgumentException("query: hashes must not be null");
        }
        QueryRequest req = QueryRequest.newBuilder().setInstanceId(instanceId)
                .setHashes(UnsafeByteOperations.unsafeWrap(packed)).setHashLen(hashLen).build();
        byte[] fast = local.call(LocalSocketServer.QUERY, req);
        QueryResponse r;
        if (fast != null) {
            try {
                r = QueryResponse.parseFrom(fast);
            } catch (com.google.protobuf.InvalidProtocolBufferException e) {
                throw new io.pegaflow.engine.PegaflowException(io.pegaflow.engine.ErrorCode.INTERNAL,
                        "malformed answer on the local socket: " + e.getMessage());
            }
        } else {
            r = call(s -> s.query(req));
        }
        return new QueryResult(r.getHitBlocks(), r.getLease().isEmpty() ? null : LeaseId.fromBytes(r.getLease().toByteArray()));
    }

    @Override
    public void release(LeaseId lease) {
        if (lease == null) {
            throw new InvalidArgumentException("release: lease is null");
        }
        ReleaseRequest req = ReleaseRequest.newBuilder().setLease(ByteString.copyFrom(lease.toBytes())).build();
        if (local.call(LocalSocketServer.RELEASE, req) == null) {
            call(s -> s.release(req));
        }
    }

    @Override
    public LoadPlan beginLoad(String instanceId, int workerRank, LeaseId lease, long[] dstBlockIds) {
        if (lease == null || dstBlockIds == null) {
            throw new InvalidArgumentException("load: lease and dstBlockIds must not be null");
        }
        BeginLoadRequest.Builder b = BeginLoadRequest.newBuilder().setInstanceId(instanceId).setWorkerRank(workerRank)
                .setLease(ByteString.copyFrom(lease.toBytes()));
        for (long id : dstBlockIds) {
            b.addDstBlockIds(id);
        }
        io.pegaflow.server.proto.LoadPlan p = call(s -> s.beginLoad(b.build()));
        int n = p.getHostOffsetCount();
        int[] blockIndex = new int[n];
        int[] regionIndex = new int[n];
        long[] hostOffset = new long[n];
        for (int k = 0; k < n; k++) {
            blockIndex[k] = p.getBlockIndex(k);
            regionIndex[k] = p.getRegionIndex(k);
            hostOffset[k] = p.getHostOffset(k);
        }
        return new LoadPlan(p.getLoadId(), p.getBlocks(), blockIndex, regionIndex, hostOffset);
    }

    @Override
    public LoadResult endLoad(long loadId, boolean ok, long bytes, long nanos) {
        io.pegaflow.server.proto.LoadResult r = call(s -> s.endLoad(EndLoadRequest.newBuilder().setLoadId(loadId)
                .setOk(ok).setBytes(bytes).setNanos(nanos).build()));
        return new LoadResult(r.getBlocks(), r.getBytes());
    }

    @Override
    public EngineStats stats() {
        Map<String, Long> values = call(s -> s.stats(StatsRequest.getDefaultInstance())).getValuesMap();
        Map<Gauge, Long> gauges = new EnumMap<>(Gauge.class);
        for (Gauge g : Gauge.values()) {
            gauges.put(g, values.getOrDefault(g.metricName(), 0L));
        }
        Map<Counter, Long> counters = new EnumMap<>(Counter.class);
        for (Counter c : Counter.values()) {
            counters.put(c, values.getOrDefault(c.metricName(), 0L));
        }
        return new EngineStats(gauges, counters);
    }

    /** Asks the server to stop (it finishes the calls in flight). */
    public void shutdownServer() {
        call(s -> s.shutdown(Empty.getDefaultInstance()));
    }

    /** Ends this client's sessions and closes the channel; the server keeps the cache. */
    @Override
    public void close() {
        for (ClientCallStreamObserver<SessionRequest> s : sessions.values()) {
            s.cancel("client closed", null);
        }
        sessions.clear();
        channel.shutdown();
        try {
            if (!channel.awaitTermination(5, TimeUnit.SECONDS)) {
                channel.shutdownNow();
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            channel.shutdownNow();
        }
    }
}
