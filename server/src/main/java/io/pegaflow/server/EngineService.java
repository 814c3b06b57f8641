package io.pegaflow.server;

import io.pegaflow.client.Errors;
import io.pegaflow.client.Version;

import com.google.protobuf.ByteString;
import io.grpc.stub.ServerCallStreamObserver;
import io.grpc.stub.StreamObserver;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.EngineStats;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.Limits;
import io.pegaflow.engine.Token;
import io.pegaflow.engine.store.KvEventLog;
import io.pegaflow.engine.store.LocalStore;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.QuotaExceededException;
import io.pegaflow.engine.TopologyMismatchException;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.metrics.Gauge;
import io.pegaflow.client.proto.BeginLoadRequest;
import io.pegaflow.client.proto.CopyDirection;
import io.pegaflow.client.proto.CopyPlan;
import io.pegaflow.client.proto.CopyResult;
import io.pegaflow.client.proto.Empty;
import io.pegaflow.client.proto.EndCopyRequest;
import io.pegaflow.client.proto.LoadRestRequest;
import io.pegaflow.client.proto.FlushRequest;
import io.pegaflow.client.proto.EngineGrpc;
import io.pegaflow.client.proto.HealthRequest;
import io.pegaflow.client.proto.HealthResponse;
import io.pegaflow.client.proto.QueryRequest;
import io.pegaflow.client.proto.QueryResponse;
import io.pegaflow.client.proto.RegisterInstanceRequest;
import io.pegaflow.client.proto.RegisterInstanceResponse;
import io.pegaflow.client.proto.RegisterWorkerRequest;
import io.pegaflow.client.proto.ReleaseRequest;
import io.pegaflow.client.proto.ReserveSaveRequest;
import io.pegaflow.client.proto.ResetCacheRequest;
import io.pegaflow.client.proto.DemoteRequest;
import io.pegaflow.client.proto.DemoteResponse;
import io.pegaflow.client.proto.KvEvent;
import io.pegaflow.client.proto.KvEventsRequest;
import io.pegaflow.client.proto.KvEventsResponse;
import io.pegaflow.client.proto.ResetCacheResponse;
import io.pegaflow.client.proto.SessionEvent;
import io.pegaflow.client.proto.SessionRequest;
import io.pegaflow.client.proto.StatsRequest;
import io.pegaflow.client.proto.StatsResponse;
import io.pegaflow.client.proto.UnregisterInstanceRequest;
import java.util.ArrayList;
import java.util.List;
import java.util.function.Supplier;

/**
 * The gRPC face of a {@link LocalStore}: translates messages to engine calls and engine
 * exceptions to statuses ({@link Errors}). Validation stays in the engine, so a bad request
 * is refused exactly as an in-process call would be, and nothing changes; what is checked
 * here is only the size of what a request carries ({@link Limits}), before it is copied into
 * engine objects.
 */
final class EngineService extends EngineGrpc.EngineImplBase {
    private final LocalStore store;
    private final Sessions sessions;
    private final Tenants tenants;
    private final Supplier<HealthResponse> health;
    private final Runnable shutdown;
    /** Where calls that may wait on the cluster registry run ({@link #flush}), never a transport thread. */
    private final java.util.concurrent.ExecutorService waiting;

    /** Threads that run calls which may wait on Redis at once; more wait in a queue of {@link #MAX_WAITING_CALLS}. */
    static final int WAITING_THREADS = 4;
    static final int MAX_WAITING_CALLS = 64;

    EngineService(LocalStore store, Sessions sessions, Tenants tenants, Supplier<HealthResponse> health, Runnable shutdown,
            java.util.concurrent.ExecutorService waiting) {
        this.store = store;
        this.sessions = sessions;
        this.tenants = tenants;
        this.health = health;
        this.shutdown = shutdown;
        this.waiting = waiting;
    }

