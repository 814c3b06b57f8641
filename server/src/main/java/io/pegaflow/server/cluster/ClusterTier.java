package io.pegaflow.server.cluster;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.store.FetchReservation;
import io.pegaflow.engine.store.LocalStore;
import io.pegaflow.engine.store.RemoteTier;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Cross-node sharing for one {@link LocalStore} (docs/cluster.md): blocks that become resident
 * are advertised in the {@link BlockRegistry}, evicted ones withdrawn; a query that misses
 * locally starts a lookup of the longest prefix one other live host holds, and the fetch of
 * those blocks over the {@link PeerTransport} into this pool. Meanwhile the query answers
 * "not yet" (as for an SSD read back); fetched blocks are checked, sealed, served like local
 * ones and advertised. Any failure (registry down, peer gone, checksum wrong, deadline) makes
 * the blocks misses: vLLM recomputes them.
 */
public final class ClusterTier implements RemoteTier, AutoCloseable {
    private static final System.Logger LOG = System.getLogger(ClusterTier.class.getName());

    /**
     * {@code fetchDeadline}: how long a peer keeps blocks pinned for one fetch, and how long
     * the fetch may take; {@code negativeTtl}: how long "no other host holds it" is believed;
     * {@code suspectFor}: how long a host whose fetch failed is skipped.
     */
    public record Settings(Duration fetchDeadline, Duration negativeTtl, Duration suspectFor, int fetchThreads,
            int maxQueuedFetches, int maxRun) {
        public static final Settings DEFAULTS = new Settings(Duration.ofSeconds(30), Duration.ofMillis(200),
                Duration.ofSeconds(10), 4, 256, 8192);
    }

    private record Key(String namespace, ByteBuffer hash) {}

    private final LocalStore store;
    private final BlockRegistry registry;
    private final PeerTransport transport;
    private final Settings settings;
    private final ThreadPoolExecutor fetchers;
    private final Set<Key> inflight = ConcurrentHashMap.newKeySet();
    private final Map<Key, Long> negative = new ConcurrentHashMap<>();
    private final Map<String, Long> suspects = new ConcurrentHashMap<>();

    final AtomicLong lookups = new AtomicLong();
    final AtomicLong lookupErrors = new AtomicLong();
    final AtomicLong fetchedBlocks = new AtomicLong();
    final AtomicLong fetchedBytes = new AtomicLong();
    final AtomicLong fetchFailures = new AtomicLong();
    final AtomicLong rejected = new AtomicLong();
    /** Nanoseconds spent per phase of fetches, in {@link #PHASES} order. */
    private final AtomicLong[] phaseNanos = {new AtomicLong(), new AtomicLong(), new AtomicLong(), new AtomicLong(), new AtomicLong()};
    public static final List<String> PHASES = List.of("lookup", "pin", "reserve", "read", "complete");

    public ClusterTier(LocalStore store, BlockRegistry registry, PeerTransport transport, Settings settings) {
        this.store = store;
        this.registry = registry;
        this.transport = transport;
        this.settings = settings;
        this.fetchers = new ThreadPoolExecutor(settings.fetchThreads(), settings.fetchThreads(), 30, TimeUnit.SECONDS,
                new ArrayBlockingQueue<>(settings.maxQueuedFetches()), Thread.ofPlatform().daemon().name("pegaflow-peer-fetch-", 0).factory());
        fetchers.allowCoreThreadTimeOut(true);
    }

    public BlockRegistry registry() {
        return registry;
    }

    // ------------------------------------------------------------ RemoteTier (under the store's lock)

    @Override
    public boolean missed(String namespace, BlockHashes hashes, int from) {
        if (!registry.connected() || registry.liveNodes().isEmpty()) {
            return false; // alone: nothing to ask
        }
        int len = hashes.hashLen();
        Key key = new Key(namespace, ByteBuffer.wrap(Arrays.copyOfRange(hashes.packed(), from * len, (from + 1) * len)));
        if (inflight.contains(key)) {
            return true;
        }
        Long until = negative.get(key);
        long now = System.nanoTime();
        if (until != null) {
            if (until - now > 0) {
                return false;
            }
            negative.remove(key);
        }
        int run = Math.min(hashes.count() - from, settings.maxRun());
        BlockHashes wanted = hashes.slice(from, from + run);
        inflight.add(key);
        try {
            fetchers.execute(() -> fetch(key, namespace, wanted, from));
        } catch (RejectedExecutionException e) {
            inflight.remove(key);
            rejected.incrementAndGet();
            return false; // too many fetches queued: this one is a miss
        }
        return true;
    }

