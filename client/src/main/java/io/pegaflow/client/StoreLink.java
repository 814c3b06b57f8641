package io.pegaflow.client;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.EngineSource;
import io.pegaflow.engine.EngineStats;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.PegaEngine;
import io.pegaflow.engine.PegaflowException;
import io.pegaflow.engine.RegistrationIncompleteException;
import io.pegaflow.engine.ServerUnavailableException;
import io.pegaflow.engine.UnknownInstanceException;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.cuda.CudaOptions;
import io.pegaflow.engine.cuda.CudaTransferEngine;
import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.ssd.SsdConfig;
import io.pegaflow.engine.transfer.HostTransferEngine;
import io.pegaflow.engine.transfer.TransferEngine;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Locale;
import java.util.Set;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;
import java.util.function.LongSupplier;

/**
 * The store as one vLLM process sees it: an embedded engine, or a client of pegaflow-server
 * that survives the server going away. One link per process and settings, shared by the
 * scheduler-side and worker-side brains living there, which read the current engine through
 * {@link #binding()} at each call (it is an {@link EngineSource}).
 *
 * <p>The link owns the mode, the engine or client, and every registration made through it,
 * and in server mode checks the server every health interval ({@link #tick}):
 * <ul>
 *   <li>unreachable (refused, or slower than the deadline at {@link #MISSES_TO_DETACH} checks in a
 *       row): <em>detached</em>: the binding has no
 *       engine, so lookups miss at once and loads fail fast (vLLM recomputes); the client is
 *       kept;</li>
 *   <li>answering again with the same server id: the kept client is bound again, same
 *       generation (leases it issued are still valid);</li>
 *   <li>answering with a new server id (restarted): a new client maps the new pool, every
 *       recorded registration is replayed on it, and the generation moves on; the old client
 *       is closed once its copies finish. A stale client never touches a new pool;</li>
 *   <li>answering, same id, but without one of this process's instances (the server dropped
 *       it, e.g. after a session timeout): the instance's workers are registered again.</li>
 * </ul>
 *
 * <p>Threading: every method may be called from any thread; state changes under one lock,
 * the binding is published through a volatile field. In production a daemon thread ticks
 * (see {@link #startTicking}); tests call {@link #tick} with their own clock.
 */
public final class StoreLink implements EngineSource, AutoCloseable {
    private static final System.Logger LOG = System.getLogger("pegaflow.connector");

    /** Resolved mode. */
    public enum Mode {
        EMBEDDED,
        SERVER;

        public String text() {
            return name().toLowerCase(Locale.ROOT);
        }
    }

    /**
     * The link's settings. {@code mode}: {@code embedded} or {@code server} (the connector
     * resolves its {@code auto} setting first, in one place: {@code _private.resolve_mode}).
     * {@code joinSecret}: what the link's server client presents (null: none), so that the
     * processes of one vLLM instance (its TP ranks and its scheduler) act for the instances
     * any of them registers ({@link RemoteStore}, Identity).
     */
    public record Settings(String mode, String endpoint, String poolSize, int copyThreads, long deadlineMs,
            Duration healthInterval, SsdConfig ssd, byte[] joinSecret) {
        /** Without an SSD tier. */
        public Settings(String mode, String endpoint, String poolSize, int copyThreads, long deadlineMs,
                Duration healthInterval) {
            this(mode, endpoint, poolSize, copyThreads, deadlineMs, healthInterval, null);
        }

        /** Presenting no join secret. */
        public Settings(String mode, String endpoint, String poolSize, int copyThreads, long deadlineMs,
                Duration healthInterval, SsdConfig ssd) {
            this(mode, endpoint, poolSize, copyThreads, deadlineMs, healthInterval, ssd, null);
        }

        public Settings {
            if (!List.of("embedded", "server").contains(mode)) {
                throw new InvalidArgumentException("mode '" + mode + "'; expected embedded or server (the connector decides "
                        + "'auto' before it opens a link: pegaflow.connector._private.resolve_mode)");
            }
            Wire.hostPort(endpoint, "endpoint");
            if (copyThreads < 1 || copyThreads > 64) {
                throw new InvalidArgumentException("copy_threads " + copyThreads + "; expected 1..64");
            }
            if (deadlineMs < 1) {
                throw new InvalidArgumentException("deadline_ms " + deadlineMs + "; expected >= 1");
            }
            if (healthInterval == null || healthInterval.isNegative()) {
                throw new InvalidArgumentException("health interval " + healthInterval + "; expected >= 0");
            }
        }
    }