    /**
     * The pool for calls that may wait on the cluster registry: {@link #WAITING_THREADS} daemon
     * threads and a bounded queue; a call beyond it is refused ({@link QuotaExceededException}).
     * The gRPC handlers run on Netty's event-loop threads ({@code directExecutor}, for the short
     * calls' latency), and a Flush waits up to four Redis timeouts when Redis is down: on an event
     * loop it held every other client whose connection shares that loop.
     */
    static java.util.concurrent.ExecutorService waitingPool() {
        return new java.util.concurrent.ThreadPoolExecutor(WAITING_THREADS, WAITING_THREADS, 30, java.util.concurrent.TimeUnit.SECONDS,
                new java.util.concurrent.ArrayBlockingQueue<>(MAX_WAITING_CALLS),
                Thread.ofPlatform().daemon().name("pegaflow-wait-", 0).factory());
    }

    @FunctionalInterface
    private interface Call<T> {
        T run();
    }

    private static <T> void answer(StreamObserver<T> out, Call<T> call) {
        T value;
        try {
            value = call.run();
        } catch (Throwable t) {
            out.onError(Errors.toStatus(t));
            return;
        }
        out.onNext(value);
        out.onCompleted();
    }

    private static final Empty EMPTY = Empty.getDefaultInstance();

    /** The request's packed hashes as they came (the one form the store reads), counted before they are copied. */
    static BlockHashes hashes(ByteString packed, int hashLen) {
        Limits.checkHashes(packed.size(), hashLen);
        return packed.isEmpty() ? BlockHashes.EMPTY : new BlockHashes(packed.toByteArray(), hashLen);
    }

    /** A request's instance id, refused when longer than {@link Limits#MAX_NAME_BYTES} or not printable. */
    static String instanceId(String id) {
        Limits.checkName("instance id", id);
        Limits.checkPrintable("instance id", id);
        return id;
    }

    /** Block ids of a save or load, counted before they are copied. */
    static long[] blockIds(String what, List<Long> values) {
        Limits.checkCount(what, values.size(), Limits.MAX_HASHES_PER_CALL, "MAX_HASHES_PER_CALL");
        return longs(values);
    }

    static long[] longs(List<Long> values) {
        long[] out = new long[values.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = values.get(i);
        }
        return out;
    }

    @Override
    public void health(HealthRequest request, StreamObserver<HealthResponse> out) {
        answer(out, health::get);
    }

    @Override
    public void registerInstance(RegisterInstanceRequest r, StreamObserver<RegisterInstanceResponse> out) {
        answer(out, () -> {
            if (!Version.VERSION.equals(r.getClientVersion())) {
                throw new TopologyMismatchException("PegaFlow version mismatch: client " + Limits.quote(r.getClientVersion())
                        + ", server " + Version.VERSION + "; install the same pegaflow-jvm version on both sides");
            }
            InstanceSpec spec = new InstanceSpec(r.getInstanceId(), r.getNamespace(), r.getTpSize(), r.getWorldSize());
            Caller caller = caller(Credentials.CALLER.get(), r.getJoinSecret());
            Tenants.Registration done;
            synchronized (tenants) { // the store's answer and the membership change in one step
                done = tenants.register(spec.instanceId(), caller, store.isRegistered(spec.instanceId()),
                        () -> store.registerInstance(spec));
            }
            if (done.created()) {
                store.assignOwner(spec.instanceId(), tenants.ownerOf(caller.tenant()));
                sessions.expireUnlessHeld(spec.instanceId(), done.generation());
            }
            return RegisterInstanceResponse.newBuilder().setJoinSecret(ByteString.copyFrom(done.secret())).build();
        });
    }

    /** {@code caller}, presenting {@code secret} from the request when it carries one. */
    private static Caller caller(Caller caller, ByteString secret) {
        return secret.isEmpty() ? caller : new Caller(caller.client(), secret.toByteArray());
    }

