package io.pegaflow.engine;

import static org.assertj.core.api.Assertions.assertThat;

import io.pegaflow.engine.store.BlockChecksum;
import io.pegaflow.engine.store.LocalStore;
import io.pegaflow.engine.store.TransferPin;
import io.pegaflow.server.cluster.ClusterConfig;
import io.pegaflow.server.cluster.ClusterTier;
import io.pegaflow.server.cluster.RedisBlockRegistry;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * Two embedded engines sharing blocks through a real redis-server (Debian's package, installed
 * by the set-up) and the TCP peer channel on loopback: a prefix saved on A is served to B
 * byte-identical; a corrupted wire, a wrong secret, and a missing peer are misses.
 */
class ClusterSharingTest {
    /** Bytes per K or V of a layer: blocks of 4 segments (8 KiB unless a test sets it first). */
    private long segment = 2048;

    @TempDir
    Path dir;
    private Process redis;
    private int redisPort;
    private final List<AutoCloseable> open = new ArrayList<>();

    @BeforeEach
    void startRedis() throws Exception {
        try (ServerSocket s = new ServerSocket(0)) {
            redisPort = s.getLocalPort();
        }
        redis = new ProcessBuilder("redis-server", "--port", Integer.toString(redisPort), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no").redirectErrorStream(true).redirectOutput(dir.resolve("redis.log").toFile()).start();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (true) {
            try (Socket s = new Socket("127.0.0.1", redisPort)) {
                break;
            } catch (IOException e) {
                assertThat(System.nanoTime()).as("redis-server listening").isLessThan(deadline);
                Thread.sleep(20);
            }
        }
    }

    @AfterEach
    void stop() throws Exception {
        for (int i = open.size() - 1; i >= 0; i--) {
            open.get(i).close();
        }
        redis.destroy();
        redis.waitFor(5, TimeUnit.SECONDS);
    }

    private Path secret(String text) throws IOException {
        Path f = dir.resolve("secret-" + text.hashCode());
        Files.writeString(f, text);
        return f;
    }

    private record Host(PegaEngine engine, KvWorld world, ClusterConfig.Cluster cluster) {}

    private Host host(String id, Path secret) throws Exception {
        return host(id, secret, null);
    }

    private Host host(String id, Path secret, String advertise) throws Exception {
        PegaEngine engine = PegaEngine.create(EngineConfig.builder().poolBytes(64 * 4 * segment).build());
        open.add(engine);
        KvWorld world = new KvWorld(id, "ns", KvWorld.Kind.SPLIT_KFIRST, 1, 1, 2, 64, segment, 0);
        open.add(world);
        world.register(engine);
        var registry = new RedisBlockRegistry.Settings("redis://127.0.0.1:" + redisPort, 16, Duration.ofMillis(100),
                Duration.ofMillis(600), 4096, Duration.ofSeconds(2), null);
        ClusterConfig config = new ClusterConfig(registry, "127.0.0.1:0", advertise, false, secret, null, null, null,
                ClusterTier.Settings.DEFAULTS);
        ClusterConfig.Cluster cluster = config.start(engine.localStore(), engine.poolMemory());
        open.add(cluster);
        waitFor(() -> cluster.tier().registry().connected(), "registry connected");
        return new Host(engine, world, cluster);
    }

    /** Hosts A and B on one secret, once B sees A. */
    private Host[] aAndB() throws Exception {
        Path secret = secret("a-cluster-secret-of-enough-length");
        Host a = host("a", secret);
        Host b = host("b", secret);
        waitFor(() -> b.cluster().tier().registry().liveNodes().size() == 1, "B sees A");
        return new Host[] {a, b};
    }

