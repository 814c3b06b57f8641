package io.pegaflow.server;

import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.inprocess.InProcessServerBuilder;
import io.pegaflow.client.RemoteStore;
import io.pegaflow.engine.BlockStore;
import io.pegaflow.engine.BlockStoreContract;
import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.pool.HostPool;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Path;
import java.time.Duration;
import org.junit.jupiter.api.io.TempDir;

/**
 * The store contract on pegaflow-server's store, reached the way workers reach it: a
 * {@link RemoteStore} over grpc's in-process transport (a unique name per test) and an
 * engine attached to the server's shared pool that copies through its own mapping. One
 * server per test, sized by the test's config; the server's {@code LocalStore} answers for
 * invariants, open operations and sweeps. The server keeps its own clock and in-flight TTL,
 * so the two expiry tests are skipped here.
 */
class RemoteStoreContractTest extends BlockStoreContract {
    private static final long DEADLINE_MS = 5000;

    @TempDir
    Path dir;

    private PegaflowServer server;
    private String name;

    private void startServer(EngineConfig config) {
        if (server != null) {
            throw new IllegalStateException("one server per test");
        }
        name = "pegaflow-contract-" + System.nanoTime();
        PegaflowServer.Config c = new PegaflowServer.Config("127.0.0.1:0", null, config.poolBytes(), dir.resolve("pool"),
                config.leaseTtl(), Duration.ofMillis(100), false);
        try {
            server = PegaflowServer.start(c, InProcessServerBuilder.forName(name).directExecutor());
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    private RemoteStore client() {
        return RemoteStore.over(InProcessChannelBuilder.forName(name).directExecutor().build(), name, DEADLINE_MS);
    }

    @Override
    protected PegaEngine engine(EngineConfig config) {
        startServer(config);
        HostPool pool = HostPool.shared(server.poolPath(), config.poolBytes(), false);
        return PegaEngine.attach(client(), pool, config.transfer());
    }

    @Override
    protected BlockStore store(EngineConfig config) {
        startServer(config);
        return client();
    }

    @Override
    protected void verifyInvariants() {
        server.store().verifyInvariants();
    }

    @Override
    protected int openOperations() {
        return server.store().openOperations();
    }

    @Override
    protected void sweep() {
        server.store().sweep();
    }

    @Override
    protected boolean followsTheConfiguredClock() {
        return false; // PegaflowServer builds its store with the system clock and the default in-flight TTL
    }

    @Override
    protected void stopControlPlane() {
        if (server != null) {
            try {
                server.store().verifyInvariants(); // close() only logs a pool accounting leak
            } finally {
                server.close();
                server = null;
            }
        }
    }
}
