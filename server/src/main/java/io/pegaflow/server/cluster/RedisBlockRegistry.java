package io.pegaflow.server.cluster;

import io.lettuce.core.ClientOptions;
import io.lettuce.core.KeyValue;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisFuture;
import io.lettuce.core.RedisURI;
import io.lettuce.core.ScriptOutputType;
import io.lettuce.core.SocketOptions;
import io.lettuce.core.SslOptions;
import io.lettuce.core.AbstractRedisClient;
import io.lettuce.core.api.StatefulConnection;
import io.lettuce.core.api.async.RedisKeyAsyncCommands;
import io.lettuce.core.api.async.RedisScriptingAsyncCommands;
import io.lettuce.core.api.async.RedisStringAsyncCommands;
import io.lettuce.core.cluster.ClusterClientOptions;
import io.lettuce.core.cluster.ClusterTopologyRefreshOptions;
import io.lettuce.core.cluster.RedisClusterClient;
import io.lettuce.core.codec.ByteArrayCodec;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.InvalidArgumentException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.BiConsumer;
import java.util.function.Consumer;

/**
 * {@link BlockRegistry} on Redis (docs/cluster.md, "Registry layout").
 *
 * <ul>
 *   <li>A host claims an index {@code i} < {@code maxNodes} with {@code SET pf:node:i "<id> <peer
 *       addr> <ms>" NX PX ttl} and keeps it with a heartbeat (a script that refreshes the key
 *       only while it still names this host). The key expiring is the host leaving.</li>
 *   <li>A block is one key, {@code "pf" + 6 bytes of SHA-256(namespace) + hash}, whose value is a
 *       bitmap of owner indices: advertise is {@code SETBIT key i 1}, withdraw clears the bit and
 *       deletes the key when no bit is left. Any number of owners, one small value each.</li>
 *   <li>Lookup is one {@code MGET} of a few keys of the asked prefix ({@link #probes}); the
 *       longest run whose bitmaps share a live owner wins, and that owner's pin trims it. Owners whose heartbeat is older (or newer: a wrong clock)
 *       than {@code staleAfter} are never chosen.</li>
 * </ul>
 *
 * Updates wait in a bounded map, netted per block (the last update wins), and a flusher sends
 * them pipelined. With Redis down the host works alone: updates are dropped and counted, the
 * failure is logged once, and when Redis answers again (or comes back empty) every resident
 * block is advertised again.
 */
public final class RedisBlockRegistry implements BlockRegistry {
    private static final System.Logger LOG = System.getLogger(RedisBlockRegistry.class.getName());
    static final byte[] NODE_PREFIX = "pf:node:".getBytes(StandardCharsets.US_ASCII);
    private static final int FLUSH_BATCH = 16_384;
    private static final String HEARTBEAT = """
            local v = redis.call('GET', KEYS[1])
            if v and string.sub(v, 1, 36) ~= ARGV[1] then return 0 end
            redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
            if v then return 1 end
            return 2""";
    /** Clears a departed host's bit, unless a host holds its index again (KEYS[2], its node key). */
    private static final String CLEAN = """
            if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
            redis.call('SETBIT', KEYS[1], ARGV[1], 0)
            if redis.call('BITCOUNT', KEYS[1]) == 0 then redis.call('DEL', KEYS[1]) end
            return 1""";
    private static final String WITHDRAW = """
            redis.call('SETBIT', KEYS[1], ARGV[1], 0)
            if redis.call('BITCOUNT', KEYS[1]) == 0 then redis.call('DEL', KEYS[1]) end
            return 1""";

