package io.pegaflow.server;

import io.pegaflow.client.Version;
import io.pegaflow.client.Wire;

import io.grpc.Server;
import io.grpc.ServerBuilder;
import io.grpc.ServerInterceptors;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.store.LocalStore;
import io.pegaflow.engine.Sizes;
import io.pegaflow.engine.pool.HostPool;
import io.pegaflow.engine.pool.PoolFiles;
import io.pegaflow.engine.ssd.SsdConfig;
import io.pegaflow.client.proto.HealthResponse;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.file.Path;
import java.time.Duration;
import java.util.UUID;
import java.util.concurrent.TimeUnit;

/**
 * pegaflow-server: one {@link LocalStore} (the control plane every vLLM instance on the host
 * shares), the host pool as a shared-memory file that workers map and copy into themselves,
 * client sessions, and HTTP health and metrics. Build it over any {@link ServerBuilder} (tests
 * use the in-process transport); {@link #start(Config)} listens on TCP.
 */
public final class PegaflowServer implements AutoCloseable {
    /**
     * Settings, validated in one place. {@code poolGroup}: null for pool and socket files of
     * mode 0600, else the group they are given with mode 0660 ({@code --pool-group}).
     * {@code admission}, {@code eviction}: the pool's policies ({@code --admission}, {@code --eviction};
     * null: {@code all}, {@code lru}).
     */
    public record Config(String addr, String httpAddr, long poolBytes, Path poolPath, Duration leaseTtl,
            Duration sessionGrace, boolean prometheus, String poolGroup, Duration copyTtl, Path authTokenFile,
            int prefaultThreads, SsdConfig ssd, io.pegaflow.server.cluster.ClusterConfig cluster, Tenancy tenancy,
            String admission, String eviction, GrpcTls tls) {
        public Config {
            tenancy = tenancy == null ? Tenancy.DEFAULTS : tenancy;
            tls = tls == null ? GrpcTls.NONE : tls;
            admission = admission == null ? "all" : admission;
            eviction = eviction == null ? "lru" : eviction;
            EngineConfig.checkPolicies(admission, eviction);
            if (prefaultThreads < 0 || prefaultThreads > 256) {
                throw new InvalidArgumentException("--prefault-threads " + prefaultThreads + "; expected 0 (off) .. 256");
            }
            if (copyTtl == null || copyTtl.isNegative() || copyTtl.isZero()) {
                throw new InvalidArgumentException("copy TTL " + copyTtl + "; expected a positive duration");
            }
            Wire.hostPort(addr, "--addr");
            PoolFiles.group(poolGroup);
            if (httpAddr != null) {
                Wire.hostPort(httpAddr, "--http-addr");
            }
            if (leaseTtl == null || leaseTtl.isNegative() || leaseTtl.isZero()) {
                throw new InvalidArgumentException("lease TTL " + leaseTtl + "; expected a positive duration");
            }
            if (sessionGrace == null || sessionGrace.isNegative()) {
                throw new InvalidArgumentException("session grace " + sessionGrace + "; expected >= 0");
            }
        }

        /** With the default policies ({@code all}, {@code lru}). */
        public Config(String addr, String httpAddr, long poolBytes, Path poolPath, Duration leaseTtl,
                Duration sessionGrace, boolean prometheus, String poolGroup, Duration copyTtl, Path authTokenFile,
                int prefaultThreads, SsdConfig ssd, io.pegaflow.server.cluster.ClusterConfig cluster, Tenancy tenancy) {
            this(addr, httpAddr, poolBytes, poolPath, leaseTtl, sessionGrace, prometheus, poolGroup, copyTtl, authTokenFile,
                    prefaultThreads, ssd, cluster, tenancy, null, null, null);
        }

        /** The same settings with TLS on the gRPC port, or plaintext allowed beyond loopback ({@link GrpcTls}). */
        public Config withTls(GrpcTls tls) {
            return new Config(addr, httpAddr, poolBytes, poolPath, leaseTtl, sessionGrace, prometheus, poolGroup, copyTtl,
                    authTokenFile, prefaultThreads, ssd, cluster, tenancy, admission, eviction, tls);
        }

        /** The same settings with the pool's policies {@code admission} and {@code eviction}. */
        public Config withPolicies(String admission, String eviction) {
            return new Config(addr, httpAddr, poolBytes, poolPath, leaseTtl, sessionGrace, prometheus, poolGroup, copyTtl,
                    authTokenFile, prefaultThreads, ssd, cluster, tenancy, admission, eviction, tls);
        }

        /** With the default tenancy rules ({@link Tenancy#DEFAULTS}). */
        public Config(String addr, String httpAddr, long poolBytes, Path poolPath, Duration leaseTtl,
                Duration sessionGrace, boolean prometheus, String poolGroup, Duration copyTtl, Path authTokenFile,
                int prefaultThreads, SsdConfig ssd, io.pegaflow.server.cluster.ClusterConfig cluster) {
            this(addr, httpAddr, poolBytes, poolPath, leaseTtl, sessionGrace, prometheus, poolGroup, copyTtl, authTokenFile,
                    prefaultThreads, ssd, cluster, null);
        }

        /** The same settings with the tenancy rules {@code tenancy}. */
        public Config withTenancy(Tenancy tenancy) {
            return new Config(addr, httpAddr, poolBytes, poolPath, leaseTtl, sessionGrace, prometheus, poolGroup, copyTtl,
                    authTokenFile, prefaultThreads, ssd, cluster, tenancy, admission, eviction, tls);
        }

        /** Without cross-node sharing. */
        public Config(String addr, String httpAddr, long poolBytes, Path poolPath, Duration leaseTtl,
                Duration sessionGrace, boolean prometheus, String poolGroup, Duration copyTtl, Path authTokenFile,
                int prefaultThreads, SsdConfig ssd) {
            this(addr, httpAddr, poolBytes, poolPath, leaseTtl, sessionGrace, prometheus, poolGroup, copyTtl, authTokenFile,
                    prefaultThreads, ssd, null);
        }

        /** The same settings sharing blocks with other hosts as {@code cluster} says (null: alone). */
        public Config withCluster(io.pegaflow.server.cluster.ClusterConfig cluster) {
            return new Config(addr, httpAddr, poolBytes, poolPath, leaseTtl, sessionGrace, prometheus, poolGroup, copyTtl,
                    authTokenFile, prefaultThreads, ssd, cluster, tenancy, admission, eviction, tls);
        }

        /** Without an SSD tier. */
        public Config(String addr, String httpAddr, long poolBytes, Path poolPath, Duration leaseTtl,
                Duration sessionGrace, boolean prometheus, String poolGroup, Duration copyTtl, Path authTokenFile,
                int prefaultThreads) {
            this(addr, httpAddr, poolBytes, poolPath, leaseTtl, sessionGrace, prometheus, poolGroup, copyTtl, authTokenFile,
                    prefaultThreads, null);
        }

        /** The same settings with the SSD tier {@code ssd} (null: none). */
        public Config withSsd(SsdConfig ssd) {
            return new Config(addr, httpAddr, poolBytes, poolPath, leaseTtl, sessionGrace, prometheus, poolGroup, copyTtl,
                    authTokenFile, prefaultThreads, ssd, cluster, tenancy, admission, eviction, tls);
        }

        /** Pages of the pool committed as written (no pre-faulting at start). */
        public Config(String addr, String httpAddr, long poolBytes, Path poolPath, Duration leaseTtl,
                Duration sessionGrace, boolean prometheus, String poolGroup, Duration copyTtl, Path authTokenFile) {
            this(addr, httpAddr, poolBytes, poolPath, leaseTtl, sessionGrace, prometheus, poolGroup, copyTtl, authTokenFile, 0);
        }

        /** Without a pool group (the files are this user's alone, 0600), copy TTL 3 minutes, a generated token. */
        public Config(String addr, String httpAddr, long poolBytes, Path poolPath, Duration leaseTtl,
                Duration sessionGrace, boolean prometheus) {
            this(addr, httpAddr, poolBytes, poolPath, leaseTtl, sessionGrace, prometheus, null);
        }

        /** With a pool group, copy TTL 3 minutes, a generated token. */
        public Config(String addr, String httpAddr, long poolBytes, Path poolPath, Duration leaseTtl,
                Duration sessionGrace, boolean prometheus, String poolGroup) {
            this(addr, httpAddr, poolBytes, poolPath, leaseTtl, sessionGrace, prometheus, poolGroup, Duration.ofMinutes(3), null);
        }

        public static Config defaults(long poolBytes, Path poolPath) {
            return new Config("127.0.0.1:50055", "127.0.0.1:9091", poolBytes, poolPath, Duration.ofSeconds(600),
                    Duration.ofSeconds(2), true);
        }
    }

