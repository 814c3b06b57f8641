package io.pegaflow.client;

import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.TransferEngine;
import io.pegaflow.client.proto.HealthResponse;
import java.nio.file.Path;
import java.util.function.Function;

/**
 * A worker-side engine whose control plane is pegaflow-server: asks the server where its
 * shared pool is, maps it, and returns a {@link PegaEngine} that copies between this
 * process's regions and the pool itself (host memcpy, or CUDA with the pool pinned here).
 */
public final class EngineClient {
    private EngineClient() {}

    /**
     * Connects to the server at {@code endpoint} ({@code HOST:PORT}); every call has a
     * deadline of {@code deadlineMs}. Throws {@link io.pegaflow.engine.ServerUnavailableException}
     * when the server does not answer.
     */
    public static PegaEngine connect(String endpoint, Function<HostPool, TransferEngine> transfer, long deadlineMs) {
        return open(endpoint, transfer, deadlineMs).engine();
    }

    /** A connected engine and the identity of the server process it talks to. */
    public record Connection(PegaEngine engine, String serverId) {}

    /**
     * Like {@link #connect}, also returning the server's id (it changes on every server
     * start), so a client can tell a restarted server from one that was briefly unreachable.
     */
    public static Connection open(String endpoint, Function<HostPool, TransferEngine> transfer, long deadlineMs) {
        return open(endpoint, transfer, deadlineMs, null);
    }

    /**
     * Like {@link #open(String, Function, long)}, the client presenting {@code joinSecret}
     * (null: none), so it acts for the instances of every process that presents the same
     * ({@link RemoteStore#connect(String, long, boolean, byte[])}).
     */
    public static Connection open(String endpoint, Function<HostPool, TransferEngine> transfer, long deadlineMs,
            byte[] joinSecret) {
        return open(RemoteStore.connect(endpoint, deadlineMs, true, joinSecret), transfer);
    }

    /** Like {@link #open(String, Function, long)} over a client the caller made (in-process transport in tests); takes ownership of it. */
    public static Connection open(RemoteStore store, Function<HostPool, TransferEngine> transfer) {
        return open(store, transfer, s -> s);
    }

    /**
     * Like {@link #open(RemoteStore, Function)}, the engine calling the server through
     * {@code decorate}'s view of the client (benchmarks timing each call); takes ownership of it.
     */
    public static Connection open(RemoteStore store, Function<HostPool, TransferEngine> transfer,
            java.util.function.UnaryOperator<io.pegaflow.engine.BlockStore> decorate) {
        try {
            HealthResponse health = store.health();
            HostPool pool = HostPool.shared(Path.of(health.getPoolPath()), health.getPoolBytes(), false);
            PegaEngine engine = PegaEngine.attach(decorate.apply(store), pool, transfer);
            store.warmLocal(); // the first save or load then finds its connection open
            return new Connection(engine, health.getServerId());
        } catch (RuntimeException e) {
            store.close();
            throw e;
        }
    }
}