    /** Settings; {@code staleAfter} is also the node key's TTL. */
    public record Settings(String url, int maxNodes, Duration heartbeat, Duration staleAfter, int queueDepth,
            Duration timeout, SslOptions ssl, boolean cluster) {
        /** A standalone or Sentinel-managed Redis. */
        public Settings(String url, int maxNodes, Duration heartbeat, Duration staleAfter, int queueDepth, Duration timeout,
                SslOptions ssl) {
            this(url, maxNodes, heartbeat, staleAfter, queueDepth, timeout, ssl, false);
        }

        public Settings {
            if (cluster && url != null && url.startsWith("redis-sentinel://")) {
                throw new InvalidArgumentException("--redis-cluster with " + redacted(url) + "; a Redis Cluster is given as redis://HOST:PORT[,HOST:PORT...]");
            }
            if (url == null || !(url.startsWith("redis://") || url.startsWith("rediss://") || url.startsWith("redis-sentinel://"))) {
                throw new InvalidArgumentException("--redis-url " + (url == null ? null : redacted(url))
                        + "; expected redis://, rediss:// or redis-sentinel://HOST:PORT");
            }
            if (maxNodes < 2 || maxNodes > 4096) {
                throw new InvalidArgumentException("--cluster-max-nodes " + maxNodes + "; expected 2..4096");
            }
            if (heartbeat.toMillis() < 50 || staleAfter.compareTo(heartbeat.multipliedBy(2)) < 0) {
                throw new InvalidArgumentException("heartbeat " + heartbeat + ", stale after " + staleAfter
                        + "; expected a heartbeat >= 50 ms and stale-after >= 2 heartbeats");
            }
            if (queueDepth < 1 || queueDepth > (1 << 24)) {
                throw new InvalidArgumentException("--registry-queue-depth " + queueDepth + "; expected 1..16777216");
            }
        }

        public static Settings of(String url) {
            return new Settings(url, 256, Duration.ofSeconds(1), Duration.ofSeconds(3), 65_536, Duration.ofSeconds(2), null, false);
        }
    }

    private final Settings settings;
    private final String nodeId = UUID.randomUUID().toString();
    private final String peerAddr;
    private final Consumer<BiConsumer<String, byte[]>> resident;
    private final AbstractRedisClient client;
    private final java.util.function.Supplier<Link> connect;
    private final ScheduledExecutorService beat;
    private final Thread flusher;

    private final Object queueLock = new Object();
    /** Netted updates: key -> true (advertise) / false (withdraw). Guarded by queueLock. */
    private LinkedHashMap<ByteBuffer, Boolean> queued = new LinkedHashMap<>();
    /** Other hosts' claims to clear: key -> owner index (negative: -1 - index of a departed host). Guarded by queueLock. */
    private LinkedHashMap<ByteBuffer, Integer> forgets = new LinkedHashMap<>();
    private boolean resyncWanted;
    private long flushRequested;
    private long flushDone;
    /**
     * Advertisements dropped so far (Redis unreachable, or the queue full), as an epoch, and
     * the epoch a full re-advertisement last covered: while the first is ahead, a flush cannot
     * say that every save before it is visible to other hosts. Guarded by queueLock.
     */
    private long dropEpoch;
    private long resyncedEpoch;
    private volatile boolean closed;

    private volatile Link pipe; // the flusher's, flushed by hand
    private volatile Link ask;  // lookups and heartbeats

    /**
     * One connection and its commands, standalone or cluster alike (Lettuce's cluster commands
     * route each key to its shard and split multi-key reads by slot).
     */
    private record Link(StatefulConnection<byte[], byte[]> conn, RedisStringAsyncCommands<byte[], byte[]> str,
            RedisScriptingAsyncCommands<byte[], byte[]> lua, RedisKeyAsyncCommands<byte[], byte[]> key) {}
    private volatile int index = -1;
    private volatile boolean healthy;
    private volatile boolean downLogged;
    private volatile List<Node> live = List.of();
    private final Map<String, byte[]> nsTags = new java.util.concurrent.ConcurrentHashMap<>();

    private final AtomicLong advertised = new AtomicLong();
    private final AtomicLong withdrawn = new AtomicLong();
    private final AtomicLong dropped = new AtomicLong();
    private final AtomicLong errors = new AtomicLong();
    private final AtomicLong lookups = new AtomicLong();
    private final AtomicLong resyncs = new AtomicLong();