    private final Config config;
    private final PoolFiles files;
    private final HostPool pool;
    private final LocalStore store;
    private final Sessions sessions;
    private final Tenants tenants;
    private final CallQuota calls;
    private final CallQuota connections;
    private final Credentials credentials;
    private final PrometheusRegistry registry = new PrometheusRegistry();
    private final Rejections rejections = new Rejections();
    /** Calls that may wait on Redis (Flush) run here, off gRPC's transport threads. */
    private final java.util.concurrent.ExecutorService waiting = EngineService.waitingPool();
    private final Server grpc;
    private final HttpEndpoints http;
    private volatile LocalSocketServer local;
    private final RpcMetrics rpcMetrics;
    private final io.pegaflow.server.cluster.ClusterConfig.Cluster cluster;
    private final String serverId = UUID.randomUUID().toString();
    private volatile boolean serving;

    private PegaflowServer(Config config, ServerBuilder<?> builder) throws IOException {
        this.config = config;
        // The lock comes before any file is created or deleted; a refused start changes nothing.
        this.files = PoolFiles.claim(config.poolPath(), config.poolGroup(), config.addr());
        HostPool created = null;
        Sessions sessionsStarted = null;
        Credentials credentialsLoaded = null;
        LocalStore storeMade = null;
        Server grpcStarted = null;
        io.pegaflow.server.cluster.ClusterConfig.Cluster clusterStarted = null;
        try {
            this.pool = created = files.createPool(config.poolBytes());
            HostPool.Pages pages = HostPool.Pages.of(pool.file());
            // CUDA workers pin the pool per page, several times faster on huge pages than on
            // 4 KiB ones (docs/gpu.md, "Pool attach"), so say which ones it got.
            System.getLogger(PegaflowServer.class.getName()).log(System.Logger.Level.INFO, "pool: "
                    + io.pegaflow.engine.Sizes.format(pool.size()) + " on " + pages.describe()
                    + (pages.hugeBytes() == 0 && pool.size() >= (16L << 30)
                            ? "; GPU workers pin it at ~0.12 s per GiB, a pool on a huge-page mount (tmpfs huge=always or"
                                    + " hugetlbfs) at ~0.03 s per GiB (docs/gpu.md)"
                            : ""));
            if (config.prefaultThreads() > 0) {
                // Commits the shared pool's pages once, here, on several threads: a worker's
                // pinning then only locks pages that exist (docs/gpu.md, pool attach).
                long nanos = pool.prefault(config.prefaultThreads());
                System.getLogger(PegaflowServer.class.getName()).log(System.Logger.Level.INFO,
                        "pre-faulted the pool (" + io.pegaflow.engine.Sizes.format(pool.size()) + ") on "
                                + config.prefaultThreads() + " threads in " + nanos / 1_000_000 + " ms");
            }
            EngineConfig engine = EngineConfig.builder().poolBytes(pool.size()).leaseTtl(config.leaseTtl())
                    .admission(config.admission()).eviction(config.eviction())
                    .quotas(config.tenancy().quotas())
                    .copyTtl(config.copyTtl())
                    // swept often enough that an abandoned copy is rolled back within ~1.25 copy TTLs
                    .sweepInterval(java.time.Duration.ofMillis(Math.min(30_000, Math.max(100, config.copyTtl().toMillis() / 4))))
                    .metrics(new PrometheusSink(registry)).build();
            this.store = storeMade = new LocalStore(engine, pool.size());
            if (config.ssd() != null) {
                // The server maps the pool too: the tier writes sealed blocks from it and reads them back into it.
                store.attachSsd(config.ssd(), pool.segment());
            }
            this.cluster = clusterStarted = config.cluster() == null ? null : config.cluster().start(store, pool.segment(), pool.file());
            if (cluster != null) {
                ClusterMetrics.register(registry, cluster.tier(), cluster.server());
            }
            this.credentials = credentialsLoaded = Credentials.load(config.authTokenFile(), config.poolPath(),
                    config.poolGroup() == null ? null : PoolFiles.group(config.poolGroup()), config.tenancy().operatorTokenFile());
            rejections.register(registry);
            credentials.rejections(rejections);
            Tenancy tenancy = config.tenancy();
            this.tenants = new Tenants(tenancy.maxInstances(), tenancy.maxInstancesPerTenant());
            this.sessions = sessionsStarted = new Sessions(store, tenants, config.sessionGrace(), tenancy.unsessionedTtl());
            this.calls = new CallQuota(tenancy.maxCallsPerTenant());
            this.connections = new CallQuota(tenancy.maxCallsPerTenant()); // the local socket's, apart: idle ones are pooled
            TenantMetrics.register(registry, tenants, store, calls);
            CeilingMetrics.register(registry, store.distinctBlocks(), store::clockNanos);
            EngineService service = new EngineService(store, sessions, tenants, this::health, this::close, waiting);
            this.rpcMetrics = new RpcMetrics(registry);
            // the JVM's own: heap, threads, GC, and the JIT's compile time (a fresh server compiles
            // beside its first operations; docs/cluster.md)
            io.prometheus.metrics.instrumentation.jvm.JvmMetrics.builder().register(registry);
            // The largest request the engine's caps allow; a larger one is refused with
            // RESOURCE_EXHAUSTED before it is parsed, and only that call fails. Credentials
            // run first: a refused call is counted nowhere and touches nothing.
            this.grpc = grpcStarted = builder.maxInboundMessageSize(Wire.MAX_REQUEST_BYTES)
                    .addService(MalformedRequests.guard(ServerInterceptors.intercept(service, calls, rpcMetrics, credentials),
                            rejections)).build().start();
            this.http = config.httpAddr() == null ? null : new HttpEndpoints(Wire.hostPort(config.httpAddr(), "--http-addr"),
                    config.prometheus() ? registry : new PrometheusRegistry(), () -> serving, this::healthJson,
                    store::instanceIds, credentials::matches, new AdminEndpoints(store, tenants, credentials, rejections, registry));
            files.update(grpcAddr()); // the port is known now; a refused second server names it
        } catch (IOException | RuntimeException e) {
            // Undo what this start did, and only that: its own pool file, then its lock.
            if (grpcStarted != null) {
                grpcStarted.shutdownNow();
            }
            waiting.shutdownNow();
            if (sessionsStarted != null) {
                sessionsStarted.close();
            }
            if (clusterStarted != null) {
                clusterStarted.close();
            }
            if (credentialsLoaded != null) {
                credentialsLoaded.close(); // a refused start leaves only what it found
            }
            if (storeMade != null) {
                storeMade.close(); // stops the SSD tier's threads before the pool goes
            }
            if (created != null) {
                created.close();
            }
            files.close();
            throw e;
        }
        serving = true;
    }

