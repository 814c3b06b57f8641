package io.pegaflow.server;

import io.pegaflow.client.EngineClient;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.ScratchServers;
import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.TransferEngine;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Comparator;
import java.util.function.Function;
import java.util.stream.Stream;

/**
 * The connector's warm-up in server mode ({@link ScratchServers}, for {@code io.pegaflow.connector.LookupWarmUp}): a pegaflow-server
 * started in the calling process on loopback (an ephemeral port, its local socket, its pool file
 * and token in a new 0700 directory, no HTTP, no metrics, no warm-up of its own), and a client
 * engine of it, so the warm-up's rounds run the client's side of every store call a server-mode
 * request makes. Its start logs nothing below a warning. Closing it closes the client, stops the server and removes the directory.
 */
public final class ScratchServer implements ScratchServers {
    /** Spun for a client's next frame, µs: the client's answers are then read spinning, as beside a busy-polling server. */
    static final long BUSY_POLL_US = 1000;

    @Override
    public Client open(long poolBytes, Function<HostPool, TransferEngine> transfer) throws IOException {
        return start(poolBytes, transfer);
    }

    /** {@link #open}, the server itself within reach (its calls' counts: {@link Warmup}). */
    static Opened start(long poolBytes, Function<HostPool, TransferEngine> transfer) throws IOException {
        Path dir = Files.createTempDirectory("pegaflow-warm-up-"); // 0700: nobody else reaches the pool or the token
        PegaflowServer server = null;
        // its start's line about its pool would read, in vLLM's log, as this process's pool
        java.util.logging.Logger announcer = java.util.logging.Logger.getLogger(PegaflowServer.class.getName());
        java.util.logging.Level level = announcer.getLevel();
        announcer.setLevel(java.util.logging.Level.WARNING);
        try {
            try {
                server = PegaflowServer.start(new PegaflowServer.Config("127.0.0.1:0", null, poolBytes, dir.resolve("pool"),
                        Duration.ofSeconds(60), Duration.ofSeconds(2), false), true, BUSY_POLL_US);
            } finally {
                announcer.setLevel(level);
            }
            return new Opened(server, EngineClient.connect("127.0.0.1:" + server.port(), transfer, 5000), dir);
        } catch (IOException | RuntimeException e) {
            if (server != null) {
                server.close();
            }
            remove(dir);
            throw e;
        }
    }

    /** A started scratch server and its client; closing closes the client, stops the server, removes the directory. */
    record Opened(PegaflowServer server, PegaEngine engine, Path dir) implements Client {
        @Override
        public void close() {
            try {
                engine.close();
            } finally {
                try {
                    server.close();
                } finally {
                    remove(dir);
                }
            }
        }
    }

    private static void remove(Path dir) {
        try (Stream<Path> files = Files.walk(dir)) {
            files.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        } catch (IOException ignored) {
            // a temporary directory left behind
        }
    }
}