    /**
     * Starts heart-beating and flushing. {@code resident} walks this host's resident blocks
     * (namespace, hash) for a full advertisement. Redis need not be up yet.
     */
    public RedisBlockRegistry(Settings settings, String peerAddr, Consumer<BiConsumer<String, byte[]>> resident) {
        this.settings = settings;
        this.peerAddr = peerAddr;
        this.resident = resident;
        SocketOptions socket = SocketOptions.builder().connectTimeout(settings.timeout()).build();
        if (settings.cluster()) {
            List<RedisURI> seeds = seeds(settings.url(), settings.timeout());
            RedisClusterClient c = RedisClusterClient.create(seeds);
            // Commands wait for a shard's connection (opened on first use, flushed by hand on the
            // pipeline): rejecting them would fail every first batch. Every wait is bounded by a timeout.
            ClusterClientOptions.Builder options = ClusterClientOptions.builder().autoReconnect(true)
                    .disconnectedBehavior(ClientOptions.DisconnectedBehavior.ACCEPT_COMMANDS).socketOptions(socket)
                    // a failover or resharding is picked up within a heartbeat or two
                    .topologyRefreshOptions(ClusterTopologyRefreshOptions.builder()
                            .enablePeriodicRefresh(settings.heartbeat().multipliedBy(5)).enableAllAdaptiveRefreshTriggers().build());
            if (settings.ssl() != null) {
                options.sslOptions(settings.ssl());
            }
            c.setOptions(options.build());
            this.client = c;
            this.connect = () -> link(c.connect(ByteArrayCodec.INSTANCE), c2 -> c2.async());
        } else {
            RedisURI uri = RedisURI.create(settings.url());
            uri.setTimeout(settings.timeout());
            RedisClient c = RedisClient.create(uri);
            ClientOptions.Builder options = ClientOptions.builder().autoReconnect(true)
                    .disconnectedBehavior(ClientOptions.DisconnectedBehavior.REJECT_COMMANDS).socketOptions(socket);
            if (settings.ssl() != null) {
                options.sslOptions(settings.ssl());
            }
            c.setOptions(options.build());
            this.client = c;
            this.connect = () -> link(c.connect(ByteArrayCodec.INSTANCE), c2 -> c2.async());
        }
        ScheduledThreadPoolExecutor s = new ScheduledThreadPoolExecutor(1, r -> {
            Thread t = new Thread(r, "pegaflow-registry-heartbeat");
            t.setDaemon(true);
            return t;
        });
        s.setRemoveOnCancelPolicy(true);
        this.beat = s;
        beat.scheduleWithFixedDelay(this::heartbeatQuietly, 0, settings.heartbeat().toMillis(), TimeUnit.MILLISECONDS);
        this.flusher = Thread.ofPlatform().daemon().name("pegaflow-registry-flush").start(this::flushLoop);
    }

    /** {@code url} without its credentials (a password in a Redis URL never reaches a log). */
    static String redacted(String url) {
        int scheme = url.indexOf("://");
        int at = url.indexOf('@');
        return scheme >= 0 && at > scheme ? url.substring(0, scheme + 3) + "***@" + url.substring(at + 1) : url;
    }

    /** A connection with its commands: standalone and cluster commands share these interfaces. */
    private static <C extends StatefulConnection<byte[], byte[]>, A extends RedisStringAsyncCommands<byte[], byte[]>
            & RedisScriptingAsyncCommands<byte[], byte[]> & RedisKeyAsyncCommands<byte[], byte[]>> Link link(C conn,
            java.util.function.Function<C, A> commands) {
        A a = commands.apply(conn);
        return new Link(conn, a, a, a);
    }

    /** The seeds of a Redis Cluster: {@code redis[s]://[credentials@]HOST:PORT[,HOST:PORT...]}. */
    static List<RedisURI> seeds(String url, Duration timeout) {
        int at = url.indexOf("://") + 3;
        String scheme = url.substring(0, at);
        String rest = url.substring(at);
        String credentials = rest.contains("@") ? rest.substring(0, rest.indexOf('@') + 1) : "";
        List<RedisURI> out = new ArrayList<>();
        for (String hostPort : rest.substring(credentials.length()).split(",")) {
            if (hostPort.isBlank()) {
                throw new InvalidArgumentException("--redis-url " + redacted(url) + " has an empty seed; expected HOST:PORT[,HOST:PORT...]");
            }
            RedisURI u = RedisURI.create(scheme + credentials + hostPort.trim());
            u.setTimeout(timeout);
            out.add(u);
        }
        return out;
    }

    /** This host's index in the registry, or -1 before it claimed one. */
    public int index() {
        return index;
    }