    @Override
    public void registerWorker(RegisterWorkerRequest r, StreamObserver<Empty> out) {
        answer(out, () -> {
            String id = instanceId(r.getInstanceId());
            Limits.checkCount("layers of worker " + r.getWorkerRank() + " of instance '" + id + "'", r.getLayersCount(),
                    Limits.MAX_LAYERS_PER_WORKER, "MAX_LAYERS_PER_WORKER");
            List<LayerRegion> layers = new ArrayList<>(r.getLayersCount());
            for (io.pegaflow.client.proto.LayerRegion l : r.getLayersList()) {
                KvLayout layout = switch (l.getLayout()) {
                    case SPLIT_KV -> KvLayout.SPLIT_KV;
                    case COMBINED -> KvLayout.COMBINED;
                    case MLA -> KvLayout.MLA;
                    default -> throw new InvalidArgumentException("layer '" + Limits.quote(l.getName()) + "': layout "
                            + l.getLayoutValue() + "; expected SPLIT_KV, COMBINED or MLA");
                };
                layers.add(new LayerRegion(l.getName(), layout, l.getBaseAddress(), l.getRegionBytes(), l.getNumBlocks(),
                        l.getBlockStride(), l.getSegmentBytes(), l.getSegmentOffset()));
            }
            tenants.join(id, caller(Credentials.CALLER.get(), r.getJoinSecret()), "registering a worker");
            store.registerWorker(id, new WorkerSpec(r.getWorkerRank(), r.getTpRank(), r.getDeviceId(), layers));
            return EMPTY;
        });
    }

    @Override
    public void unregisterInstance(UnregisterInstanceRequest r, StreamObserver<Empty> out) {
        answer(out, () -> {
            String id = instanceId(r.getInstanceId());
            tenants.require(id, Credentials.CALLER.get(), "unregistering");
            tenants.unregister(id, () -> store.unregisterInstance(id));
            return EMPTY;
        });
    }

    @Override
    public void reserveSave(ReserveSaveRequest r, StreamObserver<CopyPlan> out) {
        answer(out, () -> reserveSave(store, tenants, Credentials.CALLER.get(), r));
    }

    /**
     * ReserveSave on {@code store} for {@code caller}: the gRPC method and the local socket's
     * ({@link LocalSocketServer}). Each data-path call checks first that the caller acts for the
     * instance it names ({@link Tenants#require}): refused, nothing changes.
     */
    static CopyPlan reserveSave(LocalStore store, Tenants tenants, Caller caller, ReserveSaveRequest r) {
        String id = instanceId(r.getInstanceId());
        tenants.require(id, caller, "a save");
        Limits.checkCount("layer names of one save", r.getLayerNamesCount(), Limits.MAX_LAYERS_PER_WORKER,
                "MAX_LAYERS_PER_WORKER");
        for (String name : r.getLayerNamesList()) {
            Limits.checkName("layer name", name);
        }
        List<String> layers = r.getLayerNamesCount() == 0 ? null : r.getLayerNamesList();
        return plan(store.reserveSave(id, r.getWorkerRank(), layers, blockIds("block ids of one save",
                r.getBlockIdsList()), hashes(r.getHashes(), r.getHashLen())));
    }

    @Override
    public void beginLoad(BeginLoadRequest r, StreamObserver<CopyPlan> out) {
        answer(out, () -> beginLoad(store, tenants, Credentials.CALLER.get(), r));
    }

    /** BeginLoad on {@code store}: the gRPC method and the local socket's. */
    static CopyPlan beginLoad(LocalStore store, Tenants tenants, Caller caller, BeginLoadRequest r) {
        if (r.getPlanBlocks() < 0) {
            throw new InvalidArgumentException("plan_blocks " + r.getPlanBlocks() + "; expected >= 0 (0: all)");
        }
        tenants.require(instanceId(r.getInstanceId()), caller, "a load");
        return plan(store.beginLoad(r.getInstanceId(), r.getWorkerRank(),
                Token.fromBytes(r.getLease().toByteArray()), blockIds("destination block ids of one load",
                        r.getDstBlockIdsList()), r.getPlanBlocks() == 0 ? Integer.MAX_VALUE : r.getPlanBlocks()));
    }

    @Override
    public void loadRest(LoadRestRequest r, StreamObserver<CopyPlan> out) {
        answer(out, () -> loadRest(store, tenants, Credentials.CALLER.get(), r));
    }

    /** LoadRest on {@code store}: the gRPC method and the local socket's. */
    static CopyPlan loadRest(LocalStore store, Tenants tenants, Caller caller, LoadRestRequest r) {
        tenants.require(instanceId(r.getInstanceId()), caller, "a load");
        return plan(store.planRest(r.getInstanceId(), r.getWorkerRank(),
                Token.fromBytes(r.getId().toByteArray(), "copy id"), r.getFromBlock(), r.getToBlock()));
    }

