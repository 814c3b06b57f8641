package io.pegaflow.server.cluster;

import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import javax.net.ssl.SSLSocket;

/**
 * One connection between hosts: plaintext over a {@link SocketChannel} (bytes go between the
 * socket and the pools with no copy in this process) or TLS over an {@link SSLSocket} (through
 * a heap buffer: encryption copies anyway). Blocking; one user at a time.
 */
abstract class PeerLink implements AutoCloseable {
    abstract void write(ByteBuffer src) throws IOException;

    /** Writes every buffer in order (one gathering system call where the link allows). */
    void write(ByteBuffer[] srcs) throws IOException {
        for (ByteBuffer b : srcs) {
            write(b);
        }
    }

    /** Fills every buffer in order (one scattering system call where the link allows). */
    void readFully(ByteBuffer[] dsts) throws IOException {
        for (ByteBuffer b : dsts) {
            readFully(b);
        }
    }

    /** Fills {@code dst} to its limit; EOF is an error. */
    abstract void readFully(ByteBuffer dst) throws IOException;

    abstract void flush() throws IOException;

    abstract String remote();

    /** The plaintext socket (null over TLS): an owner sends payloads to it with sendfile. */
    java.nio.channels.SocketChannel channel() {
        return null;
    }

    @Override
    public abstract void close();

    static PeerLink plain(SocketChannel ch) throws IOException {
        // Socket buffers left to the kernel's autotuning: fixing them disables it (measured slower).
        ch.socket().setTcpNoDelay(true);
        return new Plain(ch);
    }

    static PeerLink tls(SSLSocket s) throws IOException {
        s.setTcpNoDelay(true);
        s.startHandshake();
        return new Tls(s);
    }

    static PeerLink connect(InetSocketAddress addr, PeerTls tls, int timeoutMillis) throws IOException {
        if (tls == null) {
            SocketChannel ch = SocketChannel.open();
            try {
                ch.socket().connect(addr, timeoutMillis);
                return plain(ch);
            } catch (IOException e) {
                ch.close();
                throw e;
            }
        }
        Socket raw = new Socket();
        try {
            raw.connect(addr, timeoutMillis);
            raw.setSoTimeout(timeoutMillis);
            SSLSocket s = (SSLSocket) tls.context().getSocketFactory().createSocket(raw, addr.getHostString(), addr.getPort(), true);
            s.setUseClientMode(true);
            return tls(s);
        } catch (IOException e) {
            raw.close();
            throw e;
        }
    }

    private static final class Plain extends PeerLink {
        private final SocketChannel ch;

        Plain(SocketChannel ch) {
            this.ch = ch;
        }

        @Override
        void write(ByteBuffer src) throws IOException {
            while (src.hasRemaining()) {
                ch.write(src);
            }
        }

        @Override
        void readFully(ByteBuffer dst) throws IOException {
            while (dst.hasRemaining()) {
                if (ch.read(dst) < 0) {
                    throw new EOFException("peer " + remote() + " closed the connection");
                }
            }
        }

        @Override
        void write(ByteBuffer[] srcs) throws IOException {
            ByteBuffer last = srcs[srcs.length - 1];
            while (last.hasRemaining()) {
                ch.write(srcs);
            }
        }

        @Override
        void readFully(ByteBuffer[] dsts) throws IOException {
            ByteBuffer last = dsts[dsts.length - 1];
            while (last.hasRemaining()) {
                if (ch.read(dsts) < 0) {
                    throw new EOFException("peer " + remote() + " closed the connection");
                }
            }
        }

        @Override
        void flush() {
        }

        @Override
        SocketChannel channel() {
            return ch;
        }

        @Override
        String remote() {
            try {
                return String.valueOf(ch.getRemoteAddress());
            } catch (IOException e) {
                return "?";
            }
        }

        @Override
        public void close() {
            try {
                ch.close();
            } catch (IOException ignored) {
                // closing
            }
        }
    }

    private static final class Tls extends PeerLink {
        private final SSLSocket s;
        private final InputStream in;
        private final OutputStream out;
        private final byte[] buf = new byte[256 << 10];

        Tls(SSLSocket s) throws IOException {
            this.s = s;
            this.in = s.getInputStream();
            this.out = new java.io.BufferedOutputStream(s.getOutputStream(), 64 << 10);
        }

        @Override
        void write(ByteBuffer src) throws IOException {
            if (src.hasArray()) {
                out.write(src.array(), src.arrayOffset() + src.position(), src.remaining());
                src.position(src.limit());
                return;
            }
            while (src.hasRemaining()) {
                int n = Math.min(buf.length, src.remaining());
                src.get(buf, 0, n);
                out.write(buf, 0, n);
            }
        }

        @Override
        void readFully(ByteBuffer dst) throws IOException {
            while (dst.hasRemaining()) {
                int n = in.read(buf, 0, Math.min(buf.length, dst.remaining()));
                if (n < 0) {
                    throw new EOFException("peer " + remote() + " closed the connection");
                }
                dst.put(buf, 0, n);
            }
        }

        @Override
        void flush() throws IOException {
            out.flush();
        }

        @Override
        String remote() {
            return String.valueOf(s.getRemoteSocketAddress());
        }

        @Override
        public void close() {
            try {
                s.close();
            } catch (IOException ignored) {
                // closing
            }
        }
    }
}