    // ------------------------------------------------------------ updates (never block)

    @Override
    public void advertise(String namespace, byte[] hash) {
        enqueue(key(namespace, hash, 0, hash.length), true);
    }

    @Override
    public void withdraw(String namespace, byte[] hash) {
        enqueue(key(namespace, hash, 0, hash.length), false);
    }

    @Override
    public void forget(String namespace, byte[] hash, Node node) {
        synchronized (queueLock) {
            if (forgets.size() >= settings.queueDepth()) {
                dropped.incrementAndGet();
                return;
            }
            forgets.put(ByteBuffer.wrap(key(namespace, hash, 0, hash.length)), node.index());
            queueLock.notifyAll();
        }
    }

    /** Queues clearing departed host {@code owner}'s bit on {@code key} (checked against its node key in Redis). */
    private void forgetDeparted(byte[] key, int owner) {
        synchronized (queueLock) {
            if (forgets.size() < settings.queueDepth()) {
                forgets.put(ByteBuffer.wrap(key), -1 - owner);
            }
        }
    }

    private void enqueue(byte[] key, boolean holds) {
        ByteBuffer k = ByteBuffer.wrap(key);
        synchronized (queueLock) {
            if (queued.size() >= settings.queueDepth() && !queued.containsKey(k)) {
                dropped.incrementAndGet();
                dropEpoch++;
                resyncWanted = true; // the full re-advertisement is what repairs a lost one
                return;
            }
            queued.put(k, holds);
            if (queued.size() == 1 || queued.size() >= FLUSH_BATCH) {
                queueLock.notifyAll();
            }
        }
    }

    /**
     * The visibility barrier: returns once every update queued before it is in Redis. An
     * advertisement dropped on the way (Redis unreachable for a moment, this host's index taken
     * over after missed heartbeats, the queue full) is repaired by advertising every resident
     * block again; the barrier waits for that repair while its deadline (4 timeouts) allows, and
     * fails naming Redis when it has not happened by then, rather than return as if the saves
     * were visible.
     */
    @Override
    public void flush() throws Exception {
        flush(true);
    }