    /**
     * Listens on {@code config.addr()} (TCP, plaintext; loopback unless told otherwise) and on
     * a Unix socket next to the pool file ({@code <pool>.sock}) for co-located clients' hot calls.
     * The pool, the socket and {@code <pool>.lock} are {@link PoolFiles}: created exclusively,
     * 0600 (0660 with a pool group), guarded by a lock held until {@link #close()}; a pool held
     * by a live server is refused ({@link io.pegaflow.engine.PoolInUseException}), a stale one
     * reclaimed.
     */
    public static PegaflowServer start(Config config) throws IOException {
        return start(config, true);
    }

    /** As {@link #start(Config)}; {@code localSocket} false leaves the Unix socket off. */
    public static PegaflowServer start(Config config, boolean localSocket) throws IOException {
        return start(config, localSocket, 0);
    }

    /**
     * As {@link #start(Config, boolean)}, the local socket's threads spinning up to
     * {@code busyPollMicros} for a client's next frame before they sleep (0: off).
     */
    public static PegaflowServer start(Config config, boolean localSocket, long busyPollMicros) throws IOException {
        if (busyPollMicros < 0 || busyPollMicros > 1_000_000) {
            throw new InvalidArgumentException("--busy-poll-us " + busyPollMicros + "; expected 0 (off) .. 1000000");
        }
        PegaflowServer s = startTcp(config);
        if (localSocket) {
            try {
                s.local = LocalSocketServer.start(s.files, s.store, s.tenants, s.rpcMetrics, s.credentials,
                        s.rejections, s.connections);
                s.local.busyPoll(busyPollMicros);
            } catch (IOException | RuntimeException e) {
                System.getLogger(PegaflowServer.class.getName()).log(System.Logger.Level.WARNING,
                        "no local socket at " + s.files.socket() + " (" + e + "); clients use gRPC for every call");
            }
        }
        return s;
    }