    /** How a worker's copies are made: host memcpy, or CUDA on {@code device}. */
    public record Copier(boolean cuda, int device) {
        public static final Copier HOST = new Copier(false, 0);

        Function<HostPool, TransferEngine> factory(int threads) {
            return cuda ? pool -> CudaTransferEngine.create(pool, CudaOptions.defaults().withDevice(device))
                    : pool -> new HostTransferEngine(pool, threads);
        }

        @Override
        public String toString() {
            return cuda ? "cuda:" + device : "host";
        }
    }

    /** Opens a client of the server at an endpoint (tests pass one over grpc-java's in-process transport). */
    @FunctionalInterface
    public interface Connector {
        EngineClient.Connection open(String endpoint, Function<HostPool, TransferEngine> transfer, long deadlineMs);
    }

    /** A worker registered through this link: replayed on every new server. */
    private record Registration(InstanceSpec instance, WorkerSpec worker) {}

    private final Settings settings;
    private final Mode mode;
    private final Connector connector;
    private final LongSupplier clock;
    private final Object lock = new Object();
    private volatile Binding binding = Binding.NONE;
    // --- guarded by lock ---
    private PegaEngine engine; // the embedded engine or the kept client (also while detached)
    private Copier copier = Copier.HOST;
    private String serverId = "";
    private boolean detached;
    private long generation;
    private final List<Registration> registrations = new ArrayList<>();
    private long nextCheck;
    private boolean downLogged;
    /** Health checks of the bound server that missed their deadline in a row (it detaches at {@link #MISSES_TO_DETACH}). */
    private int misses;
    /**
     * Health checks in a row that must run past their deadline before a bound link detaches:
     * under load (a busy host, a slow server) one late answer is the store slowing down, not
     * gone, and the link keeps serving through it. A check refused at once (nothing listens)
     * detaches at the first miss, as before.
     */
    static final int MISSES_TO_DETACH = 2;
    private boolean closed;
    // --- end guarded ---
    private ScheduledExecutorService ticker;

    private StoreLink(Settings settings, Mode mode, Connector connector, LongSupplier clock) {
        this.settings = settings;
        this.mode = mode;
        this.connector = connector;
        this.clock = clock;
    }

    /**
     * A link for {@code settings}. In server mode an absent server is not an error: the link
     * starts detached and keeps trying at every tick.
     */
    public static StoreLink open(Settings settings, Connector connector, LongSupplier nanoClock) {
        Mode mode = settings.mode().equals("embedded") ? Mode.EMBEDDED : Mode.SERVER;
        StoreLink link = new StoreLink(settings, mode, connector, nanoClock);
        if (mode == Mode.SERVER) {
            synchronized (link.lock) {
                EngineClient.Connection c = link.tryConnect(true);
                if (c != null) {
                    link.replace(c);
                }
            }
        }
        return link;
    }

    /** {@link #open} with the real client and clock, ticking on a daemon thread in server mode. */
    public static StoreLink open(Settings settings) {
        // A lambda, not a method reference: gRPC's classes load only when a server is asked for,
        // so an embedded link runs from a jar without them (the GPU bundle's slim jar).
        StoreLink link = open(settings, (endpoint, transfer, deadlineMs) -> EngineClient.open(endpoint, transfer, deadlineMs,
                settings.joinSecret()), System::nanoTime);
        link.startTicking();
        return link;
    }

