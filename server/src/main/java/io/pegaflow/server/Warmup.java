package io.pegaflow.server;

import com.google.protobuf.ByteString;
import io.pegaflow.client.proto.BeginLoadRequest;
import io.pegaflow.client.proto.CopyPlan;
import io.pegaflow.client.proto.EndCopyRequest;
import io.pegaflow.client.proto.QueryRequest;
import io.pegaflow.client.proto.QueryResponse;
import io.pegaflow.client.proto.ReleaseRequest;
import io.pegaflow.client.proto.ReserveSaveRequest;
import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.LocalStore;
import io.pegaflow.engine.WorkerSpec;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;

/**
 * Runs the server's per-operation paths (the request messages, save planning, commit, query,
 * load planning, end, release) on a scratch store of its own before the server serves, so
 * the JIT has compiled them when the first worker's operation arrives: without it the first
 * few operations of a fresh server ran at a fraction of steady speed (6 GB/s instead of ~40
 * on the H200, steady after about 9). The scratch store only keeps books, no pool memory; the
 * real store, its metrics and its pool are untouched.
 */
final class Warmup {
    private static final int LAYERS = 32;
    private static final int BLOCKS = 512;
    private static final int ROUNDS = 40;

    private Warmup() {}

    /** Returns the nanoseconds it took. */
    static long run() {
        long start = System.nanoTime();
        long slot = 2L * 32 * 1024;
        try (LocalStore store = new LocalStore(EngineConfig.builder().poolBytes(4L * BLOCKS * LAYERS * slot).build(),
                4L * BLOCKS * LAYERS * slot)) {
            String instance = "warm-up";
            store.registerInstance(new InstanceSpec(instance, "warm-up", 1, 1));
            List<LayerRegion> layers = new ArrayList<>();
            long base = 1L << 40;
            long layerBytes = 2L * BLOCKS * 32 * 1024;
            for (int l = 0; l < LAYERS; l++) {
                layers.add(new LayerRegion("layers." + l, KvLayout.SPLIT_KV, base + l * layerBytes, layerBytes, BLOCKS,
                        32 * 1024, 32 * 1024, (long) BLOCKS * 32 * 1024));
            }
            store.registerWorker(instance, new WorkerSpec(0, 0, 0, layers));
            Random rnd = new Random(1);
            for (int round = 0; round < ROUNDS; round++) {
                int n = round % 2 == 0 ? BLOCKS / 2 : BLOCKS / 8;
                byte[] hashes = new byte[n * 32];
                rnd.nextBytes(hashes);
                ReserveSaveRequest.Builder save = ReserveSaveRequest.newBuilder().setInstanceId(instance).setWorkerRank(0)
                        .setHashes(ByteString.copyFrom(hashes)).setHashLen(32);
                BeginLoadRequest.Builder load = BeginLoadRequest.newBuilder().setInstanceId(instance).setWorkerRank(0);
                for (int i = 0; i < n; i++) {
                    save.addBlockIds(i);
                    load.addDstBlockIds(BLOCKS - 1 - i);
                }
                CopyPlan saved = CopyPlan.parseFrom(EngineService.reserveSave(store, ReserveSaveRequest.parseFrom(
                        save.build().toByteArray())).toByteArray());
                EngineService.endCopy(store, EndCopyRequest.newBuilder().setInstanceId(instance).setId(saved.getId())
                        .setOk(true).build());
                QueryResponse q = EngineService.query(store, QueryRequest.newBuilder().setInstanceId(instance)
                        .setHashes(ByteString.copyFrom(hashes)).setHashLen(32).build());
                CopyPlan loaded = CopyPlan.parseFrom(EngineService.beginLoad(store, load.setLease(q.getLease()).build())
                        .toByteArray());
                EngineService.endCopy(store, EndCopyRequest.newBuilder().setInstanceId(instance).setId(loaded.getId())
                        .setOk(true).build());
                if (round % 3 == 0) {
                    // a lease released unconsumed, as a scheduler does when it drops a request
                    QueryResponse again = EngineService.query(store, QueryRequest.newBuilder().setInstanceId(instance)
                            .setHashes(ByteString.copyFrom(hashes)).setHashLen(32).build());
                    EngineService.release(store, ReleaseRequest.newBuilder().setInstanceId(instance)
                            .setLease(again.getLease()).build());
                }
            }
            store.unregisterInstance(instance);
        } catch (com.google.protobuf.InvalidProtocolBufferException e) {
            throw new IllegalStateException("warm-up: a message of ours did not parse", e);
        }
        return System.nanoTime() - start;
    }
}
