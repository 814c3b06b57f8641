package io.pegaflow.server;

import com.google.protobuf.ByteString;
import io.grpc.stub.ServerCallStreamObserver;
import io.grpc.stub.StreamObserver;
import io.pegaflow.engine.EngineStats;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.LeaseId;
import io.pegaflow.engine.LoadResult;
import io.pegaflow.engine.LocalStore;
import io.pegaflow.engine.QueryResult;
import io.pegaflow.engine.SaveResult;
import io.pegaflow.engine.TopologyMismatchException;
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
import io.pegaflow.server.proto.LoadPlan;
import io.pegaflow.server.proto.QueryRequest;
import io.pegaflow.server.proto.QueryResponse;
import io.pegaflow.server.proto.RegisterInstanceRequest;
import io.pegaflow.server.proto.RegisterWorkerRequest;
import io.pegaflow.server.proto.ReleaseRequest;
import io.pegaflow.server.proto.ReserveSaveRequest;
import io.pegaflow.server.proto.SavePlan;
import io.pegaflow.server.proto.SessionEvent;
import io.pegaflow.server.proto.SessionRequest;
import io.pegaflow.server.proto.StatsRequest;
import io.pegaflow.server.proto.StatsResponse;
import io.pegaflow.server.proto.UnregisterInstanceRequest;
import java.util.ArrayList;
import java.util.List;
import java.util.function.Supplier;

/**
 * The gRPC face of a {@link LocalStore}: translates messages to engine calls and engine
 * exceptions to statuses ({@link Errors}). Validation stays in the engine, so a bad request
 * is refused exactly as an in-process call would be, and nothing changes.
 */
final class EngineService extends EngineGrpc.EngineImplBase {
    private final LocalStore store;
    private final Sessions sessions;
    private final Supplier<HealthResponse> health;
    private final Runnable shutdown;

