package io.pegaflow.server.cluster;

import io.pegaflow.engine.store.BlockChecksum;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.store.FetchReservation;
import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Arrays;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedDeque;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;

/**
 * {@link PeerTransport} over TCP ({@link PeerWire}), optionally mutual TLS. Idle connections
 * are kept per peer and reused; one pin holds its connection from {@code pin} to
 * {@code release}. Every exchange runs under a deadline: a peer that stops answering has its
 * connection closed under it (the read fails, the blocks are misses).
 */
public final class TcpPeerTransport implements PeerTransport {
    private static final int IDLE_PER_PEER = 8;

    private final byte[] secret;
    private final PeerTls tls;
    private final int connectTimeoutMillis;
    private final Map<String, ConcurrentLinkedDeque<PeerLink>> idle = new ConcurrentHashMap<>();
    private final ScheduledExecutorService watchdog;
    private final java.util.concurrent.atomic.AtomicLong checksumFailures = new java.util.concurrent.atomic.AtomicLong();

    public TcpPeerTransport(byte[] secret, PeerTls tls, Duration connectTimeout) {
        this.secret = secret.clone();
        this.tls = tls;
        this.connectTimeoutMillis = (int) Math.max(1, connectTimeout.toMillis());
        ScheduledThreadPoolExecutor w = new ScheduledThreadPoolExecutor(1, r -> {
            Thread t = new Thread(r, "pegaflow-peer-watchdog");
            t.setDaemon(true);
            return t;
        });
        w.setRemoveOnCancelPolicy(true);
        this.watchdog = w;
    }

    private static final class Pin implements RemotePin {
        final String addr;
        final PeerLink link;
        final byte[] id;
        final int blocks;
        final long[] slotBytes;
        final long deadlineNanos;
        boolean broken;

        Pin(String addr, PeerLink link, byte[] id, int blocks, long[] slotBytes, long deadlineNanos) {
            this.addr = addr;
            this.link = link;
            this.id = id;
            this.blocks = blocks;
            this.slotBytes = slotBytes;
            this.deadlineNanos = deadlineNanos;
        }

        @Override
        public int blocks() {
            return blocks;
        }

        @Override
        public long[] slotBytes() {
            return slotBytes;
        }
    }

    @Override
    public RemotePin pin(BlockRegistry.Node peer, String namespace, BlockHashes hashes, Duration deadline) throws IOException {
        String addr = peer.peerAddr();
        PeerLink link = borrow(addr);
        long deadlineNanos = System.nanoTime() + deadline.toNanos();
        ScheduledFuture<?> guard = guard(link, deadlineNanos);
        boolean ok = false;
        try {
            byte[] ns = namespace.getBytes(StandardCharsets.UTF_8);
            ByteBuffer req = ByteBuffer.allocate(1 + 2 + ns.length + 1 + 4 + hashes.packed().length + 4);
            req.put(PeerWire.PIN).putShort((short) ns.length).put(ns).put((byte) hashes.hashLen()).putInt(hashes.count())
                    .put(hashes.packed()).putInt((int) Math.min(PeerWire.MAX_DEADLINE_MS, Math.max(1, deadline.toMillis())));
            link.write(req.flip());
            link.flush();
            byte status = readStatus(link);
            if (status == PeerWire.NONE) {
                ok = true;
                giveBack(addr, link);
                return null;
            }
            if (status != PeerWire.OK) {
                throw new IOException("peer " + addr + " refused the pin (status " + status + ")");
            }
            ByteBuffer head = ByteBuffer.allocate(PeerWire.ID_BYTES + 8);
            link.readFully(head);
            byte[] id = Arrays.copyOf(head.array(), PeerWire.ID_BYTES);
            int blocks = head.getInt(PeerWire.ID_BYTES);
            int slots = head.getInt(PeerWire.ID_BYTES + 4);
            if (blocks < 1 || blocks > hashes.count() || slots < 1 || slots > PeerWire.MAX_SLOTS) {
                throw new IOException("peer " + addr + " pinned " + blocks + " blocks of " + slots + " slots; expected 1.."
                        + hashes.count() + " blocks");
            }
            ByteBuffer sizes = ByteBuffer.allocate(8 * slots);
            link.readFully(sizes);
            long[] slotBytes = new long[slots];
            for (int s = 0; s < slots; s++) {
                slotBytes[s] = sizes.getLong(8 * s);
            }
            ok = true;
            return new Pin(addr, link, id, blocks, slotBytes, deadlineNanos);
        } finally {
            guard.cancel(false);
            if (!ok) {
                link.close();
            }
        }
    }