    private static PegaflowServer startTcp(Config config) throws IOException {
        // Handlers run on the transport's threads: every engine call but Flush is short and never
        // waits on I/O or copies, and skipping the hop to an executor removes thread handoffs from
        // every call (docs/server.md, "Why a local socket next to gRPC"). Flush, which may wait on
        // Redis, hands itself to EngineService.waitingPool().
        InetSocketAddress at = Wire.hostPort(config.addr(), "--addr");
        config.tls().check(at, config.addr());
        NettyServerBuilder builder = (config.tls().enabled()
                ? NettyServerBuilder.forAddress(at, io.grpc.TlsServerCredentials.create(config.tls().cert().toFile(),
                        config.tls().key().toFile()))
                : NettyServerBuilder.forAddress(at))
                .directExecutor()
                .keepAliveTime(30, TimeUnit.SECONDS)
                .keepAliveTimeout(20, TimeUnit.SECONDS)
                .permitKeepAliveTime(5, TimeUnit.SECONDS)
                .permitKeepAliveWithoutCalls(true);
        return new PegaflowServer(config, builder);
    }

    /** Over a caller's builder (in-process transport in tests). */
    public static PegaflowServer start(Config config, ServerBuilder<?> builder) throws IOException {
        return new PegaflowServer(config, builder);
    }

