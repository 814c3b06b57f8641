package io.pegaflow.server.cluster;

import io.lettuce.core.AbstractRedisClient;
import io.lettuce.core.ClientOptions;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.SocketOptions;
import io.lettuce.core.SslOptions;
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
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.BiConsumer;
import java.util.function.Consumer;
import java.util.function.Supplier;

/**
 * {@link BlockRegistry} on Redis (docs/cluster.md, "Registry layout").
 *
 * <ul>
 *   <li>A host claims an index {@code i} < {@code maxNodes} with {@code SET pf:node:i "<id> <peer
 *       addr> <ms>" NX PX ttl} and keeps it with a heartbeat (a script that refreshes the key
 *       only while it still names this host). The key expiring is the host leaving
 *       ({@link RegistryMembership}).</li>
 *   <li>A block is one key, {@code "pf" + 6 bytes of SHA-256(namespace) + hash}, whose value is a
 *       bitmap of owner indices: advertise is {@code SETBIT key i 1}, withdraw clears the bit and
 *       deletes the key when no bit is left. Any number of owners, one small value each
 *       ({@link RegistryKeys}, {@link RedisUpdateSender}).</li>
 *   <li>Lookup is one {@code MGET} of a few keys of the asked prefix ({@link RegistryLookup#probes});
 *       the longest run whose bitmaps share a live owner wins, and that owner's pin trims it.
 *       Owners whose heartbeat is older (or newer: a wrong clock) than {@code staleAfter} are
 *       never chosen ({@link RegistryLookup}).</li>
 * </ul>
 *
 * Updates wait in a bounded map, netted per block (the last update wins), and a flusher sends
 * them pipelined ({@link AdvertisementQueue}). With Redis down the host works alone: updates
 * are dropped and counted, the failure is logged once, and when Redis answers again (or comes
 * back empty) every resident block is advertised again. This class builds the Lettuce client
 * and wires those parts together behind the public API.
 */
public final class RedisBlockRegistry implements BlockRegistry {
    private static final System.Logger LOG = System.getLogger(RedisBlockRegistry.class.getName());

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

    /**
     * One connection and its commands, standalone or cluster alike (Lettuce's cluster commands
     * route each key to its shard and split multi-key reads by slot).
     */
    record Link(StatefulConnection<byte[], byte[]> conn, RedisStringAsyncCommands<byte[], byte[]> str,
            RedisScriptingAsyncCommands<byte[], byte[]> lua, RedisKeyAsyncCommands<byte[], byte[]> key) {}

    private final AbstractRedisClient client;
    private final RegistryKeys keys = new RegistryKeys();
    private final RegistryMembership membership;
    private final RedisUpdateSender sender;
    private final AdvertisementQueue queue;
    private final RegistryLookup lookup;

    /**
     * Starts heart-beating and flushing. {@code resident} walks this host's resident blocks
     * (namespace, hash) for a full advertisement. Redis need not be up yet.
     */
    public RedisBlockRegistry(Settings settings, String peerAddr, Consumer<BiConsumer<String, byte[]>> resident) {
        Supplier<Link> connect;
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
            connect = () -> link(c.connect(ByteArrayCodec.INSTANCE), c2 -> c2.async());
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
            connect = () -> link(c.connect(ByteArrayCodec.INSTANCE), c2 -> c2.async());
        }
        this.membership = new RegistryMembership(settings, peerAddr, connect);
        this.sender = new RedisUpdateSender(settings, membership);
        this.queue = new AdvertisementQueue(settings, sender, each -> resident.accept((ns, hash) -> each.accept(keys.key(ns, hash))),
                AdvertisementQueue.Clock.SYSTEM);
        this.lookup = new RegistryLookup(settings, membership, queue, keys);
        membership.start(queue);
        queue.start();
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
        return membership.index();
    }

    /** The lookup's probes: see {@link RegistryLookup#probes}. */
    static int[] probes(int count) {
        return RegistryLookup.probes(count);
    }

    // ------------------------------------------------------------ updates (never block)

    @Override
    public void advertise(String namespace, byte[] hash) {
        queue.enqueue(keys.key(namespace, hash), true);
    }

    @Override
    public void withdraw(String namespace, byte[] hash) {
        queue.enqueue(keys.key(namespace, hash), false);
    }

    @Override
    public void forget(String namespace, byte[] hash, Node node) {
        queue.forget(keys.key(namespace, hash), node.index());
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
        queue.flush(true);
    }

    // ------------------------------------------------------------ lookup and membership

    @Override
    public Owner lookup(String namespace, BlockHashes hashes, List<String> excluded) throws Exception {
        return lookup.lookup(namespace, hashes, excluded);
    }

    @Override
    public List<Node> liveNodes() {
        return membership.liveNodes();
    }

    @Override
    public boolean connected() {
        return membership.connected();
    }

    @Override
    public RegistryStats stats() {
        return new RegistryStats(sender.advertised(), sender.withdrawn(), queue.dropped(), membership.errors(), lookup.lookups(),
                queue.resyncs());
    }

    @Override
    public void close() {
        if (queue.stopped()) {
            return;
        }
        try {
            queue.flush(false); // withdrawals of a clean stop reach Redis; a repair is not waited for
        } catch (Exception ignored) {
            // Redis is down: the key expiring says this host left
        }
        queue.stop();
        membership.stop();
        queue.join(2000);
        membership.leave(); // others stop choosing this host now
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
