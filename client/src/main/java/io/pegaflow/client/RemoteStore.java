package io.pegaflow.client;

import com.google.protobuf.ByteString;
import com.google.protobuf.UnsafeByteOperations;
import io.grpc.ManagedChannel;
import io.grpc.StatusRuntimeException;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.BlockStore;
import io.pegaflow.engine.CopyPlan;
import io.pegaflow.engine.CopyResult;
import io.pegaflow.engine.EngineStats;
import io.pegaflow.engine.ErrorCode;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.Token;
import io.pegaflow.engine.UnknownInstanceException;
import io.pegaflow.engine.PegaflowException;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.metrics.Gauge;
import io.pegaflow.client.proto.BeginLoadRequest;
import io.pegaflow.client.proto.CopyDirection;
import io.pegaflow.client.proto.Empty;
import io.pegaflow.client.proto.EndCopyRequest;
import io.pegaflow.client.proto.FlushRequest;
import io.pegaflow.client.proto.EngineGrpc;
import io.pegaflow.client.proto.HealthRequest;
import io.pegaflow.client.proto.HealthResponse;
import io.pegaflow.client.proto.KvLayout;
import io.pegaflow.client.proto.QueryRequest;
import io.pegaflow.client.proto.QueryResponse;
import io.pegaflow.client.proto.RegisterInstanceRequest;
import io.pegaflow.client.proto.RegisterWorkerRequest;
import io.pegaflow.client.proto.ReleaseRequest;
import io.pegaflow.client.proto.ReserveSaveRequest;
import io.pegaflow.client.proto.ResetCacheRequest;
import io.pegaflow.client.proto.DemoteRequest;
import io.pegaflow.client.proto.KvEvent;
import io.pegaflow.client.proto.KvEventsRequest;
import io.pegaflow.client.proto.KvEventsResponse;
import io.pegaflow.client.proto.ResetCacheResponse;
import io.pegaflow.client.proto.SessionEvent;
import io.pegaflow.client.proto.SessionRequest;
import io.pegaflow.client.proto.StatsRequest;
import io.pegaflow.client.proto.UnregisterInstanceRequest;
import java.util.ArrayList;
import java.util.EnumMap;
import java.util.List;
import java.util.Map;
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
 *
 * <p>Identity: the server lets this client act only for instances it created or joined.
 * Another process of the same instance (a TP rank, its scheduler) joins by presenting the
 * instance's join secret: the one this client's creator proposed ({@code joinSecret} given to
 * {@link #connect(String, long, boolean, byte[])}: every process of one vLLM launch gives the
 * same), or the one {@link #joinSecret(String)} returns after registering.
 *
 * <p>Why one file past 600 lines: it is the client half of every RPC of the protocol (one
 * method per {@link BlockStore} call, each mapping its status to the engine's exception), and
 * splitting the calls apart would split that one mapping.
 *
 * <p>Size: one method per RPC of the {@link io.pegaflow.engine.BlockStore} contract, each a few lines around the one retry and error-mapping rule ({@code call}); split by RPC, that rule would be written once per file.
 */
public final class RemoteStore implements BlockStore {
    private final String endpoint;
    private final ManagedChannel channel;
    /** {@link #channel} with this client's headers (credential, client id) on every call. */
    private final io.grpc.Channel calls;
    /** The server's token, read from the file Health names (null until then). */
    private volatile String token;
    private volatile String tokenError;
    private final long deadlineMs;
    private final String clientId = newClientId();
    /** The join secret this client presents (null: none; it then acts only for what it registered). */
    private final byte[] presented;
    /** Each registered instance's join secret, as the server answered. */
    private final Map<String, byte[]> secrets = new ConcurrentHashMap<>();
    private final Map<String, ClientCallStreamObserver<SessionRequest>> sessions = new ConcurrentHashMap<>();
    private final LocalSocketClient local = new LocalSocketClient(this);
    /** Regions each worker registered through this client, keyed "instance/rank": bounds a plan's answer. */
    private final Map<String, Integer> workerRegions = new ConcurrentHashMap<>();

    private RemoteStore(String endpoint, ManagedChannel channel, long deadlineMs, byte[] joinSecret) {
        this.endpoint = endpoint;
        this.channel = channel;
        this.presented = checkSecret(joinSecret);
        String presentedHex = presented == null ? null : java.util.HexFormat.of().formatHex(presented);
        this.calls = io.grpc.ClientInterceptors.intercept(channel, new io.grpc.ClientInterceptor() {
            @Override
            public <Q, R> io.grpc.ClientCall<Q, R> interceptCall(io.grpc.MethodDescriptor<Q, R> method,
                    io.grpc.CallOptions options, io.grpc.Channel next) {
                return new io.grpc.ForwardingClientCall.SimpleForwardingClientCall<>(next.newCall(method, options)) {
                    @Override
                    public void start(Listener<R> listener, io.grpc.Metadata headers) {
                        headers.put(Headers.CLIENT_ID, clientId);
                        if (presentedHex != null) {
                            headers.put(Headers.JOIN_SECRET, presentedHex);
                        }
                        String t = token;
                        if (t != null) {
                            headers.put(Headers.AUTHORIZATION, "Bearer " + t);
                        }
                        super.start(listener, headers);
                    }
                };
            }
        });
        this.deadlineMs = deadlineMs;
        if (CODECS_WARMED.compareAndSet(false, true)) {
            warmCodecs(); // the JIT's work is the process's: once, whatever the number of clients
        }
    }

    private static final java.util.concurrent.atomic.AtomicBoolean CODECS_WARMED = new java.util.concurrent.atomic.AtomicBoolean();

    /**
     * Runs this client's message code (requests of 2,048 block ids built and written, plans of
     * 2,048 runs parsed and read) a few hundred times before the first call, so the JIT has
     * compiled it when the first real save or load comes: without it the first large load's
     * plans took several times as long as later ones on the H200. Once per process, on the
     * first client's creation, since the JIT's work is the process's. What it costs and what it
     * saves: docs/gpu.md, "Server mode at line speed" ({@code bench/probe/CodecWarmUp.java}
     * times it).
     */
    private static void warmCodecs() {
        int n = 2048;
        io.pegaflow.client.proto.CopyPlan.Builder plan = io.pegaflow.client.proto.CopyPlan.newBuilder()
                .setId(ByteString.copyFrom(new byte[16])).setBlocks(n).setDirection(CopyDirection.LOAD).setHoldNanos(1);
        for (int j = 0; j < n; j++) {
            plan.addRunBlock(j).addRunRegion(0).addRunCount(32).addRunOffset(j * (2L << 20));
        }
        byte[] wire = plan.build().toByteArray();
        byte[] hashes = new byte[n * 32];
        long sink = 0;
        for (int round = 0; round < 200; round++) {
            ReserveSaveRequest.Builder save = ReserveSaveRequest.newBuilder().setInstanceId("warm-up")
                    .setHashes(UnsafeByteOperations.unsafeWrap(hashes)).setHashLen(32);
            BeginLoadRequest.Builder load = BeginLoadRequest.newBuilder().setInstanceId("warm-up");
            for (int i = 0; i < n; i++) {
                save.addBlockIds(i);
                load.addDstBlockIds(i);
            }
            sink += save.build().toByteArray().length + load.build().toByteArray().length;
            sink += plan(parse(io.pegaflow.client.proto.CopyPlan.parser(), wire)).runs();
        }
        warmSink = sink; // keeps the work from being optimized away
    }

    private static volatile long warmSink;

    /**
     * A client of the server at {@code HOST:PORT}; nothing is sent until the first call. Query
     * and release go over the server's local socket when it has one on this host (see
     * {@code LocalSocketServer}), everything else over gRPC.
     */
    public static RemoteStore connect(String endpoint, long deadlineMs) {
        return connect(endpoint, deadlineMs, true);
    }

    /** As {@link #connect(String, long)}; {@code localSocket} false sends every call over gRPC. */
    public static RemoteStore connect(String endpoint, long deadlineMs, boolean localSocket) {
        return connect(endpoint, deadlineMs, localSocket, null);
    }

    /**
     * As {@link #connect(String, long, boolean)}, presenting {@code joinSecret} (16..64 bytes;
     * null: none): instances this client creates get it as their join secret, and this client
     * acts for any instance whose join secret it is.
     */
    public static RemoteStore connect(String endpoint, long deadlineMs, boolean localSocket, byte[] joinSecret) {
        RemoteStore s = open(endpoint, deadlineMs, joinSecret);
        if (!localSocket) {
            s.local.close();
        }
        return s;
    }

    private static RemoteStore open(String endpoint, long deadlineMs, byte[] joinSecret) {
        Wire.hostPort(endpoint, "endpoint");
        if (deadlineMs <= 0) {
            throw new InvalidArgumentException("deadline " + deadlineMs + " ms; expected > 0");
        }
        ManagedChannel channel = channelBuilder(endpoint, System.getenv(TLS_CA_ENV))
                .maxInboundMessageSize(Wire.MAX_RESPONSE_BYTES)
                // twice the server's permitted ping interval (5 s): a client pinging at the limit
                // risks a too_many_pings GOAWAY, which ends its liveness sessions
                .keepAliveTime(10, TimeUnit.SECONDS)
                .keepAliveTimeout(5, TimeUnit.SECONDS)
                .keepAliveWithoutCalls(true)
                .build();
        return new RemoteStore(endpoint, channel, deadlineMs, joinSecret);
    }

    /** The environment variable naming the CA file (PEM) a TLS server's certificate must chain to; unset: plaintext. */
    public static final String TLS_CA_ENV = "PEGAFLOW_TLS_CA";

    /**
     * A channel to {@code endpoint}: TLS trusting the CA file {@code ca} (pegaflow-server's
     * {@code --tls-cert}), or plaintext when {@code ca} is null or blank (a server on loopback).
     */
    public static NettyChannelBuilder channelBuilder(String endpoint, String ca) {
        if (ca == null || ca.isBlank()) {
            return NettyChannelBuilder.forTarget(endpoint).usePlaintext();
        }
        java.io.File file = new java.io.File(ca.strip());
        try {
            return NettyChannelBuilder.forTarget(endpoint, io.grpc.TlsChannelCredentials.newBuilder().trustManager(file).build());
        } catch (java.io.IOException | IllegalArgumentException e) {
            throw new InvalidArgumentException(TLS_CA_ENV + "=" + ca + ": " + e.getMessage() + "; expected a readable PEM file of "
                    + "the CA that signed pegaflow-server's --tls-cert");
        }
    }

    /** Over a caller's channel (in-process transport in tests). */
    public static RemoteStore over(ManagedChannel channel, String name, long deadlineMs) {
        return over(channel, name, deadlineMs, null);
    }

    /** Over a caller's channel, presenting {@code joinSecret} (see {@link #connect(String, long, boolean, byte[])}). */
    public static RemoteStore over(ManagedChannel channel, String name, long deadlineMs, byte[] joinSecret) {
        return new RemoteStore(name, channel, deadlineMs, joinSecret);
    }

    private static byte[] checkSecret(byte[] secret) {
        if (secret != null && (secret.length < 16 || secret.length > 64)) {
            throw new InvalidArgumentException("join secret of " + secret.length + " bytes; expected 16..64");
        }
        return secret == null ? null : secret.clone();
    }

    /**
     * The join secret of {@code instanceId} as the server answered this client's registration
     * (null before it): what another process presents to act for the instance.
     */
    public byte[] joinSecret(String instanceId) {
        byte[] s = secrets.get(instanceId);
        return s == null ? null : s.clone();
    }

    /** The secret a registration of {@code instanceId} presents: the instance's, else this client's own. */
    private ByteString secretFor(String instanceId) {
        byte[] s = secrets.get(instanceId);
        if (s == null) {
            s = presented;
        }
        return s == null ? ByteString.EMPTY : ByteString.copyFrom(s);
    }

    /** The local socket's first frame: the token, NUL, this client's id, NUL, the join secret it presents (hex). */
    byte[] hello() {
        String tail = "\0" + clientId + (presented == null ? "" : "\0" + java.util.HexFormat.of().formatHex(presented));
        return (token() + tail).getBytes(java.nio.charset.StandardCharsets.UTF_8);
    }

    public String endpoint() {
        return endpoint;
    }

    public long deadlineMs() {
        return deadlineMs;
    }

    /** Opens a local-socket connection ahead of the first call, when the server has a socket on this host. */
    boolean warmLocal() {
        return local.warm();
    }

    /**
     * Microseconds a call over the local socket spins for its answer before it sleeps: the
     * longer of {@code PEGAFLOW_LOCAL_SPIN_US} (0 to 1000, default 0) and a busy-polling
     * server's spin (up to 1 ms), known once the socket was found.
     */
    public long localSpinMicros() {
        return local.spinMicros();
    }

    /** Calls answered over the server's local socket instead of gRPC. */
    public long localCalls() {
        return local.answered();
    }

    /** A call with this client's credential. */
    private <T> T call(Function<EngineGrpc.EngineBlockingStub, T> rpc) {
        requireToken();
        try {
            return rpc.apply(stub());
        } catch (StatusRuntimeException e) {
            if (e.getStatus().getCode() != io.grpc.Status.Code.UNAUTHENTICATED) {
                throw Errors.fromStatus(e, endpoint, deadlineMs);
            }
            // A server restarted at the same address writes a new token: read it again, once.
            token = null;
            requireToken();
            return rawCall(rpc);
        }
    }

    /** A call as it is (Health, or the retry after the token was read again). */
    private <T> T rawCall(Function<EngineGrpc.EngineBlockingStub, T> rpc) {
        try {
            return rpc.apply(stub());
        } catch (StatusRuntimeException e) {
            throw Errors.fromStatus(e, endpoint, deadlineMs);
        }
    }

    private EngineGrpc.EngineBlockingStub stub() {
        return EngineGrpc.newBlockingStub(calls).withDeadlineAfter(deadlineMs, TimeUnit.MILLISECONDS);
    }

    /** Health (no credential needed); the first answer also gives this client the server's token. */
    public HealthResponse health() {
        HealthResponse h = rawCall(s -> s.health(HealthRequest.getDefaultInstance()));
        if (token == null) {
            readToken(h.getTokenPath());
        }
        return h;
    }

    private void readToken(String path) {
        if (path.isEmpty()) {
            return;
        }
        try {
            token = java.nio.file.Files.readString(java.nio.file.Path.of(path), java.nio.charset.StandardCharsets.UTF_8).trim();
            tokenError = null;
        } catch (java.io.IOException | SecurityException e) {
            tokenError = "cannot read pegaflow-server's token at " + path + " (" + e + "): run as the server's user, or "
                    + "start the server with --pool-group naming a group of this user";
        }
    }

    /** The credential every call but Health carries (Health is asked first when it is not known yet). */
    private void requireToken() {
        if (token == null) {
            health();
            if (token == null && tokenError != null) {
                throw new io.pegaflow.engine.PermissionDeniedException(tokenError);
            }
        }
    }

    /** The server's token as this client read it (null before the first Health); the local socket's first frame. */
    String token() {
        requireToken();
        return token;
    }

    private static String newClientId() {
        byte[] b = new byte[16];
        new java.security.SecureRandom().nextBytes(b);
        return java.util.HexFormat.of().formatHex(b);
    }

    @Override
    public void registerInstance(InstanceSpec spec) {
        ByteString secret = call(s -> s.registerInstance(RegisterInstanceRequest.newBuilder().setClientVersion(Version.VERSION)
                .setInstanceId(spec.instanceId()).setNamespace(spec.namespace()).setTpSize(spec.tpSize())
                .setWorldSize(spec.worldSize()).setJoinSecret(secretFor(spec.instanceId())).build())).getJoinSecret();
        if (!secret.isEmpty()) {
            secrets.put(spec.instanceId(), secret.toByteArray());
        }
        openSession(spec.instanceId());
    }

    /** The liveness stream: held open, never answered; the server notices when it breaks. */
    private void openSession(String instanceId) {
        ClientCallStreamObserver<SessionRequest> previous = sessions.remove(instanceId);
        if (previous != null) {
            previous.cancel("superseded", null);
        }
        EngineGrpc.newStub(calls).session(SessionRequest.newBuilder().setInstanceId(instanceId).setClientId(clientId).build(),
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
                .setJoinSecret(secretFor(instanceId)).setWorkerRank(worker.workerRank()).setTpRank(worker.tpRank()).setDeviceId(worker.deviceId());
        if (worker.layers() != null) {
            for (LayerRegion r : worker.layers()) {
                if (r == null) {
                    throw new InvalidArgumentException("worker " + worker.workerRank() + " of instance '" + instanceId
                            + "' has a null layer region");
                }
                b.addLayers(io.pegaflow.client.proto.LayerRegion.newBuilder().setName(r.layerName() == null ? "" : r.layerName())
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
        workerRegions.put(instanceId + "/" + worker.workerRank(), worker.layers() == null ? 0 : worker.layers().size());
        // Only an instance's registrants may hold its session: a process that joins an
        // instance another one created (a TP rank) becomes one here, so it opens (or renews)
        // its session now.
        openSession(instanceId);
    }

    @Override
    public boolean isSealed(String instanceId) {
        // Sealed instances answer queries; an unsealed one is refused with REGISTRATION_INCOMPLETE.
        try {
            query(instanceId, BlockHashes.EMPTY);
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
            secrets.remove(instanceId);
            ClientCallStreamObserver<SessionRequest> session = sessions.remove(instanceId);
            if (session != null) {
                session.cancel("unregistered", null);
            }
        }
    }

    @Override
    public io.pegaflow.engine.store.LocalStore.Cleared resetCache(String instanceId) {
        ResetCacheResponse r = call(s -> s.resetCache(ResetCacheRequest.newBuilder().setInstanceId(instanceId).build()));
        return new io.pegaflow.engine.store.LocalStore.Cleared(r.getBlocks(), r.getBytes(), r.getReferencedBlocks(),
                r.getUnpinnedBlocks(), r.getSsdRecords());
    }

    @Override
    public int demote(String instanceId, BlockHashes hashes) {
        if (hashes == null) {
            throw new InvalidArgumentException("demote: hashes must not be null");
        }
        return call(s -> s.demote(DemoteRequest.newBuilder().setInstanceId(instanceId)
                .setHashes(UnsafeByteOperations.unsafeWrap(hashes.packed())).setHashLen(hashes.hashLen()).build())).getBlocks();
    }

    @Override
    public io.pegaflow.engine.store.KvEventLog.Batch kvEvents(String instanceId, long after, int max) {
        KvEventsResponse r = call(s -> s.kvEvents(KvEventsRequest.newBuilder().setInstanceId(instanceId).setAfter(after)
                .setMaxEvents(max).build()));
        String namespace = ""; // the caller's own namespace: the server filtered by it
        List<io.pegaflow.engine.store.KvEventLog.Event> events = new ArrayList<>(r.getEventsCount());
        for (KvEvent e : r.getEventsList()) {
            events.add(new io.pegaflow.engine.store.KvEventLog.Event(e.getSeq(),
                    e.getStored() ? io.pegaflow.engine.store.KvEventLog.Kind.STORED : io.pegaflow.engine.store.KvEventLog.Kind.REMOVED,
                    e.getTier(), namespace, e.getHash().toByteArray(), e.getEpochMillis()));
        }
        return new io.pegaflow.engine.store.KvEventLog.Batch(events, r.getNext(), r.getGap());
    }

    @Override
    public CopyPlan reserveSave(String instanceId, int workerRank, List<String> layerNames, long[] blockIds,
            BlockHashes hashes) {
        if (blockIds == null || hashes == null) {
            throw new InvalidArgumentException("save: blockIds and hashes must not be null");
        }
        ReserveSaveRequest.Builder b = ReserveSaveRequest.newBuilder().setInstanceId(instanceId).setWorkerRank(workerRank)
                .setHashes(UnsafeByteOperations.unsafeWrap(hashes.packed())).setHashLen(hashes.hashLen());
        if (layerNames != null) {
            b.addAllLayerNames(layerNames);
        }
        for (long id : blockIds) {
            b.addBlockIds(id);
        }
        ReserveSaveRequest req = b.build();
        byte[] fast = fitsLocal(instanceId, workerRank, blockIds.length) ? local.call(Wire.RESERVE_SAVE, req) : null;
        return plan(fast != null ? parse(io.pegaflow.client.proto.CopyPlan.parser(), fast) : call(s -> s.reserveSave(req)));
    }

    @Override
    public CopyPlan beginLoad(String instanceId, int workerRank, Token lease, long[] dstBlockIds) {
        return beginLoad0(instanceId, workerRank, lease, dstBlockIds, 0);
    }

    /** {@inheritDoc} A server older than LoadRest answers with the whole plan: callers check the runs they got. */
    @Override
    public CopyPlan beginLoad(String instanceId, int workerRank, Token lease, long[] dstBlockIds, int planBlocks) {
        if (planBlocks < 1) {
            throw new InvalidArgumentException("load: plan_blocks " + planBlocks + "; expected >= 1 (or 0 on the wire: all)");
        }
        return beginLoad0(instanceId, workerRank, lease, dstBlockIds, planBlocks);
    }

    /** BeginLoad with plan_blocks as on the wire (0: all). */
    private CopyPlan beginLoad0(String instanceId, int workerRank, Token lease, long[] dstBlockIds, int planBlocks) {
        if (lease == null || dstBlockIds == null) {
            throw new InvalidArgumentException("load: lease and dstBlockIds must not be null");
        }
        BeginLoadRequest.Builder b = BeginLoadRequest.newBuilder().setInstanceId(instanceId).setWorkerRank(workerRank)
                .setLease(ByteString.copyFrom(lease.toBytes())).setPlanBlocks(planBlocks);
        for (long id : dstBlockIds) {
            b.addDstBlockIds(id);
        }
        BeginLoadRequest req = b.build();
        byte[] fast = fitsLocal(instanceId, workerRank, dstBlockIds.length) ? local.call(Wire.BEGIN_LOAD, req) : null;
        return plan(fast != null ? parse(io.pegaflow.client.proto.CopyPlan.parser(), fast) : call(s -> s.beginLoad(req)));
    }

    @Override
    public CopyPlan planRest(String instanceId, int workerRank, Token planId, int fromBlock, int toBlock) {
        if (planId == null) {
            throw new InvalidArgumentException("plan rest: the copy id is null");
        }
        io.pegaflow.client.proto.LoadRestRequest req = io.pegaflow.client.proto.LoadRestRequest.newBuilder()
                .setInstanceId(instanceId).setWorkerRank(workerRank).setId(ByteString.copyFrom(planId.toBytes()))
                .setFromBlock(fromBlock).setToBlock(toBlock).build();
        byte[] fast = fitsLocal(instanceId, workerRank, Math.max(0, toBlock - fromBlock)) ? local.call(Wire.LOAD_REST, req)
                : null;
        return plan(fast != null ? parse(io.pegaflow.client.proto.CopyPlan.parser(), fast) : call(s -> s.loadRest(req)));
    }

    /**
     * Whether a plan for {@code blocks} blocks of this worker surely fits one local-socket
     * answer (a plan is never retried: its answer must not be refused for its size).
     */
    private boolean fitsLocal(String instanceId, int workerRank, int blocks) {
        Integer regions = workerRegions.get(instanceId + "/" + workerRank);
        return regions != null && regions > 0 && (long) blocks * regions * Wire.MAX_RUN_BYTES + 1024 < Wire.MAX_FRAME;
    }

    private static <T> T parse(com.google.protobuf.Parser<T> parser, byte[] bytes) {
        try {
            return parser.parseFrom(bytes);
        } catch (com.google.protobuf.InvalidProtocolBufferException e) {
            throw new PegaflowException(ErrorCode.INTERNAL, "malformed answer on the local socket: " + e.getMessage());
        }
    }

    private static CopyPlan plan(io.pegaflow.client.proto.CopyPlan p) {
        int n = p.getRunBlockCount();
        if (p.getRunRegionCount() != n || p.getRunCountCount() != n || p.getRunOffsetCount() != n) {
            throw new PegaflowException(ErrorCode.INTERNAL, "copy plan with " + n + " run blocks, " + p.getRunRegionCount()
                    + " run regions, " + p.getRunCountCount() + " run counts and " + p.getRunOffsetCount()
                    + " run offsets; expected equal counts");
        }
        int[] block = new int[n];
        int[] region = new int[n];
        int[] count = new int[n];
        long[] offset = new long[n];
        for (int j = 0; j < n; j++) {
            block[j] = p.getRunBlock(j);
            region[j] = p.getRunRegion(j);
            count[j] = p.getRunCount(j);
            offset[j] = p.getRunOffset(j);
        }
        CopyPlan.Direction direction = p.getDirection() == CopyDirection.LOAD ? CopyPlan.Direction.LOAD
                : CopyPlan.Direction.SAVE;
        return new CopyPlan(Token.fromBytes(p.getId().toByteArray(), "copy id"), direction, p.getBlocks(),
                p.getSkippedBlocks(), block, region, count, offset, Math.max(0, p.getHoldNanos()));
    }

    @Override
    public CopyResult endCopy(String instanceId, Token planId, boolean ok, long bytes, long nanos) {
        if (planId == null) {
            throw new InvalidArgumentException("end of copy: id is null");
        }
        EndCopyRequest req = EndCopyRequest.newBuilder().setInstanceId(instanceId)
                .setId(ByteString.copyFrom(planId.toBytes())).setOk(ok).setBytes(bytes).setNanos(nanos).build();
        byte[] fast = local.call(Wire.END_COPY, req);
        io.pegaflow.client.proto.CopyResult r = fast != null ? parse(io.pegaflow.client.proto.CopyResult.parser(), fast)
                : call(s -> s.endCopy(req));
        return new CopyResult(r.getBlocks(), r.getSkippedBlocks(), r.getBytes());
    }

    @Override
    public void dropBegun(String instanceId, Token planId) {
        if (planId == null) {
            throw new InvalidArgumentException("drop of a begun load: the copy id is null");
        }
        EndCopyRequest req = EndCopyRequest.newBuilder().setInstanceId(instanceId)
                .setId(ByteString.copyFrom(planId.toBytes())).setUnused(true).build();
        if (local.call(Wire.END_COPY, req) == null) {
            call(s -> s.endCopy(req));
        }
    }

    @Override
    public QueryResult query(String instanceId, BlockHashes hashes) {
        return query(instanceId, hashes, -1);
    }

    /** {@inheritDoc} A server older than the query's begin answers without a plan: the load then asks for one. */
    @Override
    public QueryResult queryAndBegin(String instanceId, BlockHashes hashes, int workerRank) {
        BlockStore.checkBeginRank(workerRank);
        if (!workerRegions.containsKey(instanceId + "/" + workerRank)) {
            // its copies run where it registered: a plan begun here would never be taken
            throw new UnknownInstanceException("worker rank " + workerRank + " of instance '" + instanceId
                    + "' is not registered through this client; begin its load where it registered");
        }
        return query(instanceId, hashes, workerRank);
    }

    /** {@code beginRank} < 0: a plain query. */
    private QueryResult query(String instanceId, BlockHashes hashes, int beginRank) {
        if (hashes == null) {
            throw new InvalidArgumentException("query: hashes must not be null");
        }
        QueryRequest.Builder b = QueryRequest.newBuilder().setInstanceId(instanceId)
                .setHashes(UnsafeByteOperations.unsafeWrap(hashes.packed())).setHashLen(hashes.hashLen());
        // a plan that might not fit one local-socket answer is asked for by the load (over gRPC if need be)
        if (beginRank >= 0 && fitsLocal(instanceId, beginRank, hashes.count())) {
            b.setBegin(true).setBeginWorkerRank(beginRank);
        }
        QueryRequest req = b.build();
        byte[] fast = local.call(Wire.QUERY, req);
        QueryResponse r = fast != null ? parse(QueryResponse.parser(), fast) : call(s -> s.query(req));
        return new QueryResult(r.getHitBlocks(), r.getLease().isEmpty() ? null : Token.fromBytes(r.getLease().toByteArray()),
                r.getPendingBlocks(), r.hasBegun() ? plan(r.getBegun()) : null);
    }

    @Override
    public void release(String instanceId, Token lease) {
        if (lease == null) {
            throw new InvalidArgumentException("release: lease is null");
        }
        ReleaseRequest req = ReleaseRequest.newBuilder().setInstanceId(instanceId).setLease(ByteString.copyFrom(lease.toBytes()))
                .build();
        if (local.call(Wire.RELEASE, req) == null) {
            call(s -> s.release(req));
        }
    }

    @Override
    public void flush() {
        call(s -> s.flush(FlushRequest.getDefaultInstance()));
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

    /**
     * Asks the server to stop (it finishes the calls in flight); {@code operatorToken} is the
     * text of the server's operator token file ({@code <pool>.operator-token} or
     * {@code --operator-token-file}): the tenants' token is refused.
     */
    public void shutdownServer(String operatorToken) {
        io.grpc.Metadata h = new io.grpc.Metadata();
        h.put(Headers.AUTHORIZATION, "Bearer " + operatorToken.trim());
        rawCall(s -> EngineGrpc.newBlockingStub(channel).withInterceptors(io.grpc.stub.MetadataUtils
                .newAttachHeadersInterceptor(h)).withDeadlineAfter(deadlineMs, TimeUnit.MILLISECONDS)
                .shutdown(Empty.getDefaultInstance()));
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