    /** Server mode: a daemon thread calls {@link #tick} every health interval. */
    public void startTicking() {
        if (mode != Mode.SERVER || settings.healthInterval().isZero()) {
            return;
        }
        synchronized (lock) {
            if (ticker != null || closed) {
                return;
            }
            ticker = Executors.newSingleThreadScheduledExecutor(r -> {
                Thread t = new Thread(r, "pegaflow-link");
                t.setDaemon(true);
                return t;
            });
            long every = settings.healthInterval().toNanos();
            ticker.scheduleWithFixedDelay(() -> {
                try {
                    tick(clock.getAsLong());
                } catch (RuntimeException e) {
                    LOG.log(System.Logger.Level.WARNING, "pegaflow link check failed: " + e);
                }
            }, every, every, TimeUnit.NANOSECONDS);
        }
    }

    public Mode mode() {
        return mode;
    }

    public Settings settings() {
        return settings;
    }

    @Override
    public Binding binding() {
        return binding;
    }

    /** Whether an engine is bound now. */
    public boolean hasEngine() {
        return binding.engine() != null;
    }

    /** A snapshot for logs and tests. */
    public record Status(Mode mode, long generation, boolean detached, boolean engine, String serverId,
            int registrations) {}

    public Status status() {
        synchronized (lock) {
            return new Status(mode, generation, detached, engine != null, serverId, registrations.size());
        }
    }

    /** The bound engine's counters (the server's, in server mode). */
    public EngineStats stats() {
        return bound().stats();
    }

    /** vLLM's reset_cache for {@code instanceId} on the bound store ({@link io.pegaflow.engine.BlockStore#resetCache}). */
    public io.pegaflow.engine.store.LocalStore.Cleared resetCache(String instanceId) {
        return bound().resetCache(instanceId);
    }

    /** The bound store's block events of {@code instanceId}'s namespace ({@link io.pegaflow.engine.BlockStore#kvEvents}). */
    public io.pegaflow.engine.store.KvEventLog.Batch kvEvents(String instanceId, long after, int max) {
        return bound().kvEvents(instanceId, after, max);
    }

    /** A request's retention hint "low" on the bound store ({@link io.pegaflow.engine.BlockStore#demote}). */
    public int demote(String instanceId, io.pegaflow.engine.BlockHashes hashes) {
        return bound().demote(instanceId, hashes);
    }

    private PegaEngine bound() {
        PegaEngine e = binding.engine();
        if (e == null) {
            throw new ServerUnavailableException("no store bound: the link to " + settings.endpoint()
                    + " is detached or not connected yet", null);
        }
        return e;
    }

    // ---------------------------------------------------------------- registration

    /**
     * Registers a worker (its instance, then its regions) now when an engine is there, and
     * again on every new server. The first worker decides the copier: an embedded engine is
     * created for it; a worker needing another copier re-opens the client (server mode) or is
     * refused (embedded: one device per process). Bad geometry is an error now; an absent
     * server is not (the registration is replayed when it answers).
     */
    public void registerWorker(InstanceSpec instance, WorkerSpec worker, Copier workerCopier) {
        if (instance == null || worker == null || workerCopier == null) {
            throw new InvalidArgumentException("registerWorker: instance, worker and copier must not be null");
        }
        synchronized (lock) {
            checkOpen();
            useCopier(workerCopier);
            Registration r = new Registration(instance, worker);
            registrations.add(r);
            PegaEngine e = binding.engine();
            if (e == null) {
                return;
            }
            try {
                register(e, r);
            } catch (ServerUnavailableException down) {
                detach();
            } catch (RuntimeException refused) {
                registrations.remove(r);
                throw refused;
            }
        }
    }

