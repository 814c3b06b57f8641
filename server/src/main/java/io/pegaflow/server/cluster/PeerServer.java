package io.pegaflow.server.cluster;

import io.pegaflow.engine.store.BlockChecksum;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.store.LocalStore;
import io.pegaflow.engine.Token;
import io.pegaflow.engine.store.TransferPin;
import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import javax.net.ssl.SSLServerSocket;
import javax.net.ssl.SSLSocket;

/**
 * The serving side of the peer channel ({@link PeerWire}): other hosts pin blocks of this
 * host's pool and read them. Every connection proves the cluster secret first; pins belong to
 * the connection that made them (another connection cannot read or release them), end when it
 * closes, and expire at their deadline whatever the reader does. Connections are capped.
 */
public final class PeerServer implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(PeerServer.class.getName());
    static final int MAX_CONNECTIONS = 256;
    static final int MAX_PINS_PER_CONNECTION = 64;
    static final int HELLO_TIMEOUT_SECONDS = 10;
    private static final java.util.concurrent.ScheduledExecutorService HELLO_WATCHDOG =
            java.util.concurrent.Executors.newSingleThreadScheduledExecutor(r -> {
                Thread t = new Thread(r, "pegaflow-peer-hello-watchdog");
                t.setDaemon(true);
                return t;
            });

    private final LocalStore store;
    private final MemorySegment pool;
    private final java.nio.channels.FileChannel poolFile;
    private final byte[] secret;
    private final ServerSocketChannel plain;
    private final SSLServerSocket tls;
    private final Thread acceptor;
    private final Set<PeerLink> links = ConcurrentHashMap.newKeySet();
    private final Checksummer checksummer = new Checksummer("pegaflow-peer-crc-", 2);
    private volatile boolean closed;
    final AtomicLong blocksServed = new AtomicLong();
    final AtomicLong refused = new AtomicLong();

    public PeerServer(InetSocketAddress bind, LocalStore store, MemorySegment pool, byte[] secret, PeerTls tlsConfig)
            throws IOException {
        this(bind, store, pool, null, secret, tlsConfig);
    }

    /**
     * {@code poolFile}: the file {@code pool} maps from offset 0 (null: none), read to send
     * payloads without copying them through this process.
     */
    public PeerServer(InetSocketAddress bind, LocalStore store, MemorySegment pool, java.nio.file.Path poolFile, byte[] secret,
            PeerTls tlsConfig) throws IOException {
        this.store = store;
        this.pool = pool;
        this.poolFile = poolFile == null || tlsConfig != null ? null : openQuietly(poolFile);
        this.secret = secret.clone();
        if (tlsConfig == null) {
            this.plain = ServerSocketChannel.open();
            plain.bind(bind, 128);
            this.tls = null;
        } else {
            this.plain = null;
            SSLServerSocket s = (SSLServerSocket) tlsConfig.context().getServerSocketFactory().createServerSocket();
            s.bind(bind, 128);
            s.setNeedClientAuth(true);
            this.tls = s;
        }
        this.acceptor = Thread.ofPlatform().daemon().name("pegaflow-peer-accept").start(this::acceptLoop);
    }

    private static java.nio.channels.FileChannel openQuietly(java.nio.file.Path file) {
        try {
            return java.nio.channels.FileChannel.open(file, java.nio.file.StandardOpenOption.READ);
        } catch (IOException | UnsupportedOperationException e) {
            LOG.log(System.Logger.Level.INFO, "peer channel: pool file " + file + " not readable (" + e.getMessage()
                    + "); blocks are sent through this process");
            return null;
        }
    }

    public InetSocketAddress address() {
        try {
            return (InetSocketAddress) (plain != null ? plain.getLocalAddress() : tls.getLocalSocketAddress());
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
    }

    private void acceptLoop() {
        while (!closed) {
            try {
                if (plain != null) {
                    SocketChannel ch = plain.accept();
                    admit(() -> PeerLink.plain(ch), ch::close);
                } else {
                    Socket s = tls.accept();
                    admit(() -> {
                        s.setSoTimeout(30_000);
                        return PeerLink.tls((SSLSocket) s);
                    }, s::close);
                }
            } catch (IOException e) {
                if (!closed) {
                    LOG.log(System.Logger.Level.WARNING, "peer channel: accept failed: " + e);
                }
            }
        }
    }

    private interface Open {
        PeerLink open() throws IOException;
    }

    private interface Close {
        void close() throws IOException;
    }

    private void admit(Open open, Close onRefuse) throws IOException {
        if (links.size() >= MAX_CONNECTIONS) {
            refused.incrementAndGet();
            onRefuse.close();
            return;
        }
        // A platform thread per connection (capped): a bulk read blocks on the socket for most of
        // its time, and parking a virtual thread at every full send buffer cost more than it saved.
        Thread.ofPlatform().daemon().name("pegaflow-peer-conn").start(() -> {
            PeerLink link;
            try {
                link = open.open(); // the TLS handshake: a wrong certificate ends here
            } catch (IOException e) {
                refused.incrementAndGet();
                LOG.log(System.Logger.Level.INFO, "peer channel: connection refused (" + e.getMessage() + ")");
                try {
                    onRefuse.close();
                } catch (IOException ignored) {
                    // closing
                }
                return;
            }
            links.add(link);
            try {
                serve(link);
            } finally {
                links.remove(link);
                link.close();
            }
        });
    }

    private void serve(PeerLink link) {
        Map<Token, TransferPin> pins = new HashMap<>();
        // A connection that does not prove the secret in time is closed: idle strangers cannot
        // hold the connection slots.
        java.util.concurrent.ScheduledFuture<?> helloDeadline = HELLO_WATCHDOG.schedule(link::close, HELLO_TIMEOUT_SECONDS,
                java.util.concurrent.TimeUnit.SECONDS);
        try {
            boolean proved;
            try {
                proved = hello(link);
            } catch (IOException e) {
                proved = false; // broke off mid-hello (a host that found this one's proof wrong hangs up): not proved
            } finally {
                helloDeadline.cancel(false);
            }
            if (!proved) {
                refused.incrementAndGet();
                return;
            }
            ByteBuffer op = ByteBuffer.allocate(1);
            while (!closed) {
                op.clear();
                link.readFully(op);
                switch (op.get(0)) {
                    case PeerWire.PIN -> pin(link, pins);
                    case PeerWire.READ -> read(link, pins);
                    case PeerWire.RELEASE -> {
                        Token id = readId(link);
                        TransferPin p = pins.remove(id);
                        status(link, p != null && store.releaseTransfer(id) ? PeerWire.OK : PeerWire.UNKNOWN_PIN);
                    }
                    default -> {
                        status(link, PeerWire.BAD_REQUEST);
                        return; // an unknown frame: the stream cannot be trusted any further
                    }
                }
            }
        } catch (IOException | RuntimeException e) {
            if (!closed && !(e instanceof java.io.EOFException)) {
                LOG.log(System.Logger.Level.DEBUG, "peer channel " + link.remote() + ": " + e);
            }
        } finally {
            for (Token id : pins.keySet()) {
                store.releaseTransfer(id); // the reader left: its pins end now, not at their deadline
            }
        }
    }

    /** The challenge-response of {@link PeerWire}: true when the client proved the secret. */
    private boolean hello(PeerLink link) throws IOException {
        ByteBuffer head = ByteBuffer.allocate(PeerWire.MAGIC.length + PeerWire.NONCE_BYTES);
        link.readFully(head);
        byte[] magic = new byte[PeerWire.MAGIC.length];
        byte[] clientNonce = new byte[PeerWire.NONCE_BYTES];
        head.flip().get(magic).get(clientNonce);
        if (!MessageDigest.isEqual(magic, PeerWire.MAGIC)) {
            status(link, PeerWire.REFUSED);
            return false;
        }
        byte[] serverNonce = PeerWire.nonce();
        ByteBuffer challenge = ByteBuffer.allocate(1 + PeerWire.NONCE_BYTES + PeerWire.PROOF_BYTES);
        challenge.put(PeerWire.OK).put(serverNonce).put(PeerWire.proof(secret, "server", clientNonce, serverNonce));
        link.write(challenge.flip());
        link.flush();
        ByteBuffer given = ByteBuffer.allocate(PeerWire.PROOF_BYTES);
        link.readFully(given);
        boolean ok = MessageDigest.isEqual(given.array(), PeerWire.proof(secret, "client", clientNonce, serverNonce));
        status(link, ok ? PeerWire.OK : PeerWire.REFUSED);
        return ok;
    }

    private void pin(PeerLink link, Map<Token, TransferPin> pins) throws IOException {
        ByteBuffer h = ByteBuffer.allocate(2);
        link.readFully(h);
        int nsLen = Short.toUnsignedInt(h.getShort(0));
        PeerWire.check(nsLen >= 1 && nsLen <= io.pegaflow.engine.Limits.MAX_NAME_BYTES, "namespace of " + nsLen + " bytes; expected 1..256");
        ByteBuffer b = ByteBuffer.allocate(nsLen + 1 + 4);
        link.readFully(b);
        String ns = new String(b.array(), 0, nsLen, StandardCharsets.UTF_8);
        int hashLen = Byte.toUnsignedInt(b.get(nsLen));
        int count = b.getInt(nsLen + 1);
        PeerWire.check(hashLen >= 1 && hashLen <= io.pegaflow.engine.Limits.MAX_HASH_BYTES, "hash length " + hashLen + "; expected 1..64");
        PeerWire.check(count >= 1 && count <= PeerWire.MAX_PIN_HASHES, count + " hashes; expected 1.." + PeerWire.MAX_PIN_HASHES);
        ByteBuffer packed = ByteBuffer.allocate(count * hashLen + 4); // sized from checked fields only
        link.readFully(packed);
        int deadline = packed.getInt(count * hashLen);
        PeerWire.check(deadline >= 1 && deadline <= PeerWire.MAX_DEADLINE_MS, "deadline " + deadline + " ms; expected 1.." + PeerWire.MAX_DEADLINE_MS);
        if (pins.size() >= MAX_PINS_PER_CONNECTION) {
            status(link, PeerWire.BAD_REQUEST);
            return;
        }
        TransferPin p = store.pinForTransfer(ns, new BlockHashes(java.util.Arrays.copyOf(packed.array(), count * hashLen), hashLen),
                Duration.ofMillis(deadline));
        if (p == null) {
            status(link, PeerWire.NONE);
            return;
        }
        pins.put(p.id(), p);
        ByteBuffer out = ByteBuffer.allocate(1 + PeerWire.ID_BYTES + 8 + 8 * p.slotBytes().length);
        out.put(PeerWire.OK).put(p.id().toBytes()).putInt(p.blocks()).putInt(p.slotBytes().length);
        for (long s : p.slotBytes()) {
            out.putLong(s);
        }
        link.write(out.flip());
        link.flush();
    }

    private void read(PeerLink link, Map<Token, TransferPin> pins) throws IOException {
        Token id = readId(link);
        ByteBuffer c = ByteBuffer.allocate(4);
        link.readFully(c);
        int count = c.getInt(0);
        TransferPin p = pins.get(id);
        PeerWire.check(count >= 0 && count <= PeerWire.MAX_PIN_HASHES, count + " blocks; expected 0.." + PeerWire.MAX_PIN_HASHES);
        ByteBuffer want = ByteBuffer.allocate(count);
        link.readFully(want);
        if (p == null || count > p.blocks()) {
            status(link, PeerWire.UNKNOWN_PIN);
            return;
        }
        status0(link, PeerWire.OK);
        new BatchWriter(p).send(link, want, count);
        link.flush();
    }

    /**
     * Sends pinned blocks BATCH at a time: the batch's header with every block's checksum, then
     * the payloads. Over plaintext with the pool's file at hand the payloads go from the file to
     * the socket in the kernel ({@code sendfile}: no copy through this process, contiguous slots
     * and blocks in one call); otherwise header and slots go in one gathering write. The next
     * batch's checksums are summed on a helper thread while this one is sent. A batch is one
     * method call so the JIT compiles it after a few fetches, not only once a long fetch loop
     * has been replaced on the stack.
     */
    private final class BatchWriter {
        private final TransferPin pin;
        private final long blockBytes;
        private final int slots;
        private final ByteBuffer head;
        private final ByteBuffer[] frames;

        BatchWriter(TransferPin pin) {
            this.pin = pin;
            this.blockBytes = pin.blockBytes();
            this.slots = pin.slotBytes().length;
            this.frames = new ByteBuffer[1 + PeerWire.BATCH * slots];
            // direct: a heap buffer is first copied into a temporary direct one by every write
            this.head = ByteBuffer.allocateDirect(PeerWire.BATCH_HEAD_BYTES + PeerWire.BATCH * PeerWire.ENTRY_BYTES);
        }

        void send(PeerLink link, ByteBuffer want, int count) throws IOException {
            int[] sent = new int[count];
            int n = 0;
            for (int i = 0; i < count; i++) {
                if (want.get(i) != 0) {
                    sent[n++] = i;
                }
            }
            java.util.concurrent.Future<int[]> next = n == 0 ? null : sumsOf(sent, 0, Math.min(n, PeerWire.BATCH));
            for (int from = 0; from < n; from += PeerWire.BATCH) {
                int to = Math.min(n, from + PeerWire.BATCH);
                int[] sums = Checksummer.await(next);
                if (to < n) {
                    next = sumsOf(sent, to, Math.min(n, to + PeerWire.BATCH));
                }
                sendBatch(link, sent, from, to, sums);
            }
        }

        /**
         * The checksums of blocks {@code sent[from..to)}: at once when the store kept every one
         * (summed ahead, the usual case), else on a helper thread while the current batch is sent.
         */
        private java.util.concurrent.Future<int[]> sumsOf(int[] sent, int from, int to) {
            for (int k = from; k < to; k++) {
                if (pin.checksums()[sent[k]] < 0) {
                    return checksummer.submit(() -> sums(sent, from, to));
                }
            }
            return java.util.concurrent.CompletableFuture.completedFuture(sums(sent, from, to));
        }

        /**
         * Checksums of blocks {@code sent[from..to)}: the one kept with the block where the store
         * summed it ahead, else summed now.
         */
        private int[] sums(int[] sent, int from, int to) {
            int[] out = new int[to - from];
            for (int k = from; k < to; k++) {
                long kept = pin.checksums()[sent[k]];
                out[k - from] = kept >= 0 ? (int) kept
                        : BlockChecksum.of(pool, pin.slotOffsets().get(sent[k]), pin.slotBytes());
            }
            return out;
        }

        private void sendBatch(PeerLink link, int[] sent, int from, int to, int[] sums) throws IOException {
            if (!store.transferLive(pin.id())) {
                // expired mid-read: its blocks may be evicted by now; the reader's read fails (misses)
                throw new IOException("pin expired while its blocks were being sent");
            }
            int m = to - from;
            head.clear().put(PeerWire.BATCH_MARK).putShort((short) m).putLong(blockBytes);
            for (int k = 0; k < m; k++) {
                head.putInt(sent[from + k]).putInt(sums[k]);
            }
            head.flip();
            java.nio.channels.SocketChannel ch = poolFile == null ? null : link.channel();
            if (ch != null) {
                link.write(head);
                long runAt = -1;
                long runBytes = 0;
                for (int k = 0; k < m; k++) {
                    long[] offsets = pin.slotOffsets().get(sent[from + k]);
                    for (int s = 0; s < slots; s++) {
                        if (runAt >= 0 && runAt + runBytes == offsets[s]) {
                            runBytes += pin.slotBytes()[s]; // adjacent in the pool: one call
                            continue;
                        }
                        transfer(ch, runAt, runBytes);
                        runAt = offsets[s];
                        runBytes = pin.slotBytes()[s];
                    }
                }
                transfer(ch, runAt, runBytes);
            } else {
                int f = 0;
                frames[f++] = head;
                for (int k = 0; k < m; k++) {
                    long[] offsets = pin.slotOffsets().get(sent[from + k]);
                    for (int s = 0; s < slots; s++) {
                        frames[f++] = pool.asSlice(offsets[s], pin.slotBytes()[s]).asByteBuffer();
                    }
                }
                link.write(f == frames.length ? frames : java.util.Arrays.copyOf(frames, f));
            }
            blocksServed.addAndGet(m);
        }

        private void transfer(java.nio.channels.SocketChannel ch, long at, long bytes) throws IOException {
            long end = at + bytes;
            while (at < end) {
                long n = poolFile.transferTo(at, end - at, ch);
                if (n <= 0 && !ch.isOpen()) {
                    throw new java.nio.channels.ClosedChannelException();
                }
                at += n;
            }
        }
    }

    private static Token readId(PeerLink link) throws IOException {
        ByteBuffer id = ByteBuffer.allocate(PeerWire.ID_BYTES);
        link.readFully(id);
        return Token.fromBytes(id.array());
    }

    private static void status(PeerLink link, byte s) throws IOException {
        status0(link, s);
        link.flush();
    }

    private static void status0(PeerLink link, byte s) throws IOException {
        link.write(ByteBuffer.wrap(new byte[] {s}));
    }

    public long blocksServed() {
        return blocksServed.get();
    }

    public long refusedConnections() {
        return refused.get();
    }

    @Override
    public void close() {
        closed = true;
        checksummer.close();
        if (poolFile != null) {
            try {
                poolFile.close();
            } catch (IOException ignored) {
                // closing
            }
        }
        try {
            if (plain != null) {
                plain.close();
            } else {
                tls.close();
            }
        } catch (IOException ignored) {
            // closing
        }
        for (PeerLink l : links) {
            l.close();
        }
        try {
            acceptor.join(1000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