    private static CopyPlan plan(io.pegaflow.engine.CopyPlan p) {
        CopyPlan.Builder b = CopyPlan.newBuilder().setId(ByteString.copyFrom(p.id().toBytes())).setBlocks(p.blocks()).setSkippedBlocks(p.skippedBlocks())
                .setDirection(p.direction() == io.pegaflow.engine.CopyPlan.Direction.LOAD ? CopyDirection.LOAD
                        : CopyDirection.SAVE).setHoldNanos(p.holdNanos());
        for (int j = 0; j < p.runs(); j++) {
            b.addRunBlock(p.runBlock()[j]).addRunRegion(p.runRegion()[j]).addRunCount(p.runCount()[j])
                    .addRunOffset(p.runOffset()[j]);
        }
        return b.build();
    }

    @Override
    public void endCopy(EndCopyRequest r, StreamObserver<CopyResult> out) {
        answer(out, () -> endCopy(store, tenants, Credentials.CALLER.get(), r));
    }

    /** EndCopy on {@code store}: the gRPC method and the local socket's. */
    static CopyResult endCopy(LocalStore store, Tenants tenants, Caller caller, EndCopyRequest r) {
        tenants.require(instanceId(r.getInstanceId()), caller, "ending a copy");
        if (r.getUnused()) {
            if (r.getOk() || r.getBytes() != 0 || r.getNanos() != 0) {
                throw new InvalidArgumentException("end of copy: unused with ok " + r.getOk() + ", bytes " + r.getBytes()
                        + ", nanos " + r.getNanos() + "; an unused begun load moved nothing (expected false, 0, 0)");
            }
            store.dropBegun(r.getInstanceId(), Token.fromBytes(r.getId().toByteArray(), "copy id"));
            return CopyResult.getDefaultInstance();
        }
        io.pegaflow.engine.CopyResult c = store.endCopy(r.getInstanceId(), Token.fromBytes(r.getId().toByteArray(), "copy id"),
                r.getOk(), r.getBytes(), r.getNanos());
        return CopyResult.newBuilder().setBlocks(c.blocks()).setSkippedBlocks(c.skippedBlocks()).setBytes(c.bytes()).build();
    }

    @Override
    public void query(QueryRequest r, StreamObserver<QueryResponse> out) {
        answer(out, () -> query(store, tenants, Credentials.CALLER.get(), r));
    }

    /** Query + lease on {@code store}: the gRPC method and the local socket's ({@link LocalSocketServer}). */
    static QueryResponse query(LocalStore store, Tenants tenants, Caller caller, QueryRequest r) {
        tenants.require(instanceId(r.getInstanceId()), caller, "a query");
        QueryResult q = r.getBegin()
                ? store.queryAndBegin(r.getInstanceId(), hashes(r.getHashes(), r.getHashLen()), r.getBeginWorkerRank())
                : store.query(r.getInstanceId(), hashes(r.getHashes(), r.getHashLen()));
        QueryResponse.Builder b = QueryResponse.newBuilder().setHitBlocks(q.hitBlocks()).setPendingBlocks(q.pendingBlocks());
        if (q.hasLease()) {
            b.setLease(ByteString.copyFrom(q.lease().toBytes()));
        }
        if (q.begun() != null) {
            b.setBegun(plan(q.begun()));
        }
        return b.build();
    }

    @Override
    public void release(ReleaseRequest r, StreamObserver<Empty> out) {
        answer(out, () -> {
            release(store, tenants, Credentials.CALLER.get(), r);
            return EMPTY;
        });
    }

    /** Release on {@code store}: the gRPC method and the local socket's. */
    static void release(LocalStore store, Tenants tenants, Caller caller, ReleaseRequest r) {
        tenants.require(instanceId(r.getInstanceId()), caller, "a release");
        store.release(r.getInstanceId(), Token.fromBytes(r.getLease().toByteArray()));
    }