    HealthResponse health() {
        LocalSocketServer l = local;
        return HealthResponse.newBuilder().setServerVersion(Version.VERSION).setPoolPath(pool.file().toString())
                .setPoolBytes(pool.size()).setServerId(serverId).setInstances(store.instanceIds().size())
                .setLocalSocket(l == null ? "" : l.path().toString()).setTokenPath(credentials.tokenFile().toString())
                .setBusyPollUs(l == null ? 0 : l.busyPollMicros()).build();
    }

    private String healthJson() {
        return "{\"status\":\"" + (serving ? "serving" : "stopping") + "\",\"version\":\"" + Version.VERSION
                + "\",\"server_id\":\"" + serverId + "\",\"instances\":" + store.instanceIds().size()
                + ",\"pool_bytes\":" + pool.size() + ",\"pool_path\":" + HttpEndpoints.quote(pool.file().toString())
                + (store.ssd() == null ? "" : ",\"ssd_blocks\":" + store.ssd().blocks() + ",\"ssd_bytes\":" + store.ssd().bytes())
                + (cluster == null ? "" : ",\"cluster\":{\"node\":" + ((io.pegaflow.server.cluster.RedisBlockRegistry) cluster.tier().registry()).index()
                        + ",\"peer_addr\":" + HttpEndpoints.quote(cluster.peerAddr())
                        + ",\"registry_connected\":" + cluster.tier().registry().connected()
                        + ",\"live_peers\":" + cluster.tier().registry().liveNodes().size()
                        + ",\"transfer_pins\":" + store.transferPins() + "}") + "}";
    }

