package io.pegaflow.server.cluster;

import io.lettuce.core.KeyValue;
import io.lettuce.core.ScriptOutputType;
import io.pegaflow.server.cluster.BlockRegistry.Node;
import io.pegaflow.server.cluster.RedisBlockRegistry.Link;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Supplier;

/**
 * This host in the registry: the {@code pegaflow-registry-heartbeat} thread claims an index
 * ({@code SET pf:node:i NX PX ttl}), keeps its node key alive, reads the other hosts' node keys
 * and decides whether Redis is healthy. Opens the connections the others use; lookups and the
 * flusher read its state (volatile) and report their failures through {@link #failed}.
 */
final class RegistryMembership {
    private static final System.Logger LOG = System.getLogger(RedisBlockRegistry.class.getName());
    private static final String HEARTBEAT = """
            local v = redis.call('GET', KEYS[1])
            if v and string.sub(v, 1, 36) ~= ARGV[1] then return 0 end
            redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
            if v then return 1 end
            return 2""";

    private final RedisBlockRegistry.Settings settings;
    private final String nodeId = UUID.randomUUID().toString();
    private final String peerAddr;
    private final Supplier<Link> connect;
    private final ScheduledExecutorService beat;
    private AdvertisementQueue queue;

    private volatile Link pipe; // the flusher's, flushed by hand
    private volatile Link ask;  // lookups and heartbeats
    private volatile int index = -1;
    private volatile boolean healthy;
    private volatile boolean downLogged;
    private volatile List<Node> live = List.of();
    private volatile boolean closed;
    private final AtomicLong errors = new AtomicLong();

    RegistryMembership(RedisBlockRegistry.Settings settings, String peerAddr, Supplier<Link> connect) {
        this.settings = settings;
        this.peerAddr = peerAddr;
        this.connect = connect;
        ScheduledThreadPoolExecutor s = new ScheduledThreadPoolExecutor(1, r -> {
            Thread t = new Thread(r, "pegaflow-registry-heartbeat");
            t.setDaemon(true);
            return t;
        });
        s.setRemoveOnCancelPolicy(true);
        this.beat = s;
    }

    /** Starts heart-beating; {@code queue} is told when a full re-advertisement is wanted and when Redis answers again. */
    void start(AdvertisementQueue queue) {
        this.queue = queue;
        beat.scheduleWithFixedDelay(this::heartbeatQuietly, 0, settings.heartbeat().toMillis(), TimeUnit.MILLISECONDS);
    }

    /** This host's index in the registry, or -1 before it claimed one. */
    int index() {
        return index;
    }

    /** Whether Redis answered the last heartbeat. */
    boolean connected() {
        return healthy;
    }

    /** The connection of lookups and heartbeats; null before the first heartbeat. */
    Link ask() {
        return ask;
    }

    /** The flusher's connection (commands flushed by hand); null before the first heartbeat. */
    Link pipe() {
        return pipe;
    }

    /** Other hosts as last read, stale ones included. */
    List<Node> live() {
        return live;
    }

    /** Other hosts whose heartbeat is within {@code staleAfter} of now. */
    List<Node> liveNodes() {
        long now = System.currentTimeMillis();
        return live.stream().filter(n -> fresh(n, now)).toList();
    }

    /** Whether {@code n}'s heartbeat is neither older nor newer (a wrong clock) than {@code staleAfter}. */
    boolean fresh(Node n, long nowMillis) {
        long stale = settings.staleAfter().toMillis();
        return nowMillis - n.heartbeatMillis() <= stale && n.heartbeatMillis() - nowMillis <= stale;
    }

    long errors() {
        return errors.get();
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
            Long r = cmd.lua().<Long>eval(HEARTBEAT, ScriptOutputType.INTEGER, new byte[][] {RegistryKeys.nodeKey(index)},
                    nodeId.getBytes(StandardCharsets.US_ASCII), value, ttl).get(ms, TimeUnit.MILLISECONDS);
            if (r == 0) {
                LOG.log(System.Logger.Level.WARNING, "registry: index " + index + " was taken over (this host missed its heartbeats); claiming another");
                index = -1;
            } else if (r == 2 || !wasHealthy) {
                queue.repairWanted(); // Redis lost this host's key (restarted empty) or was unreachable
            }
        }
        if (index < 0) {
            claim(cmd, ttl, ms);
            queue.repairWanted();
        }
        refreshLive(cmd, ms);
        healthy = true;
        if (!wasHealthy) {
            queue.redisAnswers(); // the re-advertisement wanted above can run now
        }
        if (downLogged) {
            downLogged = false;
            LOG.log(System.Logger.Level.INFO, "registry: Redis answers again at " + RedisBlockRegistry.redacted(settings.url())
                    + "; node index " + index);
        }
    }

    private void claim(Link cmd, byte[] ttl, long ms) throws Exception {
        List<KeyValue<byte[], byte[]>> taken = cmd.str().mget(RegistryKeys.allNodeKeys(settings.maxNodes())).get(ms, TimeUnit.MILLISECONDS);
        for (int i = 0; i < settings.maxNodes(); i++) {
            if (taken.get(i).hasValue()) {
                continue;
            }
            byte[] value = (nodeId + " " + peerAddr + " " + System.currentTimeMillis()).getBytes(StandardCharsets.UTF_8);
            String ok = cmd.str().set(RegistryKeys.nodeKey(i), value, io.lettuce.core.SetArgs.Builder.nx().px(Long.parseLong(new String(ttl,
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
        List<KeyValue<byte[], byte[]>> nodes = cmd.str().mget(RegistryKeys.allNodeKeys(settings.maxNodes())).get(ms, TimeUnit.MILLISECONDS);
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

    /** A heartbeat or a send failed: counted, Redis unhealthy until a heartbeat answers, logged once per outage. */
    void failed(String what, Exception e) {
        errors.incrementAndGet();
        healthy = false;
        if (!downLogged) {
            downLogged = true;
            LOG.log(System.Logger.Level.WARNING, "registry: " + what + " failed at " + RedisBlockRegistry.redacted(settings.url()) + " (" + e
                    + "); this host works alone until Redis answers (logged once)");
        }
    }

    // ------------------------------------------------------------ leaving

    /** Stops heart-beating (a heartbeat under way may still finish). */
    void stop() {
        closed = true;
        beat.shutdownNow();
    }

    /** Deletes this host's node key while Redis is healthy: other hosts stop choosing it now. */
    void leave() {
        Link a = ask;
        int me = index;
        if (a != null && me >= 0 && healthy) {
            try {
                a.key().del(RegistryKeys.nodeKey(me)).get(500, TimeUnit.MILLISECONDS);
            } catch (Exception ignored) {
                // the key expires by itself
            }
        }
    }
}