    /** Forgets the instance's registrations and unregisters it from the store (quietly). */
    public void unregisterInstance(String instanceId) {
        synchronized (lock) {
            registrations.removeIf(r -> r.instance.instanceId().equals(instanceId));
            PegaEngine e = binding.engine();
            if (e != null) {
                try {
                    e.unregisterInstance(instanceId);
                } catch (PegaflowException ex) {
                    LOG.log(System.Logger.Level.DEBUG, "unregistering " + instanceId + ": " + ex.getMessage());
                }
            }
        }
    }

    private static void register(PegaEngine e, Registration r) {
        e.registerInstance(r.instance);
        e.registerWorker(r.instance.instanceId(), r.worker);
    }

    private void useCopier(Copier wanted) {
        if (engine != null && !copier.equals(wanted)) {
            if (mode == Mode.EMBEDDED) {
                throw new InvalidArgumentException("this process's embedded engine copies with " + copier
                        + " but a worker's KV cache needs " + wanted + "; expected one device per process");
            }
            copier = wanted;
            EngineClient.Connection c = tryConnect(false);
            if (c == null) {
                replaceWith(null, "");
            } else {
                replace(c);
            }
            return;
        }
        copier = wanted;
        if (engine == null) {
            if (mode == Mode.EMBEDDED) {
                EngineConfig config = EngineConfig.builder().poolSize(settings.poolSize()).copyThreads(settings.copyThreads())
                        .transfer(wanted.factory(settings.copyThreads())).ssd(settings.ssd()).build();
                engine = PegaEngine.create(config);
                generation++;
                binding = new Binding(engine, generation);
            } else {
                EngineClient.Connection c = tryConnect(false);
                if (c != null) {
                    replace(c);
                }
            }
        }
    }

    // ---------------------------------------------------------------- health

    /**
     * Server mode, at most once per health interval ({@code nowNanos} on the link's clock):
     * checks the server and moves between attached, detached and re-attached as the class
     * comment says. Cheap when not due.
     */
    public void tick(long nowNanos) {
        if (mode != Mode.SERVER) {
            return;
        }
        synchronized (lock) {
            if (closed || nowNanos < nextCheck) {
                return;
            }
            nextCheck = nowNanos + settings.healthInterval().toNanos();
            if (engine != null && !detached) {
                long t0 = System.nanoTime();
                try {
                    check(engine);
                    misses = 0;
                    return;
                } catch (ServerUnavailableException e) {
                    boolean late = System.nanoTime() - t0 >= TimeUnit.MILLISECONDS.toNanos(settings.deadlineMs()) / 2;
                    if (late && ++misses < MISSES_TO_DETACH) {
                        LOG.log(System.Logger.Level.INFO, "pegaflow-server at " + settings.endpoint() + " was slow to answer ("
                                + e.getMessage() + "); the cache stays on, checking again in " + settings.healthInterval());
                        return;
                    }
                    detach();
                } catch (PegaflowException e) {
                    LOG.log(System.Logger.Level.INFO, "pegaflow-server at " + settings.endpoint() + ": " + e.getMessage()
                            + "; checking whether it restarted");
                }
            }
            EngineClient.Connection c = tryConnect(false);
            if (c == null) {
                if (engine != null) {
                    detach();
                }
                return;
            }
            if (engine != null && c.serverId().equals(serverId)) {
                c.engine().close(); // the same server process: the kept client is still valid
                try {
                    check(engine);
                } catch (PegaflowException e) {
                    detach();
                    return;
                }
                if (detached) {
                    detached = false;
                    binding = new Binding(engine, generation);
                    LOG.log(System.Logger.Level.WARNING, "pegaflow-server at " + settings.endpoint()
                            + " answers again; cache re-enabled");
                    downLogged = false;
                }
                return;
            }
            replace(c); // a restarted server (or the first connection)
        }
    }