    public int port() {
        return grpc.getPort();
    }

    public int httpPort() {
        return http == null ? -1 : http.port();
    }

    public Path poolPath() {
        return pool.file();
    }

    /** The file holding the operator's secret: {@code --operator-token-file}, or the one this server wrote. */
    public Path operatorTokenFile() {
        return credentials.operatorFile();
    }

    /** The file holding the tenants' secret (mode 0600, or 0640 with the pool group). */
    public Path tokenFile() {
        return credentials.tokenFile();
    }

    /** Cross-node sharing, or null when this host works alone. */
    public io.pegaflow.server.cluster.ClusterConfig.Cluster cluster() {
        return cluster;
    }

    public LocalStore store() {
        return store;
    }

    /** The calls' metrics, gRPC and local socket ({@link Warmup} counts its scratch server's). */
    RpcMetrics rpcMetrics() {
        return rpcMetrics;
    }

    /** The local socket server, or null when there is none (tests). */
    LocalSocketServer localSocket() {
        return local;
    }

    /** Instances unregistered because their client's session ended. */
    public long sessionsCleaned() {
        return sessions.cleaned();
    }

    /** {@code host:port} gRPC listens on ({@code --addr} with the bound port; as configured in-process). */
    public String grpcAddr() {
        return port() > 0 ? config.addr().replaceAll(":\\d+$", ":" + port()) : config.addr();
    }

    public String describe() {
        return "grpc=" + grpcAddr() + " http="
                + (http == null ? "off" : config.httpAddr().replaceAll(":\\d+$", ":" + httpPort()))
                + " pool=" + pool.file() + " (" + Sizes.format(pool.size()) + ")"
                + (local == null ? "" : " local=" + local.path());
    }

    public void awaitTermination() throws InterruptedException {
        grpc.awaitTermination();
    }

    /**
     * Stops serving, then closes sessions, the store, the socket and the pool (deleting their
     * files), and last releases the lock (deleting its file).
     */
    @Override
    public synchronized void close() {
        if (!serving && grpc.isShutdown()) {
            return;
        }
        try {
            stop();
        } finally {
            files.close();
        }
    }

    private void stop() {
        serving = false;
        if (local != null) {
            local.close();
        }
        grpc.shutdown();
        try {
            if (!grpc.awaitTermination(5, TimeUnit.SECONDS)) {
                grpc.shutdownNow();
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            grpc.shutdownNow();
        }
        if (http != null) {
            http.close();
        }
        waiting.shutdownNow(); // a Flush still waiting on Redis fails; its client sees the server stop
        sessions.close();
        credentials.close();
        if (cluster != null) {
            cluster.close(); // before the store: fetch threads write into the pool
        }
        try {
            store.close();
        } catch (IllegalStateException leak) {
            System.getLogger(PegaflowServer.class.getName()).log(System.Logger.Level.WARNING, leak.getMessage());
        }
        pool.close();
    }
}
