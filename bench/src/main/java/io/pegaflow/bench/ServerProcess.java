package io.pegaflow.bench;

import io.pegaflow.client.EngineClient;
import io.pegaflow.client.RemoteStore;
import io.pegaflow.engine.BlockStore;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.transfer.TransferEngine;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Proxy;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;

/**
 * A pegaflow-server in its own process, on a free port, its pool in /dev/shm: the control
 * plane of {@code pegaflow-bench paths}' server mode. This process attaches to it as a
 * worker does, with its calls to the server timed into the run's {@link Timeline}.
 */
final class ServerProcess implements AutoCloseable {
    /** The environment variable a vLLM launch's processes share their join secret through. */
    static final String JOIN_SECRET_ENV = "PEGAFLOW_JOIN_SECRET";

    final Process process;
    final String endpoint;
    final double startSeconds;
    final Path dir;
    final Path poolPath;

    private ServerProcess(Process process, String endpoint, double startSeconds, Path dir, Path poolPath) {
        this.poolPath = poolPath;
        this.process = process;
        this.endpoint = endpoint;
        this.startSeconds = startSeconds;
        this.dir = dir;
    }

    /**
     * The join secret a run's server clients present, its worker processes too: the inherited
     * {@code $PEGAFLOW_JOIN_SECRET}, else one drawn for the run.
     */
    static byte[] joinSecret() {
        String s = System.getenv(JOIN_SECRET_ENV);
        if (s != null && !s.isEmpty()) {
            return s.getBytes(StandardCharsets.UTF_8);
        }
        byte[] raw = new byte[16];
        new SecureRandom().nextBytes(raw);
        return HexFormat.of().formatHex(raw).getBytes(StandardCharsets.UTF_8);
    }

    /** Starts the server with {@code javaBin} and waits until it says it is ready. */
    static ServerProcess start(String javaBin, long poolBytes, Path poolDir, long busyPollUs)
            throws IOException, InterruptedException {
        Path dir = Files.createTempDirectory("pegaflow-paths");
        int port;
        try (ServerSocket s = new ServerSocket(0)) {
            port = s.getLocalPort();
        }
        int http;
        try (ServerSocket s = new ServerSocket(0)) {
            http = s.getLocalPort();
        }
        Path shm = Path.of("/dev/shm");
        Path poolPath = (poolDir != null ? poolDir : Files.isDirectory(shm) ? shm : dir).resolve("pegaflow-paths-" + port + ".pool");
        List<String> cmd = new ArrayList<>(List.of(javaBin, "--enable-native-access=ALL-UNNAMED",
                "-cp", System.getProperty("java.class.path"), "io.pegaflow.server.ServerMain",
                "--addr", "127.0.0.1:" + port, "--http-addr", "127.0.0.1:" + http,
                "--pool-size", Long.toString(poolBytes), "--pool-path", poolPath.toString(),
                "--busy-poll-us", Long.toString(busyPollUs),
                "--owner-pid", Long.toString(ProcessHandle.current().pid())));
        long t0 = System.nanoTime();
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        BufferedReader out = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8));
        String line;
        StringBuilder seen = new StringBuilder();
        while ((line = out.readLine()) != null) {
            seen.append(line).append('\n');
            if (line.startsWith("pegaflow-server ") && line.contains(" ready ")) {
                break;
            }
        }
        if (line == null) {
            throw new IOException("pegaflow-server exited before it listened:\n" + seen);
        }
        double startSeconds = (System.nanoTime() - t0) / 1e9;
        Thread.ofPlatform().daemon().start(() -> out.lines().forEach(l -> System.err.println("[server] " + l)));
        return new ServerProcess(p, "127.0.0.1:" + port, startSeconds, dir, poolPath);
    }

    /**
     * {@link EngineClient#open} on this server with the worker's calls to the server timed into
     * {@code timeline} too (each copy-plan call's start and return, by name).
     */
    PegaEngine attachTimed(Function<HostPool, TransferEngine> transfer, Timeline timeline, byte[] joinSecret) {
        return EngineClient.open(RemoteStore.connect(endpoint, 30_000, true, joinSecret), transfer,
                store -> (BlockStore) Proxy.newProxyInstance(
                        BlockStore.class.getClassLoader(), new Class<?>[] {BlockStore.class},
                        (proxy, method, args) -> {
                            boolean copyCall = switch (method.getName()) {
                                case "reserveSave", "beginLoad", "planRest", "endCopy" -> true;
                                default -> false;
                            };
                            if (copyCall) {
                                timeline.add(method.getName(), 0);
                            }
                            try {
                                return method.invoke(store, args);
                            } catch (InvocationTargetException e) {
                                throw e.getCause();
                            } finally {
                                if (copyCall) {
                                    timeline.add("/" + method.getName(), 0);
                                }
                            }
                        })).engine();
    }

    @Override
    public void close() throws InterruptedException {
        process.destroy();
        if (!process.waitFor(20, TimeUnit.SECONDS)) {
            process.destroyForcibly();
        }
    }
}