    /** Off the transport thread: it may wait on the cluster registry ({@link #waitingPool}). */
    @Override
    public void flush(FlushRequest r, StreamObserver<Empty> out) {
        try {
            waiting.execute(() -> answer(out, () -> {
                store.flush();
                return EMPTY;
            }));
        } catch (java.util.concurrent.RejectedExecutionException full) {
            out.onError(Errors.toStatus(new QuotaExceededException("Flush: " + WAITING_THREADS + " calls waiting on the "
                    + "cluster registry and " + MAX_WAITING_CALLS + " queued (EngineService.MAX_WAITING_CALLS); try again")));
        }
    }

    /** vLLM's reset_cache for an instance the caller acts for: its namespace cleared, pool and SSD. */
    @Override
    public void resetCache(ResetCacheRequest r, StreamObserver<ResetCacheResponse> out) {
        answer(out, () -> {
            String id = instanceId(r.getInstanceId());
            tenants.require(id, Credentials.CALLER.get(), "resetting the cache");
            LocalStore.Cleared c = store.resetCache(id);
            return ResetCacheResponse.newBuilder().setBlocks(c.blocks()).setBytes(c.bytes()).setReferencedBlocks(c.referenced())
                    .setUnpinnedBlocks(c.unpinned()).setSsdRecords(c.ssdRecords()).build();
        });
    }

    /** A request's retention hint "low" for an instance the caller acts for. */
    @Override
    public void demote(DemoteRequest r, StreamObserver<DemoteResponse> out) {
        answer(out, () -> {
            String id = instanceId(r.getInstanceId());
            tenants.require(id, Credentials.CALLER.get(), "demoting blocks");
            return DemoteResponse.newBuilder().setBlocks(store.demote(id, hashes(r.getHashes(), r.getHashLen()))).build();
        });
    }

    /** The store's block events of an instance the caller acts for (its namespace only). */
    @Override
    public void kvEvents(KvEventsRequest r, StreamObserver<KvEventsResponse> out) {
        answer(out, () -> {
            String id = instanceId(r.getInstanceId());
            tenants.require(id, Credentials.CALLER.get(), "reading KV events");
            KvEventLog.Batch b = store.kvEvents(id, r.getAfter(), r.getMaxEvents());
            KvEventsResponse.Builder reply = KvEventsResponse.newBuilder().setNext(b.next()).setGap(b.gap());
            for (KvEventLog.Event e : b.events()) {
                reply.addEvents(KvEvent.newBuilder().setSeq(e.seq()).setStored(e.kind() == KvEventLog.Kind.STORED)
                        .setTier(e.tier()).setHash(ByteString.copyFrom(e.hash())).setEpochMillis(e.epochMillis()));
            }
            return reply.build();
        });
    }

    @Override
    public void stats(StatsRequest r, StreamObserver<StatsResponse> out) {
        answer(out, () -> {
            EngineStats s = store.stats();
            StatsResponse.Builder b = StatsResponse.newBuilder();
            for (Gauge g : Gauge.values()) {
                b.putValues(g.metricName(), s.get(g));
            }
            for (Counter c : Counter.values()) {
                b.putValues(c.metricName(), s.get(c));
            }
            return b.build();
        });
    }

    @Override
    public void session(SessionRequest r, StreamObserver<SessionEvent> out) {
        ServerCallStreamObserver<SessionEvent> call = (ServerCallStreamObserver<SessionEvent>) out;
        try {
            instanceId(r.getInstanceId());
            tenants.require(r.getInstanceId(), Credentials.CALLER.get(), "a liveness session");
        } catch (RuntimeException refused) {
            out.onError(Errors.toStatus(refused));
            return;
        }
        long token = sessions.open(r.getInstanceId());
        call.setOnCancelHandler(() -> sessions.ended(r.getInstanceId(), token));
        call.setOnCloseHandler(() -> sessions.ended(r.getInstanceId(), token));
        // Nothing is ever sent: the open stream is the liveness signal.
    }

    @Override
    public void shutdown(Empty request, StreamObserver<Empty> out) {
        answer(out, () -> EMPTY);
        Thread.ofPlatform().name("pegaflow-shutdown").start(shutdown);
    }
}