    EngineService(LocalStore store, Sessions sessions, Supplier<HealthResponse> health, Runnable shutdown) {
        this.store = store;
        this.sessions = sessions;
        this.health = health;
        this.shutdown = shutdown;
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

    static byte[][] hashes(ByteString packed, int hashLen) {
        if (packed.isEmpty()) {
            return new byte[0][];
        }
        if (hashLen < 1 || hashLen > 64 || packed.size() % hashLen != 0) {
            throw new InvalidArgumentException("hashes: " + packed.size() + " bytes with hash_len " + hashLen
                    + "; expected 1 <= hash_len <= 64 dividing the byte count");
        }
        byte[][] out = new byte[packed.size() / hashLen][];
        for (int i = 0; i < out.length; i++) {
            out[i] = new byte[hashLen];
            packed.copyTo(out[i], i * hashLen, 0, hashLen);
        }
        return out;
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
    public void registerInstance(RegisterInstanceRequest r, StreamObserver<Empty> out) {
        answer(out, () -> {
            if (!Version.VERSION.equals(r.getClientVersion())) {
                throw new TopologyMismatchException("PegaFlow version mismatch: client " + r.getClientVersion()
                        + ", server " + Version.VERSION + "; install the same pegaflow-jvm version on both sides");
            }
            store.registerInstance(new InstanceSpec(r.getInstanceId(), r.getNamespace(), r.getTpSize(), r.getWorldSize()));
            return EMPTY;
        });
    }

    @Override
    public void registerWorker(RegisterWorkerRequest r, StreamObserver<Empty> out) {
        answer(out, () -> {
            List<LayerRegion> layers = new ArrayList<>();
            for (io.pegaflow.server.proto.LayerRegion l : r.getLayersList()) {
                KvLayout layout = switch (l.getLayout()) {
                    case SPLIT_KV -> KvLayout.SPLIT_KV;
                    case COMBINED -> KvLayout.COMBINED;
                    case MLA -> KvLayout.MLA;
                    default -> throw new InvalidArgumentException("layer '" + l.getName() + "': layout "
                            + l.getLayoutValue() + "; expected SPLIT_KV, COMBINED or MLA");
                };
                layers.add(new LayerRegion(l.getName(), layout, l.getBaseAddress(), l.getRegionBytes(), l.getNumBlocks(),
                        l.getBlockStride(), l.getSegmentBytes(), l.getSegmentOffset()));
            }
            store.registerWorker(r.getInstanceId(), new WorkerSpec(r.getWorkerRank(), r.getTpRank(), r.getDeviceId(), layers));
            return EMPTY;
        });
    }

    @Override
    public void unregisterInstance(UnregisterInstanceRequest r, StreamObserver<Empty> out) {
        answer(out, () -> {
            store.unregisterInstance(r.getInstanceId());
            return EMPTY;
        });
    }

    @Override
    public void reserveSave(ReserveSaveRequest r, StreamObserver<SavePlan> out) {
        answer(out, () -> {
            List<String> layers = r.getLayerNamesCount() == 0 ? null : r.getLayerNamesList();
            io.pegaflow.engine.SavePlan p = store.reserveSave(r.getInstanceId(), r.getWorkerRank(), layers,
                    longs(r.getBlockIdsList()), hashes(r.getHashes(), r.getHashLen()));
            SavePlan.Builder b = SavePlan.newBuilder().setReservationId(p.reservationId())
                    .setSkippedBlocks(p.skippedBlocks()).setPlannedBlocks(p.plannedBlocks());
            for (int k = 0; k < p.slots(); k++) {
                b.addBlockIndex(p.blockIndex()[k]).addRegionIndex(p.regionIndex()[k]).addHostOffset(p.hostOffset()[k]);
            }
            return b.build();
        });
    }

    @Override
    public void commitSave(CommitSaveRequest r, StreamObserver<io.pegaflow.server.proto.SaveResult> out) {
        answer(out, () -> {
            SaveResult s = store.commitSave(r.getReservationId(), r.getOk(), r.getBytes(), r.getNanos());
            return io.pegaflow.server.proto.SaveResult.newBuilder().setSavedBlocks(s.savedBlocks()).setBytes(s.bytes()).build();
        });
    }

    @Override
    public void query(QueryRequest r, StreamObserver<QueryResponse> out) {
        answer(out, () -> query(store, r));
    }

    /** Query + lease on {@code store}: the gRPC method and the local socket's ({@link LocalSocketServer}). */
    static QueryResponse query(LocalStore store, QueryRequest r) {
        QueryResult q = store.query(r.getInstanceId(), r.getHashes().toByteArray(), r.getHashLen());
        QueryResponse.Builder b = QueryResponse.newBuilder().setHitBlocks(q.hitBlocks());
        if (q.hasLease()) {
            b.setLease(ByteString.copyFrom(q.lease().toBytes()));
        }
        return b.build();
    }

    @Override
    public void release(ReleaseRequest r, StreamObserver<Empty> out) {
        answer(out, () -> {
            release(store, r);
            return EMPTY;
        });
    }

    /** Release on {@code store}: the gRPC method and the local socket's. */
    static void release(LocalStore store, ReleaseRequest r) {
        store.release(LeaseId.fromBytes(r.getLease().toByteArray()));
    }

    @Override
    public void beginLoad(BeginLoadRequest r, StreamObserver<LoadPlan> out) {
        answer(out, () -> {
            io.pegaflow.engine.LoadPlan p = store.beginLoad(r.getInstanceId(), r.getWorkerRank(),
                    LeaseId.fromBytes(r.getLease().toByteArray()), longs(r.getDstBlockIdsList()));
            LoadPlan.Builder b = LoadPlan.newBuilder().setLoadId(p.loadId()).setBlocks(p.blocks());
            for (int k = 0; k < p.hostOffset().length; k++) {
                b.addBlockIndex(p.blockIndex()[k]).addRegionIndex(p.regionIndex()[k]).addHostOffset(p.hostOffset()[k]);
            }
            return b.build();
        });
    }

    @Override
    public void endLoad(EndLoadRequest r, StreamObserver<io.pegaflow.server.proto.LoadResult> out) {
        answer(out, () -> {
            LoadResult l = store.endLoad(r.getLoadId(), r.getOk(), r.getBytes(), r.getNanos());
            return io.pegaflow.server.proto.LoadResult.newBuilder().setBlocks(l.blocks()).setBytes(l.bytes()).build();
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