    /**
     * Under lock: the server answers for {@code e} and knows every instance registered
     * through this link; an instance it forgot is registered again (same client, same pool).
     */
    private void check(PegaEngine e) {
        Set<String> instances = new LinkedHashSet<>();
        registrations.forEach(r -> instances.add(r.instance.instanceId()));
        if (instances.isEmpty()) {
            e.stats();
            return;
        }
        for (String id : instances) {
            try {
                e.query(id, BlockHashes.EMPTY);
            } catch (RegistrationIncompleteException waiting) {
                // other workers of the instance (other processes) have not registered yet
            } catch (UnknownInstanceException forgotten) {
                LOG.log(System.Logger.Level.WARNING, "pegaflow-server at " + settings.endpoint() + " no longer knows instance '"
                        + id + "'; registering it again");
                for (Registration r : registrations) {
                    if (r.instance.instanceId().equals(id)) {
                        register(e, r);
                    }
                }
            }
        }
    }

    /** Under lock: a client of the server, or null (logged once) when it does not answer. */
    private EngineClient.Connection tryConnect(boolean logNow) {
        try {
            return connector.open(settings.endpoint(), copier.factory(settings.copyThreads()), settings.deadlineMs());
        } catch (ServerUnavailableException e) {
            if (!downLogged && (logNow || engine != null)) {
                LOG.log(System.Logger.Level.WARNING, "pegaflow-server at " + settings.endpoint() + " does not answer ("
                        + e.getMessage() + "); serving without the cache (recompute) until it does");
                downLogged = true;
            }
            return null;
        }
    }

    /** Under lock: registers every recorded worker on the new client, then binds it. */
    private void replace(EngineClient.Connection c) {
        PegaEngine next = c.engine();
        try {
            for (Registration r : registrations) {
                register(next, r);
            }
        } catch (ServerUnavailableException e) {
            next.close();
            next = null;
        } catch (PegaflowException e) {
            LOG.log(System.Logger.Level.ERROR, "pegaflow-server at " + settings.endpoint()
                    + " refused this process's registration (" + e.getMessage() + "); serving without the cache");
            next.close();
            next = null;
        }
        replaceWith(next, next == null ? "" : c.serverId());
    }

    /** Under lock: binds {@code next} under a new generation, then closes the old engine (its copies finish first). */
    private void replaceWith(PegaEngine next, String nextServerId) {
        PegaEngine old = engine;
        engine = next;
        serverId = nextServerId;
        detached = false;
        generation++;
        binding = next == null ? new Binding(null, generation) : new Binding(next, generation);
        if (old != null) {
            try {
                old.close();
            } catch (PegaflowException e) {
                LOG.log(System.Logger.Level.DEBUG, "closing the previous engine: " + e.getMessage());
            }
        }
        if (next != null && downLogged) {
            LOG.log(System.Logger.Level.WARNING, "pegaflow-server at " + settings.endpoint() + " answers again; cache re-enabled");
            downLogged = false;
        }
    }

    /**
     * Under lock: the server does not answer. Lookups miss at once and loads fail fast instead
     * of each waiting for its deadline; the client is kept for the same server's return.
     */
    private void detach() {
        misses = 0;
        if (!detached) {
            detached = true;
            binding = new Binding(null, generation);
            if (!downLogged) {
                LOG.log(System.Logger.Level.WARNING, "pegaflow-server at " + settings.endpoint()
                        + " does not answer; serving without the cache (recompute) until it does");
                downLogged = true;
            }
        }
    }

    private void checkOpen() {
        if (closed) {
            throw new io.pegaflow.engine.EngineClosedException("store link to " + settings.endpoint() + " is closed");
        }
    }

    /** Stops ticking and closes the engine or client (copies in flight finish first). */
    @Override
    public void close() {
        PegaEngine e;
        synchronized (lock) {
            if (closed) {
                return;
            }
            closed = true;
            if (ticker != null) {
                ticker.shutdownNow();
            }
            e = engine;
            engine = null;
            binding = Binding.NONE;
            registrations.clear();
        }
        if (e != null) {
            try {
                e.close();
            } catch (PegaflowException ex) {
                LOG.log(System.Logger.Level.DEBUG, "closing the engine: " + ex.getMessage());
            }
        }
    }
}