    @Override
    public void read(RemotePin remote, FetchReservation into, boolean[] ok) throws IOException {
        Pin pin = (Pin) remote;
        PeerLink link = pin.link;
        ScheduledFuture<?> guard = guard(link, pin.deadlineNanos);
        try {
            int n = into.length();
            ByteBuffer req = ByteBuffer.allocate(1 + PeerWire.ID_BYTES + 4 + n);
            req.put(PeerWire.READ).put(pin.id).putInt(n);
            for (int i = 0; i < n; i++) {
                req.put((byte) (into.dst(i) == null ? 0 : 1));
            }
            link.write(req.flip());
            link.flush();
            byte status = readStatus(link);
            if (status != PeerWire.OK) {
                throw new IOException("peer " + pin.addr + " refused the read (status " + status + ")");
            }
            new BatchReader(pin, into, ok).receive(link);
        } catch (IOException | RuntimeException e) {
            pin.broken = true;
            throw e instanceof IOException io ? io : new IOException(e);
        } finally {
            guard.cancel(false);
        }
    }

    /**
     * Receives the blocks of one read BATCH at a time: the batch's header is read and checked at
     * once (a stream out of step trusts nothing after it), then each payload straight into its
     * place in the pool, {@link #CHECK_CHUNK} bytes at a time (smaller blocks: as many as fill that
     * in one scattering read), each piece summed while it is still in this core's cache. A
     * separate pass over each batch afterwards, on a helper thread, read it back from memory:
     * CPU time of its own, which a busy host's cores cannot spare; summing each piece in cache
     * made fetches faster (docs/cluster.md, "Where a fetch's CPU goes" and the changes after
     * it). A batch is one method call so the JIT compiles it after a few fetches.
     */
    private final class BatchReader {
        /** Bytes read, then summed, at a time: within a core's L2, large enough for few system calls. */
        static final int CHECK_CHUNK = 256 << 10;

        private final Pin pin;
        private final FetchReservation into;
        private final boolean[] ok;
        private final long blockBytes;
        private final byte[] mark = new byte[PeerWire.BATCH_MARK.length];
        // direct: a heap buffer is filled through a temporary direct one
        private final ByteBuffer head = ByteBuffer.allocateDirect(PeerWire.BATCH_HEAD_BYTES + PeerWire.BATCH * PeerWire.ENTRY_BYTES);
        private final java.util.zip.Checksum crc = BlockChecksum.running();
        private final ByteBuffer[] frames;

        BatchReader(Pin pin, FetchReservation into, boolean[] ok) {
            this.pin = pin;
            this.into = into;
            this.ok = ok;
            this.blockBytes = pin.blockBytes();
            this.frames = new ByteBuffer[(int) Math.max(1, Math.min(PeerWire.BATCH, CHECK_CHUNK / Math.max(1, blockBytes)))];
        }

        void receive(PeerLink link) throws IOException {
            int n = into.length();
            int[] wanted = new int[n];
            int count = 0;
            for (int i = 0; i < n; i++) {
                MemorySegment dst = into.dst(i);
                if (dst != null) {
                    if (dst.byteSize() != blockBytes) {
                        throw new IOException("reserved " + dst.byteSize() + " bytes for block " + i + " of " + blockBytes
                                + " from " + pin.addr);
                    }
                    wanted[count++] = i;
                }
            }
            for (int from = 0; from < count; from += PeerWire.BATCH) {
                receiveBatch(link, wanted, from, Math.min(count, from + PeerWire.BATCH));
            }
        }

        /** Reads and checks one batch: its header, then each block, summed as it arrives. */
        private void receiveBatch(PeerLink link, int[] wanted, int from, int to) throws IOException {
            int m = to - from;
            link.readFully(head.clear().limit(PeerWire.BATCH_HEAD_BYTES + m * PeerWire.ENTRY_BYTES));
            head.flip().get(mark);
            int got = Short.toUnsignedInt(head.getShort());
            long len = head.getLong();
            if (!Arrays.equals(mark, PeerWire.BATCH_MARK) || got != m || len != blockBytes) {
                throw new IOException("peer " + pin.addr + " sent a batch of " + got + " blocks of " + len + " bytes; expected "
                        + m + " of " + blockBytes); // the stream is out of step: nothing after is trusted
            }
            for (int k = 0; k < m; k++) {
                int entry = PeerWire.BATCH_HEAD_BYTES + k * PeerWire.ENTRY_BYTES;
                if (head.getInt(entry) != wanted[from + k]) {
                    throw new IOException("peer " + pin.addr + " sent block " + head.getInt(entry) + "; expected block "
                            + wanted[from + k]);
                }
            }
            if (blockBytes >= CHECK_CHUNK) {
                for (int k = 0; k < m; k++) {
                    ByteBuffer dst = into.dst(wanted[from + k]).asByteBuffer();
                    crc.reset();
                    for (int at = 0; at < dst.capacity(); at += CHECK_CHUNK) {
                        int end = (int) Math.min(dst.capacity(), (long) at + CHECK_CHUNK);
                        link.readFully(dst.limit(end).position(at));
                        crc.update(dst.position(at)); // the piece just read, from cache
                    }
                    checked(wanted[from + k], k);
                }
                return;
            }
            // small blocks: as many as fill a piece in one scattering read, then each summed from cache
            int group = frames.length;
            for (int k = 0; k < m; k += group) {
                int g = Math.min(group, m - k);
                for (int j = 0; j < g; j++) {
                    frames[j] = into.dst(wanted[from + k + j]).asByteBuffer();
                }
                link.readFully(g == frames.length ? frames : Arrays.copyOf(frames, g));
                for (int j = 0; j < g; j++) {
                    crc.reset();
                    crc.update(frames[j].flip());
                    checked(wanted[from + k + j], k + j);
                }
            }
        }