    @Override
    public void resident(String namespace, byte[] hash) {
        registry.advertise(namespace, hash);
    }

    @Override
    public void evicted(String namespace, byte[] hash) {
        registry.withdraw(namespace, hash);
    }

    /** The flush barrier: the registry's queued advertisements sent and answered. */
    @Override
    public void flush() throws Exception {
        registry.flush();
    }

    // ------------------------------------------------------------ the fetch (on a fetch thread)

    private void fetch(Key key, String namespace, BlockHashes wanted, int alreadyHit) {
        BlockRegistry.Node node = null;
        try {
            lookups.incrementAndGet();
            BlockRegistry.Owner owner;
            long t0 = System.nanoTime();
            try {
                owner = registry.lookup(namespace, wanted, suspected());
            } catch (Exception e) {
                lookupErrors.incrementAndGet();
                return;
            }
            long t1 = System.nanoTime();
            phaseNanos[0].addAndGet(t1 - t0);
            if (owner.blocks() == 0) {
                return;
            }
            node = owner.node();
            PeerTransport.RemotePin pin = transport.pin(node, namespace, wanted.slice(0, owner.blocks()), settings.fetchDeadline());
            long t2 = System.nanoTime();
            phaseNanos[1].addAndGet(t2 - t1);
            if (pin == null) {
                registry.forget(namespace, Arrays.copyOf(key.hash().array(), wanted.hashLen()), node); // it no longer holds it
                return;
            }
            boolean[] ok = null;
            FetchReservation into = null;
            try {
                into = store.reserveFetch(namespace, wanted.slice(0, pin.blocks()), alreadyHit, pin.slotBytes());
                long t3 = System.nanoTime();
                phaseNanos[2].addAndGet(t3 - t2);
                if (into == null) {
                    return;
                }
                inflight.remove(key); // the reserved blocks answer "not yet" from here on
                ok = new boolean[into.length()];
                transport.read(pin, into, ok);
                phaseNanos[3].addAndGet(System.nanoTime() - t3);
            } finally {
                if (into != null) {
                    long t4 = System.nanoTime();
                    long got = 0;
                    for (boolean b : ok) {
                        if (b) {
                            got++;
                        }
                    }
                    // believed before the failed blocks leave the index: a query polling meanwhile
                    // must not start the same fetch again
                    negative.put(key, System.nanoTime() + settings.negativeTtl().toNanos());
                    store.completeFetch(into, ok);
                    phaseNanos[4].addAndGet(System.nanoTime() - t4);
                    fetchedBlocks.addAndGet(got);
                    fetchedBytes.addAndGet(got * pin.blockBytes());
                }
                transport.release(pin);
            }
        } catch (IOException | RuntimeException e) {
            fetchFailures.incrementAndGet();
            if (node != null) {
                suspects.put(node.id(), System.nanoTime() + settings.suspectFor().toNanos());
                if (transport instanceof TcpPeerTransport t) {
                    t.forgetPeer(node.peerAddr());
                }
                LOG.log(System.Logger.Level.INFO, "peer fetch from node " + node.index() + " (" + node.peerAddr() + ") failed: "
                        + e.getMessage() + "; the blocks are misses, the host is skipped for " + settings.suspectFor().toSeconds() + " s");
            }
        } finally {
            negative.put(key, System.nanoTime() + settings.negativeTtl().toNanos());
            inflight.remove(key);
            if (negative.size() > 100_000) {
                long now = System.nanoTime();
                negative.values().removeIf(t -> t - now <= 0);
            }
        }
    }

    private List<String> suspected() {
        long now = System.nanoTime();
        suspects.values().removeIf(t -> t - now <= 0);
        return List.copyOf(suspects.keySet());
    }

    /** Counters for metrics and benchmarks. */
    public record Stats(java.util.function.LongSupplier lookups, java.util.function.LongSupplier lookupErrors,
            java.util.function.LongSupplier fetchedBlocks, java.util.function.LongSupplier fetchedBytes,
            java.util.function.LongSupplier fetchFailures, java.util.function.LongSupplier checksumFailures,
            java.util.function.LongSupplier rejected) {}

    public Stats statsView() {
        return new Stats(lookups::get, lookupErrors::get, fetchedBlocks::get, fetchedBytes::get, fetchFailures::get,
                transport::checksumFailures, rejected::get);
    }

    /** Seconds spent in {@code PHASES.get(i)} over every fetch so far. */
    public double phaseSeconds(int i) {
        return phaseNanos[i].get() / 1e9;
    }

    @Override
    public void close() {
        fetchers.shutdownNow();
        try {
            fetchers.awaitTermination(5, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        transport.close();
        registry.close();
    }
}
