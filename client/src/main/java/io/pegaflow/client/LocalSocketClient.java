package io.pegaflow.client;

import com.google.protobuf.MessageLite;
import io.pegaflow.engine.PegaflowException;
import io.pegaflow.engine.ServerUnavailableException;
import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The client half of {@code LocalSocketServer}: connections taken from an idle set by the
 * calling thread for one exchange, written and read on that thread (no handoff), bounded by
 * the client's deadline, and put back; so threads that call once in a while (a copy lane
 * ending its batch) reuse a connection instead of each opening its own, and
 * {@link #warm} can open one before the first real call. The socket is found
 * through Health the first time it is needed. Returns null whenever the fast path cannot
 * answer (no socket, not on this host, the connection broke or was refused, a request of
 * {@link Wire#MAX_FRAME} or more), so the caller uses gRPC, which
 * reports an unreachable server in the usual way.
 */
final class LocalSocketClient implements AutoCloseable {
    private record Conn(SocketChannel channel, Selector selector) {}

    private final RemoteStore store;
    private final java.util.concurrent.ConcurrentLinkedDeque<Conn> idle = new java.util.concurrent.ConcurrentLinkedDeque<>();
    private final Set<Conn> all = ConcurrentHashMap.newKeySet();
    private volatile Path path;
    private volatile long nextDiscovery; // nanoTime; 0: now
    private volatile boolean closed;
    private final java.util.concurrent.atomic.AtomicLong answered = new java.util.concurrent.atomic.AtomicLong();

    /**
     * Microseconds a caller spins for an answer before it sleeps, whatever the server: 0 (the
     * default: only with a busy-polling server, as long as it says, up to 1 ms) to 1000. A
     * spinning caller sees the answer as it arrives instead of being woken for it.
     */
    static final String SPIN_ENV = "PEGAFLOW_LOCAL_SPIN_US";
    /** The most a caller spins for an answer, µs. */
    static final long MAX_SPIN_US = 1000;

    /** This client's own spin ({@link #SPIN_ENV}), in nanoseconds. */
    private final long ownSpinNanos;

    LocalSocketClient(RemoteStore store) {
        this.store = store;
        this.ownSpinNanos = spinFromEnvironment(System.getenv(SPIN_ENV)) * 1000;
        this.spinNanos = ownSpinNanos;
    }

    /** {@link #SPIN_ENV} as microseconds, 0 when unset; refuses anything but 0 to 1000, naming the value. */
    static long spinFromEnvironment(String value) {
        return io.pegaflow.engine.transfer.LayerSplit.parse(value, SPIN_ENV, 0, MAX_SPIN_US, 0,
                "microseconds a caller spins for a local-socket answer, 0 to " + MAX_SPIN_US);
    }

    /** How long a caller spins for an answer, ns: the longer of its own and a busy-polling server's (capped). */
    static long spinNanos(long ownNanos, long serverBusyPollUs) {
        return Math.max(ownNanos, Math.min(serverBusyPollUs, MAX_SPIN_US) * 1000);
    }

    /** How long a caller spins for an answer now, µs. */
    long spinMicros() {
        return spinNanos / 1000;
    }

    /** The answer's payload, or null when the caller should use gRPC instead. */
    byte[] call(byte method, MessageLite request) {
        if (closed) {
            return null;
        }
        Conn c = connection();
        if (c == null) {
            return null;
        }
        if (request.getSerializedSize() >= Wire.MAX_FRAME) {
            return null; // the server would refuse the frame: gRPC takes it
        }
        long deadline = System.nanoTime() + store.deadlineMs() * 1_000_000L;
        try {
            byte[] answer = exchange(c, method, request.toByteArray(), deadline);
            idle.push(c);
            return answer;
        } catch (PegaflowException e) {
            idle.push(c); // a typed refusal: the connection is fine
            throw e;
        } catch (DeadlineExceeded e) {
            drop(c);
            throw new ServerUnavailableException("pegaflow-server at " + store.endpoint() + " did not answer within "
                    + store.deadlineMs() + " ms (local socket " + path + ")", null);
        } catch (IOException e) {
            drop(c);
            return null; // broken or closed: gRPC says whether the server is there
        }
    }

    /** One frame out, one answer back; a refusal is its typed exception. */
    private byte[] exchange(Conn c, byte method, byte[] body, long deadline) throws IOException {
        ByteBuffer out = ByteBuffer.allocate(5 + body.length);
        out.putInt(1 + body.length).put(method).put(body).flip();
        while (out.hasRemaining()) {
            if (c.channel.write(out) == 0) {
                await(c, SelectionKey.OP_WRITE, deadline);
            }
        }
        ByteBuffer header = ByteBuffer.allocate(5);
        read(c, header, deadline);
        int length = header.getInt(0);
        if (length < 1 || length > Wire.MAX_FRAME) {
            throw new IOException("answer frame of " + length + " bytes");
        }
        ByteBuffer payload = ByteBuffer.allocate(length - 1);
        read(c, payload, deadline);
        byte status = header.get(4);
        if (method != Wire.AUTH) {
            answered.incrementAndGet();
        }
        if (status != 0) {
            throw Errors.byCode(status, new String(payload.array(), StandardCharsets.UTF_8));
        }
        return payload.array();
    }

    private static final class DeadlineExceeded extends IOException {}

    /** How long to spin for an answer before sleeping ({@link #spinNanos(long, long)}). */
    private volatile long spinNanos;

    private void read(Conn c, ByteBuffer buf, long deadline) throws IOException {
        long until = spinNanos > 0 ? System.nanoTime() + spinNanos : 0;
        while (buf.hasRemaining()) {
            int n = c.channel.read(buf);
            if (n < 0) {
                throw new IOException("the server closed the local socket");
            }
            if (n == 0) {
                if (until != 0 && System.nanoTime() < until) {
                    Thread.onSpinWait();
                    continue;
                }
                await(c, SelectionKey.OP_READ, deadline);
            }
        }
    }

    private static void await(Conn c, int op, long deadline) throws IOException {
        long left = (deadline - System.nanoTime()) / 1_000_000L;
        if (left <= 0) {
            throw new DeadlineExceeded();
        }
        SelectionKey key = c.channel.keyFor(c.selector);
        key.interestOps(op);
        c.selector.select(left);
        c.selector.selectedKeys().clear();
    }

    /** Opens one connection ahead of the first call (a worker attaching); false if there is no local socket. */
    boolean warm() {
        Conn c = connection();
        if (c == null) {
            return false;
        }
        idle.push(c);
        return true;
    }

    private Conn connection() {
        Conn c;
        while ((c = idle.poll()) != null) {
            if (c.channel.isOpen()) {
                return c;
            }
            all.remove(c);
        }
        Path p = discover();
        if (p == null) {
            return null;
        }
        c = null;
        try {
            SocketChannel ch = SocketChannel.open(StandardProtocolFamily.UNIX);
            try {
                ch.connect(UnixDomainSocketAddress.of(p));
                ch.configureBlocking(false);
                Selector sel = Selector.open();
                ch.register(sel, SelectionKey.OP_READ);
                c = new Conn(ch, sel);
                // the connection's first frame: the server's token and this client's identity
                // (a refusal falls back to gRPC)
                exchange(c, Wire.AUTH, store.hello(),
                        System.nanoTime() + store.deadlineMs() * 1_000_000L);
            } catch (IOException | RuntimeException e) {
                if (c != null) {
                    c.selector.close();
                }
                ch.close();
                throw e;
            }
        } catch (IOException | RuntimeException e) {
            path = null;
            nextDiscovery = System.nanoTime() + 1_000_000_000L; // look again in a second
            return null;
        }
        all.add(c);
        return c;
    }

    private Path discover() {
        Path p = path;
        if (p != null) {
            return p;
        }
        if (System.nanoTime() < nextDiscovery) {
            return null;
        }
        nextDiscovery = System.nanoTime() + 1_000_000_000L;
        try {
            var health = store.health();
            String s = health.getLocalSocket();
            if (!s.isEmpty() && Files.exists(Path.of(s))) {
                spinNanos = spinNanos(ownSpinNanos, health.getBusyPollUs());
                path = Path.of(s);
            }
        } catch (RuntimeException e) {
            // no answer: gRPC will say so
        }
        return path;
    }

    private void drop(Conn c) {
        all.remove(c);
        try {
            c.channel.close();
            c.selector.close();
        } catch (IOException ignored) {
            // gone anyway
        }
    }

    /** Calls the local socket answered (tests, diagnostics). */
    long answered() {
        return answered.get();
    }

    @Override
    public void close() {
        closed = true;
        for (Conn c : all) {
            try {
                c.channel.close();
                c.selector.close();
            } catch (IOException ignored) {
                // gone anyway
            }
        }
        all.clear();
        idle.clear();
    }
}