        /** Block {@code b}, entry {@code k} of the batch header: its sum so far against the header's. */
        private void checked(int b, int k) {
            int sum = (int) crc.getValue();
            ok[b] = sum == head.getInt(PeerWire.BATCH_HEAD_BYTES + k * PeerWire.ENTRY_BYTES + 4);
            if (ok[b]) {
                into.verified(b, sum);
            } else {
                checksumFailures.incrementAndGet(); // a mismatch: that block is a miss, never served
            }
        }
    }

    @Override
    public void release(RemotePin remote) {
        Pin pin = (Pin) remote;
        if (pin.broken) {
            pin.link.close(); // the peer ends the pin when the connection goes
            return;
        }
        ScheduledFuture<?> guard = guard(pin.link, System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(connectTimeoutMillis));
        try {
            ByteBuffer req = ByteBuffer.allocate(1 + PeerWire.ID_BYTES);
            req.put(PeerWire.RELEASE).put(pin.id);
            pin.link.write(req.flip());
            pin.link.flush();
            readStatus(pin.link);
            giveBack(pin.addr, pin.link);
        } catch (IOException | RuntimeException e) {
            pin.link.close();
        } finally {
            guard.cancel(false);
        }
    }

    private ScheduledFuture<?> guard(PeerLink link, long deadlineNanos) {
        return watchdog.schedule(link::close, Math.max(1, deadlineNanos - System.nanoTime()), TimeUnit.NANOSECONDS);
    }

    private static byte readStatus(PeerLink link) throws IOException {
        ByteBuffer s = ByteBuffer.allocate(1);
        link.readFully(s);
        return s.get(0);
    }

    private PeerLink borrow(String addr) throws IOException {
        ConcurrentLinkedDeque<PeerLink> q = idle.get(addr);
        PeerLink link = q == null ? null : q.pollFirst();
        if (link != null) {
            return link;
        }
        InetSocketAddress where = io.pegaflow.client.Wire.hostPort(addr, "peer address");
        link = PeerLink.connect(where, tls, connectTimeoutMillis);
        ScheduledFuture<?> guard = guard(link, System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(connectTimeoutMillis));
        try {
            // the challenge-response of PeerWire: the secret itself never leaves this host
            byte[] clientNonce = PeerWire.nonce();
            ByteBuffer hello = ByteBuffer.allocate(PeerWire.MAGIC.length + PeerWire.NONCE_BYTES);
            link.write(hello.put(PeerWire.MAGIC).put(clientNonce).flip());
            link.flush();
            if (readStatus(link) != PeerWire.OK) {
                throw new IOException("peer " + addr + " refused this host's hello (another protocol version?)");
            }
            ByteBuffer challenge = ByteBuffer.allocate(PeerWire.NONCE_BYTES + PeerWire.PROOF_BYTES);
            link.readFully(challenge);
            byte[] serverNonce = new byte[PeerWire.NONCE_BYTES];
            byte[] serverProof = new byte[PeerWire.PROOF_BYTES];
            challenge.flip().get(serverNonce).get(serverProof);
            if (!java.security.MessageDigest.isEqual(serverProof, PeerWire.proof(secret, "server", clientNonce, serverNonce))) {
                throw new IOException("peer " + addr + " does not hold this host's cluster secret; nothing was sent to it");
            }
            link.write(ByteBuffer.wrap(PeerWire.proof(secret, "client", clientNonce, serverNonce)));
            link.flush();
            if (readStatus(link) != PeerWire.OK) {
                throw new IOException("peer " + addr + " refused this host's cluster secret");
            }
            return link;
        } catch (IOException | RuntimeException e) {
            link.close();
            throw e instanceof IOException io ? io : new IOException(e);
        } finally {
            guard.cancel(false);
        }
    }

    private void giveBack(String addr, PeerLink link) {
        ConcurrentLinkedDeque<PeerLink> q = idle.computeIfAbsent(addr, a -> new ConcurrentLinkedDeque<>());
        if (q.size() < IDLE_PER_PEER) {
            q.addFirst(link);
        } else {
            link.close();
        }
    }

    /** Drops idle connections to {@code addr} (it failed). */
    void forgetPeer(String addr) {
        ConcurrentLinkedDeque<PeerLink> q = idle.remove(addr);
        if (q != null) {
            q.forEach(PeerLink::close);
        }
    }

    @Override
    public long checksumFailures() {
        return checksumFailures.get();
    }

    @Override
    public void close() {
        idle.values().forEach(q -> q.forEach(PeerLink::close));
        idle.clear();
        watchdog.shutdownNow();
    }
}