    private void flush(boolean awaitRepair) throws Exception {
        synchronized (queueLock) {
            long ticket = ++flushRequested;
            queueLock.notifyAll();
            long deadline = System.nanoTime() + settings.timeout().toNanos() * 4;
            while (!closed && (flushDone < ticket || (awaitRepair && dropEpoch > resyncedEpoch))) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    break;
                }
                queueLock.wait(Math.max(1, left / 1_000_000));
            }
            if (dropEpoch > resyncedEpoch) {
                throw new java.io.IOException("registry: advertisements were dropped (Redis at " + redacted(settings.url())
                        + " unreachable, or the queue of " + settings.queueDepth() + " full) and not advertised again within "
                        + settings.timeout().multipliedBy(4) + "; this host's blocks are advertised again once Redis answers,"
                        + " and other hosts do not see them until then");
            }
            if (flushDone < ticket && !closed) {
                throw new java.util.concurrent.TimeoutException("registry flush not done in " + settings.timeout().multipliedBy(4));
            }
        }
    }

    private void flushLoop() {
        while (!closed) {
            LinkedHashMap<ByteBuffer, Boolean> batch;
            LinkedHashMap<ByteBuffer, Integer> forget;
            boolean resync;
            long ticket;
            long epochAtStart;
            synchronized (queueLock) {
                // a wanted re-advertisement waits for Redis to answer (the heartbeat wakes this thread)
                while (!closed && queued.isEmpty() && forgets.isEmpty() && !(resyncWanted && index >= 0 && healthy)
                        && flushDone == flushRequested) {
                    try {
                        queueLock.wait(100);
                    } catch (InterruptedException e) {
                        return;
                    }
                }
                batch = queued;
                queued = new LinkedHashMap<>();
                forget = forgets;
                forgets = new LinkedHashMap<>();
                resync = resyncWanted && index >= 0 && healthy;
                if (resync) {
                    resyncWanted = false;
                }
                ticket = flushRequested;
                epochAtStart = dropEpoch;
            }
            boolean sent = false;
            boolean resynced = false;
            try {
                sent = send(batch, forget);
                if (resync) {
                    resynced = resyncAll();
                }
            } catch (Exception e) {
                failed("sending " + batch.size() + " registry updates", e);
                if (resync) {
                    synchronized (queueLock) {
                        resyncWanted = true;
                    }
                }
            }
            synchronized (queueLock) {
                if (!sent) {
                    dropEpoch++;
                    resyncWanted = true; // runs once Redis answers: the heartbeat that sees it notifies
                }
                if (resynced) {
                    resyncedEpoch = Math.max(resyncedEpoch, epochAtStart); // what was dropped before it began
                }
                flushDone = Math.max(flushDone, ticket);
                queueLock.notifyAll();
            }
        }
    }

    /** Sends the updates; false when they were dropped instead (no healthy connection). */
    private boolean send(Map<ByteBuffer, Boolean> batch, Map<ByteBuffer, Integer> forget) throws Exception {
        if (batch.isEmpty() && forget.isEmpty()) {
            return true;
        }
        Link c = pipe;
        int me = index;
        if (c == null || me < 0 || !healthy) {
            dropped.addAndGet(batch.size() + forget.size()); // the resync after reconnecting re-advertises
            return false;
        }
        List<RedisFuture<?>> pending = new ArrayList<>(Math.min(batch.size() + forget.size(), FLUSH_BATCH));
        long adv = 0;
        long wd = 0;
        byte[] meArg = Integer.toString(me).getBytes(StandardCharsets.US_ASCII);
        for (Map.Entry<ByteBuffer, Boolean> e : batch.entrySet()) {
            byte[] key = e.getKey().array();
            if (e.getValue()) {
                pending.add(c.str().setbit(key, me, 1));
                adv++;
            } else {
                pending.add(c.lua().eval(WITHDRAW, ScriptOutputType.INTEGER, new byte[][] {key}, meArg));
                wd++;
            }
            if (pending.size() >= FLUSH_BATCH) {
                drain(c, pending);
            }
        }
        for (Map.Entry<ByteBuffer, Integer> e : forget.entrySet()) {
            int owner = e.getValue();
            if (owner >= 0) {
                pending.add(c.lua().eval(WITHDRAW, ScriptOutputType.INTEGER, new byte[][] {e.getKey().array()},
                        Integer.toString(owner).getBytes(StandardCharsets.US_ASCII)));
            } else if (settings.cluster()) {
                // A script may touch one shard only: the block key and the node key live on two.
                // The departed host's absence was seen in the last heartbeat's view instead.
                pending.add(c.lua().eval(WITHDRAW, ScriptOutputType.INTEGER, new byte[][] {e.getKey().array()},
                        Integer.toString(-1 - owner).getBytes(StandardCharsets.US_ASCII)));
            } else {
                pending.add(c.lua().eval(CLEAN, ScriptOutputType.INTEGER, new byte[][] {e.getKey().array(), nodeKey(-1 - owner)},
                        Integer.toString(-1 - owner).getBytes(StandardCharsets.US_ASCII)));
            }
            if (pending.size() >= FLUSH_BATCH) {
                drain(c, pending);
            }
        }
        drain(c, pending);
        advertised.addAndGet(adv);
        withdrawn.addAndGet(wd);
        return true;
    }

    private void drain(Link c, List<RedisFuture<?>> pending) throws Exception {
        if (pending.isEmpty()) {
            return;
        }
        CompletableFuture<?>[] each = pending.stream().map(f -> f.toCompletableFuture()).toArray(CompletableFuture[]::new);
        CompletableFuture<Void> all = CompletableFuture.allOf(each);
        pending.clear();
        long deadline = System.nanoTime() + settings.timeout().toNanos() * 4;
        long slice = TimeUnit.MILLISECONDS.toNanos(5);
        while (true) {
            // Flushed again while waiting: on a Redis Cluster, commands routed to a shard whose
            // connection was still opening when flushCommands ran can stay in that connection's
            // buffer (redis/lettuce#2420); a later flush sends them once it is open.
            c.conn().flushCommands();
            try {
                all.get(Math.min(slice, Math.max(1, deadline - System.nanoTime())), TimeUnit.NANOSECONDS);
                return;
            } catch (java.util.concurrent.ExecutionException e) {
                throw e.getCause() instanceof Exception x ? x : e;
            } catch (java.util.concurrent.TimeoutException e) {
                if (System.nanoTime() - deadline >= 0) {
                    for (CompletableFuture<?> f : each) {
                        f.cancel(true); // an answer arriving later is discarded
                    }
                    throw new java.util.concurrent.TimeoutException(each.length + " registry updates not answered in "
                            + settings.timeout().multipliedBy(4));
                }
                slice = Math.min(slice * 2, TimeUnit.MILLISECONDS.toNanos(200));
            }
        }
    }

    /** Advertises every resident block again (Redis restarted empty, or answered again after an outage). */
    /** True when every chunk was sent (none dropped for want of a healthy connection). */
    private boolean resyncAll() throws Exception {
        resyncs.incrementAndGet();
        LinkedHashMap<ByteBuffer, Boolean> chunk = new LinkedHashMap<>();
        Exception[] failure = new Exception[1];
        boolean[] all = {true};
        resident.accept((ns, hash) -> {
            if (failure[0] != null) {
                return;
            }
            chunk.put(ByteBuffer.wrap(key(ns, hash, 0, hash.length)), true);
            if (chunk.size() >= FLUSH_BATCH) {
                try {
                    all[0] &= send(chunk, Map.of());
                } catch (Exception e) {
                    failure[0] = e;
                }
                chunk.clear();
            }
        });
        if (failure[0] != null) {
            throw failure[0];
        }
        all[0] &= send(chunk, Map.of());
        if (all[0]) {
            LOG.log(System.Logger.Level.INFO, "registry: resident blocks advertised again (node " + index + ")");
        }
        return all[0];
    }

    // ------------------------------------------------------------ lookup

    @Override
    public Owner lookup(String namespace, BlockHashes hashes, List<String> excluded) throws Exception {
        Link c = ask;
        if (c == null || !healthy) {
            throw new IllegalStateException("registry not connected");
        }
        long now = System.currentTimeMillis();
        Map<Integer, Node> candidates = new java.util.HashMap<>();
        for (Node n : live) {
            if (fresh(n, now) && (excluded == null || !excluded.contains(n.id()))) {
                candidates.put(n.index(), n);
            }
        }
        if (candidates.isEmpty() || hashes.count() == 0) {
            return Owner.NONE;
        }
        lookups.incrementAndGet();
        int count = hashes.count();
        int len = hashes.hashLen();
        int[] probes = probes(count);
        byte[][] keys = new byte[probes.length][];
        for (int k = 0; k < probes.length; k++) {
            keys[k] = key(namespace, hashes.packed(), probes[k] * len, len);
        }
        List<KeyValue<byte[], byte[]>> values = c.str().mget(keys).get(settings.timeout().toMillis(), TimeUnit.MILLISECONDS);
        Set<Integer> alive = new HashSet<>(candidates.keySet());
        Set<Integer> known = new HashSet<>();
        for (Node n : live) {
            known.add(n.index());
        }
        known.add(index);
        int run = count;
        for (int k = 0; k < values.size(); k++) {
            KeyValue<byte[], byte[]> kv = values.get(k);
            byte[] bits = kv.hasValue() ? kv.getValue() : null;
            Set<Integer> next = new HashSet<>();
            if (bits != null) {
                for (int i = 0; i < bits.length * 8; i++) {
                    if (!bit(bits, i)) {
                        continue;
                    }
                    if (alive.contains(i)) {
                        next.add(i);
                    } else if (!known.contains(i)) {
                        forgetDeparted(keys[k], i); // a host that left: cleaned up now that it was seen
                    }
                }
            }
            if (next.isEmpty()) {
                run = probes[k]; // held up to some block before this probe: the owner's pin says exactly where
                break;
            }
            alive = next;
        }
        if (run == 0) {
            return Owner.NONE;
        }
        List<Integer> holders = new ArrayList<>(alive);
        int pick = holders.get(java.util.concurrent.ThreadLocalRandom.current().nextInt(holders.size()));
        return new Owner(candidates.get(pick), run);
    }

    /**
     * The blocks a lookup asks Redis about: 0, 1, 3, 7, ... (2^k - 1) and the last. A prefix is
     * saved and evicted mostly as a whole, so these bound the run held by one owner; the owner's
     * pin then returns its exact resident prefix (the registry is a hint, the pin the truth).
     * 2,048 hashes cost 12 keys instead of 2,048.
     */
    static int[] probes(int count) {
        int[] out = new int[34];
        int n = 0;
        for (long p = 0; p < count; p = p * 2 + 1) {
            out[n++] = (int) p;
        }
        if (out[n - 1] != count - 1) {
            out[n++] = count - 1;
        }
        return Arrays.copyOf(out, n);
    }

    private boolean fresh(Node n, long nowMillis) {
        long stale = settings.staleAfter().toMillis();
        return nowMillis - n.heartbeatMillis() <= stale && n.heartbeatMillis() - nowMillis <= stale;
    }

    static boolean bit(byte[] bits, int i) {
        int b = i >>> 3;
        return b < bits.length && ((bits[b] >> (7 - (i & 7))) & 1) != 0;
    }

    @Override
    public List<Node> liveNodes() {
        long now = System.currentTimeMillis();
        return live.stream().filter(n -> fresh(n, now)).toList();
    }

    // ------------------------------------------------------------ heartbeat

    private void heartbeatQuietly() {
        try {
            heartbeat();
        } catch (Exception e) {
            failed("heartbeat", e);
        }
    }

    private synchronized void heartbeat() throws Exception {
        if (closed) {
            return;
        }
        if (ask == null) {
            ask = connect.get();
            Link p = connect.get();
            p.conn().setAutoFlushCommands(false);
            pipe = p;
        }
        Link cmd = ask;
        long ms = settings.timeout().toMillis();
        byte[] ttl = Long.toString(settings.staleAfter().toMillis()).getBytes(StandardCharsets.US_ASCII);
        boolean wasHealthy = healthy;
        if (index >= 0) {
            byte[] value = (nodeId + " " + peerAddr + " " + System.currentTimeMillis()).getBytes(StandardCharsets.UTF_8);
            Long r = cmd.lua().<Long>eval(HEARTBEAT, ScriptOutputType.INTEGER, new byte[][] {nodeKey(index)},
                    nodeId.getBytes(StandardCharsets.US_ASCII), value, ttl).get(ms, TimeUnit.MILLISECONDS);
            if (r == 0) {
                LOG.log(System.Logger.Level.WARNING, "registry: index " + index + " was taken over (this host missed its heartbeats); claiming another");
                index = -1;
            } else if (r == 2 || !wasHealthy) {
                wantResync(); // Redis lost this host's key (restarted empty) or was unreachable
            }
        }
        if (index < 0) {
            claim(cmd, ttl, ms);
            wantResync();
        }
        refreshLive(cmd, ms);
        healthy = true;
        if (!wasHealthy) {
            synchronized (queueLock) {
                queueLock.notifyAll(); // the re-advertisement wanted above can run now
            }
        }
        if (downLogged) {
            downLogged = false;
            LOG.log(System.Logger.Level.INFO, "registry: Redis answers again at " + redacted(settings.url()) + "; node index " + index);
        }
    }

    private void claim(Link cmd, byte[] ttl, long ms) throws Exception {
        List<KeyValue<byte[], byte[]>> taken = cmd.str().mget(allNodeKeys()).get(ms, TimeUnit.MILLISECONDS);
        for (int i = 0; i < settings.maxNodes(); i++) {
            if (taken.get(i).hasValue()) {
                continue;
            }
            byte[] value = (nodeId + " " + peerAddr + " " + System.currentTimeMillis()).getBytes(StandardCharsets.UTF_8);
            String ok = cmd.str().set(nodeKey(i), value, io.lettuce.core.SetArgs.Builder.nx().px(Long.parseLong(new String(ttl,
                    StandardCharsets.US_ASCII)))).get(ms, TimeUnit.MILLISECONDS);
            if ("OK".equals(ok)) {
                index = i;
                LOG.log(System.Logger.Level.INFO, "registry: this host is node " + i + " (" + nodeId + ", peer " + peerAddr + ")");
                return;
            }
        }
        throw new IllegalStateException("registry: all " + settings.maxNodes() + " node indices are taken; raise --cluster-max-nodes");
    }

    private void refreshLive(Link cmd, long ms) throws Exception {
        List<KeyValue<byte[], byte[]>> nodes = cmd.str().mget(allNodeKeys()).get(ms, TimeUnit.MILLISECONDS);
        List<Node> seen = new ArrayList<>();
        for (int i = 0; i < nodes.size(); i++) {
            if (i == index || !nodes.get(i).hasValue()) {
                continue;
            }
            String[] f = new String(nodes.get(i).getValue(), StandardCharsets.UTF_8).split(" ");
            if (f.length != 3 || f[0].equals(nodeId)) {
                continue;
            }
            try {
                seen.add(new Node(i, f[0], f[1], Long.parseLong(f[2])));
            } catch (NumberFormatException e) {
                // not a node record this version wrote: never chosen
            }
        }
        live = List.copyOf(seen);
    }

    private void wantResync() {
        synchronized (queueLock) {
            resyncWanted = true;
            queueLock.notifyAll();
        }
    }

    private void failed(String what, Exception e) {
        errors.incrementAndGet();
        healthy = false;
        if (!downLogged) {
            downLogged = true;
            LOG.log(System.Logger.Level.WARNING, "registry: " + what + " failed at " + redacted(settings.url()) + " (" + e
                    + "); this host works alone until Redis answers (logged once)");
        }
    }

    @Override
    public boolean connected() {
        return healthy;
    }

    @Override
    public RegistryStats stats() {
        return new RegistryStats(advertised.get(), withdrawn.get(), dropped.get(), errors.get(), lookups.get(), resyncs.get());
    }

    // ------------------------------------------------------------ keys

    private byte[][] allNodeKeys() {
        byte[][] keys = new byte[settings.maxNodes()][];
        for (int i = 0; i < keys.length; i++) {
            keys[i] = nodeKey(i);
        }
        return keys;
    }

    static byte[] nodeKey(int i) {
        byte[] n = Integer.toString(i).getBytes(StandardCharsets.US_ASCII);
        byte[] k = Arrays.copyOf(NODE_PREFIX, NODE_PREFIX.length + n.length);
        System.arraycopy(n, 0, k, NODE_PREFIX.length, n.length);
        return k;
    }

    /** {@code "pf"}, the namespace's 6-byte tag, then the hash. */
    byte[] key(String namespace, byte[] buf, int off, int len) {
        byte[] tag = nsTags.computeIfAbsent(namespace, RedisBlockRegistry::tag);
        byte[] k = new byte[2 + tag.length + len];
        k[0] = 'p';
        k[1] = 'f';
        System.arraycopy(tag, 0, k, 2, tag.length);
        System.arraycopy(buf, off, k, 2 + tag.length, len);
        return k;
    }

    static byte[] tag(String namespace) {
        try {
            return Arrays.copyOf(MessageDigest.getInstance("SHA-256").digest(namespace.getBytes(StandardCharsets.UTF_8)), 6);
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    @Override
    public void close() {
        if (closed) {
            return;
        }
        try {
            flush(false); // withdrawals of a clean stop reach Redis; a repair is not waited for
        } catch (Exception ignored) {
            // Redis is down: the key expiring says this host left
        }
        closed = true;
        synchronized (queueLock) {
            queueLock.notifyAll();
        }
        beat.shutdownNow();
        try {
            flusher.join(2000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        Link a = ask;
        int me = index;
        if (a != null && me >= 0 && healthy) {
            try {
                a.key().del(nodeKey(me)).get(500, TimeUnit.MILLISECONDS); // others stop choosing this host now
            } catch (Exception ignored) {
                // the key expires by itself
            }
        }
        // Lettuce's blocking shutdown can wait forever (redis/lettuce#2278: seen in CI, a test
        // stuck 7 min in AbstractRedisClient.shutdown after Redis commands had timed out), so
        // wait for the asynchronous one a bounded time and leave the rest to the process
        try {
            client.shutdownAsync(0, 1, TimeUnit.SECONDS).get(3, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (java.util.concurrent.ExecutionException | java.util.concurrent.TimeoutException e) {
            LOG.log(System.Logger.Level.WARNING, "registry: the Redis client did not shut down within 3 s (" + e
                    + "); going on without it");
        }
    }
}
