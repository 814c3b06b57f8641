package io.pegaflow.server;

import com.google.protobuf.ByteString;
import io.pegaflow.client.proto.BeginLoadRequest;
import io.pegaflow.client.proto.CopyPlan;
import io.pegaflow.client.proto.EndCopyRequest;
import io.pegaflow.client.proto.LoadRestRequest;
import io.pegaflow.client.proto.QueryRequest;
import io.pegaflow.client.proto.QueryResponse;
import io.pegaflow.client.proto.ReleaseRequest;
import io.pegaflow.client.proto.ReserveSaveRequest;
import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.store.LocalStore;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.client.Wire;
import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;

/**
 * Runs the server's per-operation paths (the local socket's frames, the request messages, save
 * planning, commit, query, load planning in two parts, end, release) on a scratch store of its own before
 * the server serves, so the JIT has compiled them when the first worker's operation arrives:
 * without it the first few operations of a fresh server ran at a fraction of steady speed on
 * the H200 (docs/gpu.md, "Cold paths"). The operations go through a {@link LocalSocketServer} on a private socket of the scratch store,
 * as a worker's do, for {@link #ROUNDS} rounds or {@link #BUDGET_NANOS}, whichever ends first:
 * the first operations' control-plane calls then cost much less than after a shorter warm-up
 * on the store directly (docs/gpu.md, "What changed on 2026-12-01"; pegaflow-bench paths,
 * server_control_reserve_save_ms_256). The scratch store only keeps books, no pool
 * memory; the real store, its metrics and its pool are untouched.
 */
final class Warmup {
    private static final int LAYERS = 32;
    private static final int BLOCKS = 2048;
    private static final int ROUNDS = 600;
    private static final long BUDGET_NANOS = 4_000_000_000L;

    private Warmup() {}

    /** Returns the nanoseconds it took. */
    static long run() {
        long start = System.nanoTime();
        long slot = 2L * 32 * 1024;
        Path dir = null;
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
            dir = Files.createTempDirectory("pegaflow-warm-up-"); // 0700: nobody else connects
            Path socket = dir.resolve("s");
            try (LocalSocketServer server = LocalSocketServer.start(socket, store, null, null, 2, Duration.ofSeconds(10));
                    Frames client = new Frames(socket)) {
                Random rnd = new Random(1);
                for (int round = 0; round < ROUNDS && System.nanoTime() - start < BUDGET_NANOS; round++) {
                    // mostly the sizes a scheduler step moves, now and then a long prefix
                    int n = round % 10 == 9 ? BLOCKS : round % 2 == 0 ? 256 : 16;
                    byte[] hashes = new byte[n * 32];
                    rnd.nextBytes(hashes);
                    ReserveSaveRequest.Builder save = ReserveSaveRequest.newBuilder().setInstanceId(instance).setWorkerRank(0)
                            .setHashes(ByteString.copyFrom(hashes)).setHashLen(32);
                    BeginLoadRequest.Builder load = BeginLoadRequest.newBuilder().setInstanceId(instance).setWorkerRank(0);
                    for (int i = 0; i < n; i++) {
                        save.addBlockIds(i);
                        load.addDstBlockIds(BLOCKS - 1 - i);
                    }
                    CopyPlan saved = CopyPlan.parseFrom(client.call(Wire.RESERVE_SAVE, save.build()));
                    client.call(Wire.END_COPY, EndCopyRequest.newBuilder().setInstanceId(instance).setId(saved.getId())
                            .setOk(true).build());
                    QueryRequest query = QueryRequest.newBuilder().setInstanceId(instance)
                            .setHashes(ByteString.copyFrom(hashes)).setHashLen(32).build();
                    QueryResponse q = QueryResponse.parseFrom(client.call(Wire.QUERY, query));
                    // in two parts as a worker's long loads go: the head, then LoadRest
                    int head = io.pegaflow.engine.PegaEngine.headBlocks(n);
                    CopyPlan loaded = CopyPlan.parseFrom(client.call(Wire.BEGIN_LOAD, load.setLease(q.getLease())
                            .setPlanBlocks(head).build()));
                    if (head > 0) {
                        CopyPlan.parseFrom(client.call(Wire.LOAD_REST, LoadRestRequest.newBuilder().setInstanceId(instance)
                                .setWorkerRank(0).setId(loaded.getId()).setFromBlock(head).setToBlock(n).build()));
                    }
                    client.call(Wire.END_COPY, EndCopyRequest.newBuilder().setInstanceId(instance).setId(loaded.getId())
                            .setOk(true).build());
                    if (round % 3 == 0) {
                        // a lease released unconsumed, as a scheduler does when it drops a request
                        QueryResponse again = QueryResponse.parseFrom(client.call(Wire.QUERY, query));
                        client.call(Wire.RELEASE, ReleaseRequest.newBuilder().setInstanceId(instance)
                                .setLease(again.getLease()).build());
                    }
                    // a lookup that begins its load (a worker in the scheduler's process), then its end
                    QueryResponse begun = QueryResponse.parseFrom(client.call(Wire.QUERY,
                            query.toBuilder().setBegin(true).setBeginWorkerRank(0).build()));
                    if (begun.hasBegun()) {
                        // copied, or dropped unused as a scheduler does when it drops the request
                        client.call(Wire.END_COPY, EndCopyRequest.newBuilder().setInstanceId(instance)
                                .setId(begun.getBegun().getId()).setOk(round % 3 != 1).setUnused(round % 3 == 1).build());
                    }
                }
            }
            store.unregisterInstance(instance);
        } catch (IOException e) {
            throw new IllegalStateException("warm-up: " + e, e);
        } finally {
            if (dir != null) {
                try {
                    Files.deleteIfExists(dir.resolve("s"));
                    Files.deleteIfExists(dir);
                } catch (IOException ignored) {
                    // a temporary directory left behind
                }
            }
        }
        return System.nanoTime() - start;
    }

    /** The client half of the local socket's frames (Wire), blocking: one request, one answer. */
    private static final class Frames implements AutoCloseable {
        private final SocketChannel ch;

        Frames(Path socket) throws IOException {
            ch = SocketChannel.open(StandardProtocolFamily.UNIX);
            ch.connect(UnixDomainSocketAddress.of(socket));
        }

        byte[] call(byte method, com.google.protobuf.MessageLite request) throws IOException {
            byte[] body = request.toByteArray();
            ByteBuffer out = ByteBuffer.allocate(5 + body.length).putInt(1 + body.length).put(method).put(body).flip();
            while (out.hasRemaining()) {
                ch.write(out);
            }
            ByteBuffer head = ByteBuffer.allocate(5);
            fill(head);
            ByteBuffer answer = ByteBuffer.allocate(head.getInt(0) - 1);
            fill(answer);
            if (head.get(4) != 0) {
                throw new IOException("warm-up request " + method + " refused: "
                        + new String(answer.array(), java.nio.charset.StandardCharsets.UTF_8));
            }
            return answer.array();
        }

        private void fill(ByteBuffer b) throws IOException {
            while (b.hasRemaining()) {
                if (ch.read(b) < 0) {
                    throw new IOException("the warm-up socket closed");
                }
            }
        }

        @Override
        public void close() throws IOException {
            ch.close();
        }
    }
}
