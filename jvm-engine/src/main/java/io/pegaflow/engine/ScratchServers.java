package io.pegaflow.engine;

import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.TransferEngine;
import java.io.IOException;
import java.util.ServiceLoader;
import java.util.function.Function;

/**
 * Private pegaflow-servers started in the calling process, each with a client engine of it: what
 * the connector's warm-up runs a server-mode process's store calls through (the server module
 * provides it, {@code META-INF/services}; the engine and the connector know only this interface).
 */
public interface ScratchServers {
    /**
     * A client engine of a new private server holding {@code poolBytes}, copying through {@code
     * transfer}; closing it closes the client, stops the server and removes its files.
     */
    Client open(long poolBytes, Function<HostPool, TransferEngine> transfer) throws IOException;

    /** The scratch client engine and the server it holds. */
    interface Client extends AutoCloseable {
        PegaEngine engine();

        @Override
        void close();
    }

    /** This jar's provider, or null where it carries none. */
    static ScratchServers provided() {
        return ServiceLoader.load(ScratchServers.class, ScratchServers.class.getClassLoader()).findFirst().orElse(null);
    }
}