    private static void waitFor(java.util.function.BooleanSupplier ok, String what) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!ok.getAsBoolean()) {
            assertThat(System.nanoTime()).as(what).isLessThan(deadline);
            Thread.sleep(10);
        }
    }

    private static byte[][] hashes(int n, long seed) {
        Random r = new Random(seed);
        byte[][] h = new byte[n][32];
        for (byte[] x : h) {
            r.nextBytes(x);
        }
        return h;
    }

    private static void save(Host h, byte[][] hashes) {
        long[] ids = new long[hashes.length];
        for (int k = 0; k < ids.length; k++) {
            ids[k] = k;
            h.world().fillPattern(k, hashes[k]);
        }
        assertThat(h.engine().save(h.world().spec.instanceId(), 0, ids, BlockHashes.of(hashes)).join().blocks()).isEqualTo(hashes.length);
    }

    /** Queries until the answer is not "not yet"; returns it and how many "not yet" answers came first. */
    private static QueryResult settle(Host h, byte[][] hashes, int[] notYet) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (true) {
            QueryResult q = h.engine().query(h.world().spec.instanceId(), BlockHashes.of(hashes));
            if (!q.pending()) {
                return q;
            }
            assertThat(q.lease()).isNull();
            notYet[0]++;
            assertThat(System.nanoTime()).as("fetch settled").isLessThan(deadline);
            Thread.sleep(2);
        }
    }

    private static void loadAndCheck(Host h, QueryResult q, byte[][] hashes) {
        long[] dst = new long[q.hitBlocks()];
        for (int k = 0; k < dst.length; k++) {
            dst[k] = 32 + k;
        }
        assertThat(h.engine().load(h.world().spec.instanceId(), 0, q.lease(), dst).join().blocks()).isEqualTo(dst.length);
        for (int k = 0; k < dst.length; k++) {
            assertThat(h.world().holdsPattern(dst[k], hashes[k])).as("block %d byte-identical", k).isTrue();
        }
    }

    /**
     * Block sizes the reader takes differently: 8 KiB (16 to a scattering read), 96 KiB (2 to a
     * read), 300 KiB (read and summed in 256 KiB pieces, the last one shorter).
     */
    @ParameterizedTest(name = "segment {0}")
    @ValueSource(longs = {2048, 24576, 76800})
    void aPrefixSavedOnOneHostIsServedToAnotherByteIdenticalAndAdvertisedFromThere(long segmentBytes) throws Exception {
        segment = segmentBytes;
        Host[] ab = aAndB();
        Host a = ab[0];
        Host b = ab[1];
        byte[][] h = hashes(12, 1);
        save(a, h);
        a.engine().flush(10_000); // the visibility barrier: ended and advertised
        int[] notYet = {0};
        QueryResult q = settle(b, h, notYet);
        assertThat(notYet[0]).as("'not yet' while fetching").isPositive();
        assertThat(q.hitBlocks()).isEqualTo(12);
        loadAndCheck(b, q, h);
        assertThat(b.engine().stats().get(io.pegaflow.engine.metrics.Counter.TIER_PEER_BLOCKS)).isEqualTo(12);
        waitFor(() -> a.engine().localStore().transferPins() == 0, "A released its transfer pin");
        b.engine().flush(10_000); // the visibility barrier: ended and advertised
        // B advertises what it fetched: a third host may now get it from either
        Host c = host("c", secret("a-cluster-secret-of-enough-length"));
        waitFor(() -> c.cluster().tier().registry().liveNodes().size() == 2, "C sees A and B");
        QueryResult qc = settle(c, h, new int[1]);
        assertThat(qc.hitBlocks()).isEqualTo(12);
        loadAndCheck(c, qc, h);
        a.engine().verifyInvariants();
        b.engine().verifyInvariants();
    }

    /** Pins {@code h} on {@code host}, reads what {@code read} takes from the pin, releases it. */
    private static long[] pinned(Host host, byte[][] h, java.util.function.Function<TransferPin, long[]> read) {
        LocalStore store = host.engine().localStore();
        TransferPin pin = store.pinForTransfer("ns", BlockHashes.of(h), Duration.ofSeconds(5));
        try {
            assertThat(pin.blocks()).isEqualTo(h.length);
            return read.apply(pin);
        } finally {
            store.releaseTransfer(pin.id());
        }
    }

    /** Each block's kept checksum (-1: not summed yet). */
    private static long[] keptSums(Host host, byte[][] h) {
        return pinned(host, h, pin -> pin.checksums().clone());
    }

    /** What each block's bytes in the host's pool sum to now. */
    private static long[] sumsOfBytes(Host host, byte[][] h) {
        return pinned(host, h, pin -> java.util.stream.IntStream.range(0, pin.blocks()).mapToLong(i -> Integer.toUnsignedLong(
                BlockChecksum.of(host.engine().poolMemory(), pin.slotOffsets().get(i), pin.slotBytes()))).toArray());
    }

    @Test
    void sealedBlocksAreSummedAheadAndAFetchedBlockKeepsTheSumItWasCheckedAgainst() throws Exception {
        Host[] ab = aAndB();
        Host a = ab[0];
        Host b = ab[1];
        byte[][] h = hashes(6, 5);
        save(a, h);
        // the owner sums each sealed block once, in the background, not when a peer reads it
        waitFor(() -> Arrays.stream(keptSums(a, h)).allMatch(c -> c >= 0), "A summed its blocks ahead");
        assertThat(keptSums(a, h)).containsExactly(sumsOfBytes(a, h));
        a.engine().flush(10_000); // the visibility barrier: ended and advertised
        QueryResult q = settle(b, h, new int[1]);
        assertThat(q.hitBlocks()).isEqualTo(6);
        loadAndCheck(b, q, h);
        // the fetching host keeps the sum each block was checked against on arrival: known at once
        assertThat(keptSums(b, h)).containsExactly(sumsOfBytes(b, h)).containsExactly(sumsOfBytes(a, h));
        assertThat(a.engine().stats().get(io.pegaflow.engine.metrics.Counter.BLOCK_CHECKSUMS_AHEAD)).isEqualTo(6);
        // ... and never sums them itself: each kept the sum it was checked against
        assertThat(b.engine().stats().get(io.pegaflow.engine.metrics.Counter.BLOCK_CHECKSUMS_AHEAD)).isZero();
        assertThat(b.engine().stats().get(io.pegaflow.engine.metrics.Counter.BLOCK_CHECKSUMS_DEFERRED)).isZero();
        a.engine().verifyInvariants();
        b.engine().verifyInvariants();
    }

    @ParameterizedTest(name = "segment {0}")
    @ValueSource(longs = {2048, 24576, 76800})
    void aCorruptedByteOnTheWireIsAMissNeverWrongBytes(long segmentBytes) throws Exception {
        segment = segmentBytes;
        Path secret = secret("a-cluster-secret-of-enough-length");
        // A advertises a proxy that flips one payload byte of every block it relays
        try (Corrupter proxy = new Corrupter()) {
            Host a = host("a", secret, "127.0.0.1:" + proxy.port());
            proxy.target = a.cluster().server().address();
            Host b = host("b", secret);
            waitFor(() -> b.cluster().tier().registry().liveNodes().size() == 1, "B sees A");
            byte[][] h = hashes(4, 2);
            save(a, h);
            a.engine().flush(10_000); // the visibility barrier: ended and advertised
            QueryResult q = settle(b, h, new int[1]);
            assertThat(q.hitBlocks()).as("every block arrived corrupted: all misses").isZero();
            assertThat(proxy.flipped).isEqualTo(4);
            assertThat(b.cluster().tier().statsView().checksumFailures().getAsLong()).isEqualTo(4);
            b.engine().verifyInvariants();
            assertThat(b.engine().stats().get(io.pegaflow.engine.metrics.Gauge.INFLIGHT_BLOCKS)).isZero();
        }
    }

    @Test
    void aHostWithTheWrongSecretGetsNothing() throws Exception {
        Host a = host("a", secret("a-cluster-secret-of-enough-length"));
        Host b = host("b", secret("another-secret-of-enough-length!"));
        waitFor(() -> b.cluster().tier().registry().liveNodes().size() == 1, "B sees A");
        byte[][] h = hashes(4, 3);
        save(a, h);
        a.engine().flush(10_000); // the visibility barrier: ended and advertised
        QueryResult q = settle(b, h, new int[1]);
        assertThat(q.hitBlocks()).isZero();
        assertThat(b.cluster().tier().statsView().fetchFailures().getAsLong()).isPositive();
        // B hangs up on A's proof; A counts the hello refused once its thread reads that
        waitFor(() -> a.cluster().server().refusedConnections() > 0, "A counts B's broken-off hello as refused");
    }

    @Test
    void pinsAHostNeverReleasesEndAtTheirDeadline() throws Exception {
        Host a = host("a", secret("a-cluster-secret-of-enough-length"));
        byte[][] h = hashes(3, 4);
        save(a, h);
        LocalStore store = a.engine().localStore();
        TransferPin pin = store.pinForTransfer("ns", BlockHashes.of(h), Duration.ofMillis(200));
        assertThat(pin.blocks()).isEqualTo(3);
        assertThat(store.transferPins()).isEqualTo(1);
        assertThat(store.transferLive(pin.id())).isTrue();
        Thread.sleep(300);
        // past its deadline an owner sends no more of it, swept or not (its blocks may go)
        assertThat(store.transferLive(pin.id())).isFalse();
        store.sweep();
        assertThat(store.transferPins()).isZero();
        assertThat(store.releaseTransfer(pin.id())).isFalse();
        a.engine().verifyInvariants();
    }

    /** Relays one connection at a time to {@code target}, flipping the 100th byte of every block payload in each "PFBAT2" batch. */
    static final class Corrupter implements AutoCloseable {
        private final ServerSocket listen = new ServerSocket(0, 16, java.net.InetAddress.getLoopbackAddress());
        volatile InetSocketAddress target;
        volatile int flipped;
        private final Thread thread;

        Corrupter() throws IOException {
            this.thread = Thread.ofPlatform().daemon().start(this::run);
        }

        int port() {
            return listen.getLocalPort();
        }

        private void run() {
            while (!listen.isClosed()) {
                try {
                    Socket in = listen.accept();
                    Socket out = new Socket(target.getAddress(), target.getPort());
                    Thread.ofPlatform().daemon().start(() -> pump(in, out, false));
                    Thread.ofPlatform().daemon().start(() -> pump(out, in, true));
                } catch (IOException e) {
                    return;
                }
            }
        }

        private void pump(Socket from, Socket to, boolean corrupt) {
            byte[] marker = "PFBAT2".getBytes(StandardCharsets.US_ASCII);
            int matched = 0;
            long pos = -1; // bytes since the last marker, while inside a batch
            java.nio.ByteBuffer head = java.nio.ByteBuffer.allocate(10); // u16 blocks, u64 block length
            long payloadAt = 0;
            long blockLen = 0;
            int blocks = 0;
            try (InputStream i = from.getInputStream(); OutputStream o = to.getOutputStream()) {
                byte[] buf = new byte[65536];
                int n;
                while ((n = i.read(buf)) > 0) {
                    if (corrupt) {
                        for (int k = 0; k < n; k++) {
                            if (pos >= 0) {
                                if (pos < 10) {
                                    head.put(buf[k]);
                                    if (pos == 9) {
                                        blocks = Short.toUnsignedInt(head.getShort(0));
                                        blockLen = head.getLong(2);
                                        payloadAt = 10 + 8L * blocks;
                                    }
                                } else if (pos >= payloadAt && (pos - payloadAt) % blockLen == 100) {
                                    buf[k] ^= 0x5A;
                                    flipped++;
                                    if ((pos - payloadAt) / blockLen == blocks - 1) {
                                        pos = -2; // the batch's last block: wait for the next marker
                                    }
                                }
                                pos++;
                                continue;
                            }
                            if (buf[k] == marker[matched]) {
                                if (++matched == marker.length) {
                                    matched = 0;
                                    pos = 0;
                                    head.clear();
                                }
                            } else {
                                matched = buf[k] == marker[0] ? 1 : 0;
                            }
                        }
                    }
                    o.write(buf, 0, n);
                }
            } catch (IOException ignored) {
                // either side closed
            } finally {
                try {
                    from.close();
                    to.close();
                } catch (IOException ignored) {
                    // closed
                }
            }
        }

        @Override
        public void close() throws IOException {
            listen.close();
        }
    }
}
