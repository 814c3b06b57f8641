package io.pegaflow.server;

import io.pegaflow.client.Errors;
import io.pegaflow.client.Wire;

import io.pegaflow.engine.ErrorCode;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.store.LocalStore;
import io.pegaflow.engine.PegaflowException;
import io.pegaflow.engine.pool.PoolFiles;
import io.pegaflow.client.proto.BeginLoadRequest;
import io.pegaflow.client.proto.EndCopyRequest;
import io.pegaflow.client.proto.QueryRequest;
import io.pegaflow.client.proto.ReleaseRequest;
import io.pegaflow.client.proto.ReserveSaveRequest;
import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.Semaphore;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The hot calls (the scheduler's query + lease and release, the workers' copy plans and their
 * ends) for clients on this host, over a Unix
 * socket next to the pool file. Same messages as the gRPC service, same store, same errors;
 * what it saves is gRPC's thread handoffs: each connection has one server thread that reads
 * a frame, calls the store and writes the answer, and the client writes and reads on its own
 * calling thread, so no thread handoff is left in a query (docs/server.md, "Why a local socket
 * next to gRPC", measures both paths). Everything else stays on gRPC, and so does a call whose
 * request or answer could exceed {@link #MAX_FRAME}.
 *
 * <p>The first frame of a connection is method 3 (auth) carrying the server's token (the
 * bytes of the file Health names), then a NUL and the client's id, then a NUL and the join
 * secret it presents (hex), as gRPC's headers carry them; anything else, or a wrong token, is
 * answered PERMISSION_DENIED and the connection closed. Every later frame acts as that
 * {@link Caller}, checked by {@link Tenants} like a gRPC call.
 *
 * <p>Frames: request {@code int32 length, byte method, length-1 bytes of proto}; answer
 * {@code int32 length, byte status (0 ok, else the ErrorCode value), length-1 bytes (the
 * proto, or the error message in UTF-8)}. Big-endian.
 *
 * <p>Bounds, since the clients are mutually untrusted processes: a frame over
 * {@link #MAX_FRAME} is refused (an error answer naming the cap, then the connection closes)
 * before its payload is read; a payload is read into a buffer that grows with the bytes that
 * arrived, never sized by the announced length alone; at most {@link #MAX_CONNECTIONS}
 * connections are served (their threads come from one pool), more are closed at accept with
 * a log line and their clients use gRPC; the first frame (the token) must arrive complete
 * within {@link #AUTH_TIMEOUT} of connecting; once a later frame's first byte arrived, the rest
 * (and the answer's write) must complete within {@link #FRAME_TIMEOUT}, or the connection
 * closes. Refusals are counted and logged once per interval ({@link Rejections}).
 */
final class LocalSocketServer implements AutoCloseable {
    static final byte QUERY = Wire.QUERY;
    static final byte RELEASE = Wire.RELEASE;
    static final byte AUTH = Wire.AUTH;
    static final int MAX_FRAME = Wire.MAX_FRAME;
    /** Connections served at once (one pool thread each). */
    static final int MAX_CONNECTIONS = 64;
    /** Time for the rest of a frame once its first byte arrived, and for writing the answer. */
    static final Duration FRAME_TIMEOUT = Duration.ofSeconds(10);
    /**
     * Time from accept for the first frame (the token) to arrive complete: a connection that
     * never authenticates holds a slot this long at most (the frame timeout, if shorter).
     */
    static final Duration AUTH_TIMEOUT = Duration.ofSeconds(2);
    /**
     * Payload bytes read before the buffer grows (doubling), so memory follows what arrived: a
     * query of 4,096 32-byte hashes fits without a copy; 64 stalled announcers hold 8 MiB at most.
     */
    private static final int CHUNK = 128 << 10;
    private static final System.Logger LOG = System.getLogger(LocalSocketServer.class.getName());

    private final Path path;
    private final LocalStore store;
    private final Tenants tenants;
    private final RpcMetrics metrics;
    private final Rejections rejections;
    private final CallQuota calls;
    private final ServerSocketChannel server;
    /** The first frame of every connection must carry the server's token (null: tests without one). */
    private volatile Credentials credentials;
    private final int maxConnections;
    private final long frameTimeoutNanos;
    private final long authTimeoutNanos;
    /** How long a connection's thread spins for the next frame before it sleeps (0: at once). */
    private volatile long busyPollNanos;
    private final Semaphore slots;
    private final ExecutorService threads = Executors.newCachedThreadPool(
            Thread.ofPlatform().daemon().name("pegaflow-local-conn-", 0).factory());
    private final Set<Conn> connections = ConcurrentHashMap.newKeySet();
    private final AtomicLong refused = new AtomicLong();
    private volatile boolean open = true;

    /** A served connection and the selector its thread waits on (woken by {@link #close}). */
    record Conn(SocketChannel channel, Selector selector) {}

    /** The frame did not complete within {@link #frameTimeoutNanos}. */
    private static final class FrameTimeout extends IOException {
        FrameTimeout(String why) {
            super(why);
        }
    }

    private LocalSocketServer(Path path, LocalStore store, Tenants tenants, RpcMetrics metrics, Rejections rejections,
            CallQuota calls, ServerSocketChannel server, int maxConnections, Duration frameTimeout) {
        this.path = path;
        this.store = store;
        this.tenants = tenants;
        this.rejections = rejections;
        this.calls = calls;
        this.authTimeoutNanos = Math.min(frameTimeout.toNanos(), AUTH_TIMEOUT.toNanos());
        this.metrics = metrics;
        this.server = server;
        this.maxConnections = maxConnections;
        this.frameTimeoutNanos = frameTimeout.toNanos();
        this.slots = new Semaphore(maxConnections);
    }

    /**
     * Binds the socket of {@code files} (0600, or 0660 with its group, before anyone can
     * connect: {@link PoolFiles#bindSocket}) and starts accepting; every connection's first
     * frame must carry {@code credentials}' token. A stale socket file was reclaimed when the
     * lock was taken.
     */
    static LocalSocketServer start(PoolFiles files, LocalStore store, Tenants tenants, RpcMetrics metrics,
            Credentials credentials, Rejections rejections, CallQuota calls) throws IOException {
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
        return started(new LocalSocketServer(files.socket(), store, tenants, metrics, rejections, calls, ch, MAX_CONNECTIONS,
                FRAME_TIMEOUT), credentials);
    }

    /** Tests: at a plain path, with other bounds; null credentials skip the first-frame check. */
    static LocalSocketServer start(Path path, LocalStore store, RpcMetrics metrics, Credentials credentials,
            int maxConnections, Duration frameTimeout) throws IOException {
        return start(path, store, new Tenants(), metrics, credentials, maxConnections, frameTimeout);
    }

    /** Tests: as above, binding instances to callers through {@code tenants}. */
    static LocalSocketServer start(Path path, LocalStore store, Tenants tenants, RpcMetrics metrics, Credentials credentials,
            int maxConnections, Duration frameTimeout) throws IOException {
        Files.deleteIfExists(path);
        ServerSocketChannel ch = ServerSocketChannel.open(StandardProtocolFamily.UNIX);
        try {
            ch.bind(UnixDomainSocketAddress.of(path));
        } catch (IOException | RuntimeException e) {
            ch.close();
            throw e;
        }
        return started(new LocalSocketServer(path, store, tenants, metrics, new Rejections(), new CallQuota(Integer.MAX_VALUE),
                ch, maxConnections, frameTimeout), credentials);
    }

    private static LocalSocketServer started(LocalSocketServer s, Credentials credentials) {
        s.credentials = credentials;
        Thread.ofPlatform().daemon().name("pegaflow-local-accept").start(s::accept);
        return s;
    }

    Path path() {
        return path;
    }

    /** Sets how long connection threads spin for a next frame before sleeping (0: sleep at once). */
    void busyPoll(long micros) {
        if (micros < 0 || micros > 1_000_000) {
            throw new InvalidArgumentException("--busy-poll-us " + micros + "; expected 0 (off) .. 1000000");
        }
        busyPollNanos = micros * 1000;
    }

    long busyPollMicros() {
        return busyPollNanos / 1000;
    }

    /** Connections refused because {@code maxConnections} were open. */
    long refusedConnections() {
        return refused.get();
    }

    private void accept() {
        while (open) {
            SocketChannel c;
            try {
                c = server.accept();
            } catch (IOException e) {
                if (open) {
                    LOG.log(System.Logger.Level.WARNING, "local socket accept failed: " + e);
                }
                return;
            }
            if (!slots.tryAcquire()) {
                refuse(c);
                continue;
            }
            try {
                threads.execute(() -> {
                    try {
                        serve(c);
                    } finally {
                        slots.release();
                    }
                });
            } catch (RejectedExecutionException closing) {
                slots.release();
                closeQuietly(c);
            }
        }
    }

    /** Closes a connection over the cap; counted and logged once per interval ({@link Rejections}). */
    private void refuse(SocketChannel c) {
        long n = refused.incrementAndGet(); // counted before the client can see the close
        closeQuietly(c);
        rejections.record(Rejections.Reason.LOCAL_CONNECTION_CAP, "local socket " + path + ": " + maxConnections
                + " connections open (LocalSocketServer.MAX_CONNECTIONS); closed a new one (" + n
                + " so far); its client uses gRPC");
    }

    private void serve(SocketChannel c) {
        try (c; Selector selector = Selector.open()) {
            c.configureBlocking(false);
            c.register(selector, SelectionKey.OP_READ);
            Conn conn = new Conn(c, selector);
            connections.add(conn);
            try {
                serve(conn);
            } finally {
                connections.remove(conn);
            }
        } catch (FrameTimeout e) {
            rejections.record(Rejections.Reason.LOCAL_STALLED, "local socket " + path + ": " + e.getMessage());
        } catch (IOException e) {
            // the client went away mid-frame, or close(): nothing to answer
        } catch (RuntimeException e) {
            // a bug, not the client's doing: logged through the server's logger (its format),
            // never left to the thread's default handler on stderr
            if (open) {
                LOG.log(System.Logger.Level.WARNING, "local socket " + path + ": connection ended by " + e, e);
            }
        }
    }

    private void serve(Conn c) throws IOException {
        try {
            serveFrames(c);
        } finally {
            String t = tenantOf.remove(c);
            if (t != null) {
                calls.release(t);
            }
        }
    }

    /** Which tenant's call slot each authenticated connection holds ({@link CallQuota}). */
    private final java.util.Map<Conn, String> tenantOf = new ConcurrentHashMap<>();

    private void serveFrames(Conn c) throws IOException {
        ByteBuffer header = ByteBuffer.allocate(5);
        boolean authenticated = credentials == null;
        Caller caller = Caller.NOBODY;
        long authDeadline = System.nanoTime() + authTimeoutNanos;
        while (open) {
            header.clear();
            if (!awaitFirstByte(c, header, authenticated ? 0 : authDeadline)) {
                return; // the client closed the connection
            }
            long deadline = authenticated ? System.nanoTime() + frameTimeoutNanos : authDeadline;
            fill(c, header, deadline);
            int length = header.getInt(0);
            byte method = header.get(4);
            if (length < 1 || length > MAX_FRAME) {
                reply(c, (byte) ErrorCode.INVALID_ARGUMENT.value(), "frame of " + length + " bytes; expected 1 to "
                        + MAX_FRAME + " (Wire.MAX_FRAME)", deadline);
                return;
            }
            byte[] payload = payload(c, length - 1, deadline);
            if (!authenticated) {
                // Before anything else: the token, as over gRPC. A refused connection is closed.
                Hello hello = method == AUTH ? Hello.parse(payload) : null;
                if (hello == null || !credentials.matches(hello.token)) {
                    rejections.record(Rejections.Reason.LOCAL_UNAUTHENTICATED, "local socket " + path + ": "
                            + (method != AUTH ? "a first frame of method " + method : "a wrong token"));
                    reply(c, (byte) ErrorCode.PERMISSION_DENIED.value(), method != AUTH
                            ? "the first frame on the local socket must be method 3 (auth) with the server's token"
                            : "wrong credential", deadline);
                    return;
                }
                try {
                    caller = Caller.of(hello.client, hello.joinSecret);
                } catch (InvalidArgumentException bad) {
                    reply(c, (byte) ErrorCode.INVALID_ARGUMENT.value(), bad.getMessage(), deadline);
                    return;
                }
                if (!calls.tryAcquire(caller.tenant())) {
                    reply(c, (byte) ErrorCode.POOL_EXHAUSTED.value(), calls.refusal("a local-socket connection").getMessage(),
                            deadline);
                    return; // its client uses gRPC, within the same quota
                }
                tenantOf.put(c, caller.tenant());
                authenticated = true;
                reply(c, (byte) 0, new byte[0], deadline);
                continue;
            }
            byte status = 0;
            byte[] answer;
            long start = System.nanoTime();
            String grpcStatus = "OK";
            String error = null;
            try {
                answer = handle(caller, method, payload);
            } catch (PegaflowException e) {
                status = (byte) e.code().value();
                error = String.valueOf(e.getMessage());
                grpcStatus = Errors.toStatus(e).getStatus().getCode().name();
                answer = null;
            } catch (com.google.protobuf.InvalidProtocolBufferException e) {
                status = (byte) ErrorCode.INVALID_ARGUMENT.value();
                error = "malformed request: " + e.getMessage();
                answer = null;
            } catch (RuntimeException e) {
                status = (byte) ErrorCode.INTERNAL.value();
                error = e.getClass().getName() + ": " + e.getMessage();
                answer = null;
            }
            deadline = System.nanoTime() + frameTimeoutNanos;
            if (error != null) {
                reply(c, status, error, deadline);
            } else {
                reply(c, status, answer, deadline);
            }
            if (metrics != null) {
                metrics.record(methodName(method),
                        status == 0 ? "OK" : grpcStatus.equals("OK") ? "INTERNAL" : grpcStatus, System.nanoTime() - start);
            }
        }
    }

    private static String methodName(byte method) {
        return switch (method) {
            case QUERY -> "Query";
            case RELEASE -> "Release";
            case Wire.RESERVE_SAVE -> "ReserveSave";
            case Wire.BEGIN_LOAD -> "BeginLoad";
            case Wire.LOAD_REST -> "LoadRest";
            case Wire.END_COPY -> "EndCopy";
            default -> "Unknown";
        };
    }

    private byte[] handle(Caller caller, byte method, byte[] payload) throws com.google.protobuf.InvalidProtocolBufferException {
        return switch (method) {
            case QUERY -> EngineService.query(store, tenants, caller, QueryRequest.parseFrom(payload)).toByteArray();
            case RELEASE -> {
                EngineService.release(store, tenants, caller, ReleaseRequest.parseFrom(payload));
                yield new byte[0];
            }
            case AUTH -> new byte[0]; // already authenticated: nothing more to check
            case Wire.RESERVE_SAVE -> EngineService.reserveSave(store, tenants, caller, ReserveSaveRequest.parseFrom(payload))
                    .toByteArray();
            case Wire.BEGIN_LOAD -> EngineService.beginLoad(store, tenants, caller, BeginLoadRequest.parseFrom(payload))
                    .toByteArray();
            case Wire.END_COPY -> EngineService.endCopy(store, tenants, caller, EndCopyRequest.parseFrom(payload)).toByteArray();
            case Wire.LOAD_REST -> EngineService.loadRest(store, tenants, caller,
                    io.pegaflow.client.proto.LoadRestRequest.parseFrom(payload)).toByteArray();
            default -> throw new InvalidArgumentException("local socket method " + method
                    + "; expected 1 (query), 2 (release), 3 (auth), 4 (reserve save), 5 (begin load), 6 (end copy) or 7 (load rest)");
        };
    }

    /**
     * The first frame's payload: the server's token, optionally followed by a NUL and the
     * client id, and another NUL and the join secret in hex (a client without them acts for
     * no instance that is bound to its registrants).
     */
    private record Hello(byte[] token, String client, String joinSecret) {
        static Hello parse(byte[] payload) {
            int a = indexOf(payload, 0);
            if (a < 0) {
                return new Hello(payload, "", null);
            }
            int b = indexOf(payload, a + 1);
            int end = b < 0 ? payload.length : b;
            return new Hello(java.util.Arrays.copyOf(payload, a),
                    new String(payload, a + 1, end - a - 1, StandardCharsets.US_ASCII),
                    b < 0 ? null : new String(payload, b + 1, payload.length - b - 1, StandardCharsets.US_ASCII));
        }

        private static int indexOf(byte[] bytes, int from) {
            for (int i = from; i < bytes.length; i++) {
                if (bytes[i] == 0) {
                    return i;
                }
            }
            return -1;
        }
    }

    /** An error answer: the message {@link Errors#bounded}, as over gRPC. */
    private static void reply(Conn c, byte status, String message, long deadline) throws IOException {
        reply(c, status, Errors.bounded(message).getBytes(StandardCharsets.UTF_8), deadline);
    }

    private static void reply(Conn c, byte status, byte[] body, long deadline) throws IOException {
        ByteBuffer out = ByteBuffer.allocate(5 + body.length);
        out.putInt(1 + body.length).put(status).put(body).flip();
        while (out.hasRemaining()) {
            if (c.channel.write(out) == 0) {
                await(c, SelectionKey.OP_WRITE, deadline);
            }
        }
    }

    /**
     * Waits for the first byte of a frame and reads what is there into {@code header}; false at
     * end of stream. Without a limit ({@code deadline} 0: an idle authenticated connection
     * between frames), else until {@code deadline} (nanoTime; the first frame's).
     */
    private boolean awaitFirstByte(Conn c, ByteBuffer header, long deadline) throws IOException {
        // --busy-poll-us: the next frame of a worker's operation (its copy's end, the next
        // plan) usually comes within milliseconds, and a thread that slept meanwhile answers it
        // several times slower than one still awake (docs/gpu.md, "Where the rest of a
        // server-mode operation goes")
        long spin = busyPollNanos;
        long until = spin > 0 ? System.nanoTime() + spin : 0;
        while (true) {
            int n = c.channel.read(header);
            if (n < 0) {
                return false;
            }
            if (n > 0) {
                return true;
            }
            if (until != 0 && System.nanoTime() < until && open) {
                Thread.onSpinWait();
                continue;
            }
            if (deadline != 0) {
                long left = (deadline - System.nanoTime() + 999_999) / 1_000_000;
                if (left <= 0) {
                    throw new FrameTimeout("no first frame (the token) within " + authTimeoutNanos / 1_000_000
                            + " ms of connecting");
                }
                interest(c, SelectionKey.OP_READ);
                c.selector.select(left);
            } else {
                interest(c, SelectionKey.OP_READ);
                c.selector.select();
            }
            c.selector.selectedKeys().clear();
            if (!open) {
                throw new IOException("closing");
            }
        }
    }

    /**
     * A payload of {@code n} bytes (n was checked against {@link #MAX_FRAME}), read into a
     * buffer of at most {@link #CHUNK} that doubles only once full: a client that announces
     * a large frame and sends little makes the server hold little.
     */
    private static byte[] payload(Conn c, int n, long deadline) throws IOException {
        ByteBuffer buf = ByteBuffer.allocate(Math.min(n, CHUNK));
        while (true) {
            fill(c, buf, deadline);
            if (buf.capacity() == n) {
                return buf.array();
            }
            ByteBuffer bigger = ByteBuffer.allocate((int) Math.min(n, 2L * buf.capacity()));
            bigger.put(buf.flip());
            buf = bigger;
        }
    }

    /** Fills the rest of {@code buf} by {@code deadline} (nanoTime). */
    private static void fill(Conn c, ByteBuffer buf, long deadline) throws IOException {
        while (buf.hasRemaining()) {
            int n = c.channel.read(buf);
            if (n < 0) {
                throw new IOException("connection closed mid-frame");
            }
            if (n == 0) {
                await(c, SelectionKey.OP_READ, deadline);
            }
        }
    }

    private static void await(Conn c, int op, long deadline) throws IOException {
        long left = (deadline - System.nanoTime() + 999_999) / 1_000_000;
        if (left <= 0) {
            throw new FrameTimeout("a frame not complete in time (LocalSocketServer.FRAME_TIMEOUT, or AUTH_TIMEOUT for the first)");
        }
        interest(c, op);
        c.selector.select(left);
        c.selector.selectedKeys().clear();
    }

    /**
     * Sets the connection's key to wait for {@code op}; a key that {@link #close} (or the
     * client going away) cancelled meanwhile is the end of the connection, as an IOException, not
     * an unchecked exception escaping the connection's thread.
     */
    static void interest(Conn c, int op) throws IOException {
        SelectionKey key = c.channel.keyFor(c.selector);
        try {
            if (key != null) {
                key.interestOps(op);
                return;
            }
        } catch (java.nio.channels.CancelledKeyException e) {
            // cancelled between keyFor and interestOps: as below
        }
        throw new IOException("connection closed while waiting for it");
    }

    private static void closeQuietly(SocketChannel c) {
        try {
            c.close();
        } catch (IOException ignored) {
            // closing anyway
        }
    }

    @Override
    public void close() {
        open = false;
        try {
            server.close();
        } catch (IOException ignored) {
            // closing anyway
        }
        for (Conn c : connections) {
            closeQuietly(c.channel);
            c.selector.wakeup();
        }
        threads.shutdownNow();
        try {
            Files.deleteIfExists(path);
        } catch (IOException ignored) {
            // a stale socket file is reclaimed at the next start
        }
    }
}
