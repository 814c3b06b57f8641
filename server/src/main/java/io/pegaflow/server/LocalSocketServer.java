package io.pegaflow.server;

import io.pegaflow.client.Errors;
import io.pegaflow.client.Wire;

import io.pegaflow.engine.ErrorCode;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.LocalStore;
import io.pegaflow.engine.PegaflowException;
import io.pegaflow.engine.pool.PoolFiles;
import io.pegaflow.client.proto.QueryRequest;
import io.pegaflow.client.proto.ReleaseRequest;
import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The scheduler's hot calls (query + lease, release) for clients on this host, over a Unix
 * socket next to the pool file. Same messages as the gRPC service, same store, same errors;
 * what it saves is gRPC's thread handoffs: each connection has one server thread that reads
 * a frame, calls the store and writes the answer, and the client writes and reads on its own
 * calling thread. On this 2-vCPU VM that takes a 2,048-hash query from ~1 ms (gRPC over TCP)
 * to a few hundred microseconds (docs/server.md). Everything else stays on gRPC.
 *
 * <p>Frames: request {@code int32 length, byte method, length-1 bytes of proto}; answer
 * {@code int32 length, byte status (0 ok, else the ErrorCode value), length-1 bytes (the
 * proto, or the error message in UTF-8)}. Big-endian.
 */
final class LocalSocketServer implements AutoCloseable {
    static final byte QUERY = Wire.QUERY;
    static final byte RELEASE = Wire.RELEASE;
    static final int MAX_FRAME = Wire.MAX_FRAME;
    private static final System.Logger LOG = System.getLogger(LocalSocketServer.class.getName());

    private final Path path;
    private final LocalStore store;
    private final RpcMetrics metrics;
    private final ServerSocketChannel server;
    private final Set<SocketChannel> connections = ConcurrentHashMap.newKeySet();
    private volatile boolean open = true;

    private LocalSocketServer(Path path, LocalStore store, RpcMetrics metrics, ServerSocketChannel server) {
        this.path = path;
        this.store = store;
        this.metrics = metrics;
        this.server = server;
    }

    /**
     * Binds the socket of {@code files} (0600, or 0660 with its group, before anyone can
     * connect: {@link PoolFiles#bindSocket}) and starts accepting. A stale socket file was
     * reclaimed when the lock was taken.
     */
    static LocalSocketServer start(PoolFiles files, LocalStore store, RpcMetrics metrics) throws IOException {
        ServerSocketChannel ch = files.bindSocket(path -> {
            ServerSocketChannel c = ServerSocketChannel.open(StandardProtocolFamily.UNIX);
            try {
                c.bind(UnixDomainSocketAddress.of(path));
                return c;
            } catch (IOException | RuntimeException e) {
                c.close();
                throw e;
            }
        });
        LocalSocketServer s = new LocalSocketServer(files.socket(), store, metrics, ch);
        Thread.ofPlatform().daemon().name("pegaflow-local-accept").start(s::accept);
        return s;
    }

    Path path() {
        return path;
    }

    private void accept() {
        while (open) {
            try {
                SocketChannel c = server.accept();
                connections.add(c);
                Thread.ofPlatform().daemon().name("pegaflow-local-conn").start(() -> serve(c));
            } catch (IOException e) {
                if (open) {
                    LOG.log(System.Logger.Level.WARNING, "local socket accept failed: " + e);
                }
                return;
            }
        }
    }

    private void serve(SocketChannel c) {
        ByteBuffer header = ByteBuffer.allocate(5);
        try (c) {
            while (open) {
                header.clear();
                if (!readFully(c, header)) {
                    return; // the client closed the connection
                }
                int length = header.getInt(0);
                byte method = header.get(4);
                if (length < 1 || length > MAX_FRAME) {
                    reply(c, (byte) ErrorCode.INVALID_ARGUMENT.value(), ("frame of " + length + " bytes; expected 1 to "
                            + MAX_FRAME).getBytes(StandardCharsets.UTF_8));
                    return;
                }
                ByteBuffer payload = ByteBuffer.allocate(length - 1);
                if (!readFully(c, payload)) {
                    return;
                }
                byte status = 0;
                byte[] answer;
                long start = System.nanoTime();
                String grpcStatus = "OK";
                try {
                    answer = handle(method, payload.array());
                } catch (PegaflowException e) {
                    status = (byte) e.code().value();
                    answer = String.valueOf(e.getMessage()).getBytes(StandardCharsets.UTF_8);
                    grpcStatus = Errors.toStatus(e).getStatus().getCode().name();
                } catch (com.google.protobuf.InvalidProtocolBufferException e) {
                    status = (byte) ErrorCode.INVALID_ARGUMENT.value();
                    answer = ("malformed request: " + e.getMessage()).getBytes(StandardCharsets.UTF_8);
                } catch (RuntimeException e) {
                    status = (byte) ErrorCode.INTERNAL.value();
                    answer = (e.getClass().getName() + ": " + e.getMessage()).getBytes(StandardCharsets.UTF_8);
                }
                reply(c, status, answer);
                if (metrics != null) {
                    metrics.record(method == QUERY ? "Query" : method == RELEASE ? "Release" : "Unknown",
                            status == 0 ? "OK" : grpcStatus.equals("OK") ? "INTERNAL" : grpcStatus, System.nanoTime() - start);
                }
            }
        } catch (IOException e) {
            // the client went away mid-frame: nothing to answer
        } finally {
            connections.remove(c);
        }
    }

    private byte[] handle(byte method, byte[] payload) throws com.google.protobuf.InvalidProtocolBufferException {
        return switch (method) {
            case QUERY -> EngineService.query(store, QueryRequest.parseFrom(payload)).toByteArray();
            case RELEASE -> {
                EngineService.release(store, ReleaseRequest.parseFrom(payload));
                yield new byte[0];
            }
            default -> throw new InvalidArgumentException("local socket method " + method + "; expected 1 (query) or 2 (release)");
        };
    }

    private static void reply(SocketChannel c, byte status, byte[] body) throws IOException {
        ByteBuffer out = ByteBuffer.allocate(5 + body.length);
        out.putInt(1 + body.length).put(status).put(body).flip();
        while (out.hasRemaining()) {
            c.write(out);
        }
    }

    /** False at a clean end of stream before any byte of {@code buf}. */
    static boolean readFully(SocketChannel c, ByteBuffer buf) throws IOException {
        boolean any = false;
        while (buf.hasRemaining()) {
            int n = c.read(buf);
            if (n < 0) {
                if (any) {
                    throw new IOException("connection closed mid-frame");
                }
                return false;
            }
            any |= n > 0;
        }
        return true;
    }

    @Override
    public void close() {
        open = false;
        try {
            server.close();
        } catch (IOException ignored) {
            // closing anyway
        }
        for (SocketChannel c : connections) {
            try {
                c.close();
            } catch (IOException ignored) {
                // closing anyway
            }
        }
        try {
            Files.deleteIfExists(path);
        } catch (IOException ignored) {
            // a stale socket file is reclaimed at the next start
        }
    }
}
