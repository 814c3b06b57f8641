package io.pegaflow.server;

import io.pegaflow.client.Version;
import io.pegaflow.client.Wire;

import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.PegaflowException;
import io.pegaflow.engine.Sizes;
import io.pegaflow.engine.logging.Logs;
import io.pegaflow.engine.ssd.SsdConfig;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.Callable;
import java.util.logging.Logger;
import picocli.CommandLine;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

/** {@code pegaflow-server}: flags follow the original PegaFlow's names and defaults where they apply. */
@Command(name = "pegaflow-server", mixinStandardHelpOptions = true, version = "pegaflow-server " + Version.VERSION,
        description = "KV-cache sidecar: shared host pool, block index, leases, sessions, /health and /metrics.")
public final class ServerMain implements Callable<Integer> {
    @Option(names = "--addr", defaultValue = "127.0.0.1:50055", description = "gRPC HOST:PORT (default ${DEFAULT-VALUE}; loopback)")
    String addr;

    @Option(names = "--http-addr", defaultValue = "127.0.0.1:9091", description = "HTTP HOST:PORT for /health, /metrics, /instances and the operator's /admin calls")
    String httpAddr;

    @Option(names = "--pool-size", defaultValue = "30gb", description = "host pool size (kb/mb/gb/tb; default ${DEFAULT-VALUE})")
    String poolSize;

    @Option(names = "--pool-path", description = "shared-memory file of the pool (default /dev/shm/pegaflow-<port>.pool)")
    Path poolPath;

    @Option(names = "--pool-group", paramLabel = "NAME",
            description = "share the pool and socket files with this group (mode 0660); default: this user only (0600)")
    String poolGroup;

    @Option(names = "--trust-group", paramLabel = "SPEC",
            description = "a trust group (repeatable, up to 16): name=NAME,size=SIZE,unix-group=GROUP,addr=HOST:PORT[,http=HOST:PORT]."
                    + " Its tenants get a pool file of their own (<pool-path>.group-NAME), shared with GROUP alone, its own token"
                    + " and store, served at addr; tenants outside GROUP can neither map its pool nor read its token (docs/security.md)")
    List<String> trustGroups;

    @Option(names = "--lease-ttl-secs", defaultValue = "600", description = "seconds an unconsumed lease pins its blocks")
    long leaseTtlSecs;

    @Option(names = "--session-grace-ms", defaultValue = "2000",
            description = "after a client's session ends, wait this long before releasing its leases")
    long sessionGraceMs;

    @Option(names = "--enable-prometheus", defaultValue = "true", negatable = true, description = "serve /metrics")
    boolean prometheus;

    @Option(names = "--local-socket", defaultValue = "true", negatable = true,
            description = "also answer query/release on a Unix socket <pool-path>.sock (co-located clients skip gRPC)")
    boolean localSocket;

    @Option(names = "--auth-token-file",
            description = "file holding the secret every call must carry (default: a new one written to <pool-path>.token, mode 0600)")
    Path authTokenFile;

    @Option(names = "--operator-token-file", paramLabel = "FILE",
            description = "file holding the operator's secret, which Shutdown and the HTTP /admin calls need (default: a new one written to <pool-path>.operator-token, mode 0600, never the pool group's)")
    Path operatorTokenFile;

    @Option(names = "--max-instances", defaultValue = "4096", description = "instances registered at once, over all tenants (default ${DEFAULT-VALUE})")
    int maxInstances;

    @Option(names = "--max-instances-per-tenant", defaultValue = "256",
            description = "instances one tenant (one join secret: a vLLM launch) may have registered at once (default ${DEFAULT-VALUE})")
    int maxInstancesPerTenant;

    @Option(names = "--unsessioned-instance-ttl-secs", defaultValue = "60",
            description = "an instance whose clients never opened a liveness session is unregistered after this (default ${DEFAULT-VALUE})")
    long unsessionedTtlSecs;

    @Option(names = "--max-calls-per-tenant", defaultValue = "48",
            description = "gRPC calls in flight per tenant, and local-socket connections per tenant (default ${DEFAULT-VALUE})")
    int maxCallsPerTenant;

    @Option(names = "--max-leases-per-instance", defaultValue = "16384", description = "leases one instance may hold (default ${DEFAULT-VALUE})")
    int maxLeasesPerInstance;

    @Option(names = "--max-leased-blocks-per-instance", defaultValue = "4194304",
            description = "blocks one instance's leases may hold (default ${DEFAULT-VALUE})")
    long maxLeasedBlocksPerInstance;

    @Option(names = "--tls-cert", paramLabel = "PEM",
            description = "TLS on the gRPC port: this server's certificate chain (with --tls-key; clients set PEGAFLOW_TLS_CA)")
    Path tlsCert;

    @Option(names = "--tls-key", paramLabel = "PEM", description = "the private key of --tls-cert (PEM, PKCS#8)")
    Path tlsKey;

    @Option(names = "--allow-plaintext-remote",
            description = "listen beyond loopback without TLS (the tenants' token then crosses the network in clear)")
    boolean allowPlaintextRemote;

    @Option(names = "--tenant-pool-share", defaultValue = "0",
            description = "pool bytes one tenant's saves may hold (e.g. 8gb; 0: no share): a tenant over it evicts its own "
                    + "least recently used blocks first, and its save is refused while those are all in use (default ${DEFAULT-VALUE})")
    String tenantPoolShare;

    @Option(names = "--max-open-copies-per-instance", defaultValue = "4096",
            description = "saves and loads one instance may have open (default ${DEFAULT-VALUE})")
    int maxOpenCopiesPerInstance;

    @Option(names = "--copy-timeout-secs", defaultValue = "180",
            description = "seconds a save or load may stay open before it is rolled back (its client died without a session)")
    long copyTimeoutSecs;

    @Option(names = "--owner-pid", paramLabel = "PID",
            description = "stop when process PID exits (a private server started by a vLLM instance for itself)")
    Long ownerPid;

    @Option(names = "--busy-poll-us", defaultValue = "0", paramLabel = "US",
            description = "local-socket threads spin up to US microseconds for a client's next frame before sleeping,"
                    + " a core each while workers are active, for the lowest latency on hosts with cores to spare"
                    + " (0: off; default ${DEFAULT-VALUE})")
    long busyPollUs;

    @Option(names = "--prefault-threads", defaultValue = "0", paramLabel = "N",
            description = "commit the pool's pages at start on N threads (0: as written; default ${DEFAULT-VALUE})")
    int prefaultThreads;

    @Option(names = "--warm-up", defaultValue = "true", negatable = true,
            description = "exercise the control plane on a scratch store before serving, so the first real operation runs at steady speed (default ${DEFAULT-VALUE})")
    boolean warmUp;

    @Option(names = "--admission", defaultValue = "all", paramLabel = "POLICY",
            description = "which blocks saves write: all, or seen:N (a block once lookups asked for it N times; default ${DEFAULT-VALUE})")
    String admission;

    @Option(names = "--eviction", defaultValue = "lru", paramLabel = "POLICY",
            description = "which unreferenced block leaves first under pressure: lru, or lfu (the least asked for of the 16 least recently used; default ${DEFAULT-VALUE})")
    String eviction;

    @Option(names = "--ssd-cache-path", paramLabel = "DIR",
            description = "directory of the SSD tier's shard files (repeatable: one set of shards per path); none: no SSD tier")
    List<Path> ssdPaths;

    @Option(names = "--ssd-cache-capacity", defaultValue = SsdConfig.DEFAULT_CAPACITY,
            description = "disk space of the SSD tier over all paths (kb/mb/gb/tb; default ${DEFAULT-VALUE})")
    String ssdCapacity;

    @Option(names = "--ssd-cache-shards", defaultValue = "1", paramLabel = "N",
            description = "shard files per path (default ${DEFAULT-VALUE})")
    int ssdShards;

    @Option(names = "--ssd-write-queue-depth", defaultValue = "" + SsdConfig.DEFAULT_WRITE_QUEUE_BLOCKS, paramLabel = "BLOCKS",
            description = "sealed blocks waiting for the disk; when full, new ones stay in DRAM only (default ${DEFAULT-VALUE})")
    int ssdQueue;

    @Option(names = "--ssd-write-threads", defaultValue = "" + SsdConfig.DEFAULT_WRITE_THREADS, paramLabel = "N",
            description = "concurrent SSD writes (default ${DEFAULT-VALUE})")
    int ssdWriteThreads;

    @Option(names = "--ssd-read-threads", defaultValue = "" + SsdConfig.DEFAULT_READ_THREADS, paramLabel = "N",
            description = "concurrent SSD reads (default ${DEFAULT-VALUE})")
    int ssdReadThreads;

    @Option(names = "--max-prefetch-blocks", defaultValue = "" + SsdConfig.DEFAULT_MAX_PREFETCH_BLOCKS, paramLabel = "BLOCKS",
            description = "blocks read back from SSD at once, their pool space reserved (default ${DEFAULT-VALUE})")
    int maxPrefetch;

    @Option(names = "--redis-url", paramLabel = "URL",
            description = "share blocks with other hosts through this Redis (redis://, rediss://, redis-sentinel://; docs/cluster.md); none: this host alone")
    String redisUrl;

    @Option(names = "--redis-cluster",
            description = "--redis-url names a Redis Cluster: redis://HOST:PORT[,HOST:PORT...] seeds; keys spread over its shards")
    boolean redisCluster;

    @Option(names = "--peer-addr", defaultValue = "127.0.0.1:50057",
            description = "HOST:PORT the peer channel listens on, for other hosts' fetches (default ${DEFAULT-VALUE})")
    String peerAddr;

    @Option(names = "--peer-advertise-addr", paramLabel = "HOST:PORT",
            description = "address other hosts reach the peer channel at (default: --peer-addr)")
    String peerAdvertiseAddr;

    @Option(names = "--peer-allow-remote", description = "let the peer channel listen beyond loopback")
    boolean peerAllowRemote;

    @Option(names = "--cluster-secret-file", paramLabel = "FILE",
            description = "secret every host of the cluster shares (16..4096 characters); peers prove it to each other without sending it")
    Path clusterSecretFile;

    @Option(names = "--cluster-secret-from-auth-token",
            description = "use the server secret of --auth-token-file as the cluster secret (every host given the same file) "
                    + "instead of a --cluster-secret-file of its own")
    boolean clusterSecretFromAuthToken;

    @Option(names = "--peer-tls-cert", paramLabel = "PEM", description = "this host's certificate chain (peer channel and rediss://)")
    Path peerTlsCert;

    @Option(names = "--peer-tls-key", paramLabel = "PEM", description = "this host's PKCS#8 private key")
    Path peerTlsKey;

    @Option(names = "--peer-tls-ca", paramLabel = "PEM", description = "CA that every host's certificate chains to")
    Path peerTlsCa;

    @Option(names = "--cluster-max-nodes", defaultValue = "256", description = "hosts a cluster may have (default ${DEFAULT-VALUE})")
    int clusterMaxNodes;

    @Option(names = "--cluster-heartbeat-ms", defaultValue = "1000", description = "heartbeat period (default ${DEFAULT-VALUE})")
    long heartbeatMs;

    @Option(names = "--cluster-stale-ms", defaultValue = "3000",
            description = "a host whose heartbeat is older (or newer) than this is never chosen; also its key's TTL (default ${DEFAULT-VALUE})")
    long staleMs;

    @Option(names = "--registry-queue-depth", defaultValue = "65536",
            description = "registry updates waiting to be sent; beyond, dropped and counted (default ${DEFAULT-VALUE})")
    int registryQueue;

    @Option(names = "--peer-fetch-deadline-secs", defaultValue = "30",
            description = "how long a peer pins blocks for one fetch, and how long the fetch may take (default ${DEFAULT-VALUE})")
    long fetchDeadlineSecs;

    @Option(names = "--inject-load-failures", defaultValue = "0", paramLabel = "N",
            description = "testing: refuse the first N loads as failed copies, so clients' recovery (vLLM recomputes) "
                    + "can be exercised against a real server (default ${DEFAULT-VALUE}: off)")
    int injectLoadFailures;

    @Option(names = "--log-level", defaultValue = "info",
            description = "error, warn, info, debug or trace: PegaFlow's records; gRPC, Netty and Lettuce log at info or this if coarser (default ${DEFAULT-VALUE})")
    String logLevel;

    @Option(names = "--log-format", defaultValue = "text",
            description = "text (one line per record) or json (one JSON object per line), on standard error (default ${DEFAULT-VALUE})")
    String logFormat;

    @Override
    public Integer call() throws Exception {
        Logs.configure(logLevel, logFormat); // first: everything after logs through its one handler
        int port = Wire.hostPort(addr, "--addr").getPort();
        Path path = poolPath != null ? poolPath
                : Path.of("/dev/shm", "pegaflow-" + (port == 0 ? "pid" + ProcessHandle.current().pid() : port) + ".pool");
        PegaflowServer.Config config = new PegaflowServer.Config(addr, httpAddr, Sizes.parse(poolSize), path,
                Duration.ofSeconds(leaseTtlSecs), Duration.ofMillis(sessionGraceMs), prometheus, poolGroup,
                Duration.ofSeconds(copyTimeoutSecs), authTokenFile, prefaultThreads,
                ssdPaths == null || ssdPaths.isEmpty() ? null : new SsdConfig(ssdPaths, Sizes.parse(ssdCapacity), ssdShards,
                        ssdQueue, ssdWriteThreads, ssdReadThreads, maxPrefetch));
        if (redisUrl != null) {
            config = config.withCluster(clusterConfig());
        }
        config = config.withPolicies(admission, eviction).withTls(new GrpcTls(tlsCert, tlsKey, allowPlaintextRemote));
        config = config.withTenancy(Tenancy.DEFAULTS.operatorToken(operatorTokenFile).instances(maxInstances, maxInstancesPerTenant)
                .unsessioned(Duration.ofSeconds(unsessionedTtlSecs)).calls(maxCallsPerTenant)
                .quotas(io.pegaflow.engine.store.Quotas.DEFAULTS.perInstance(maxLeasesPerInstance, maxLeasedBlocksPerInstance,
                        maxOpenCopiesPerInstance).tenantPoolShare(Sizes.parse(tenantPoolShare))));
        if (warmUp) {
            try {
                Warmup.Result w = Warmup.run();
                Logger.getLogger("io.pegaflow.server").fine("warm-up took " + w.nanos() / 1_000_000 + " ms: " + w.rounds()
                        + " rounds of a worker's calls to a scratch server");
            } catch (RuntimeException e) { // an optimisation: a server that could not warm up still serves
                Logger.getLogger("io.pegaflow.server").warning("warm-up skipped: " + e
                        + " (the first operations run slower until compiled)");
            }
        }
        ProcessHandle owner = null;
        if (ownerPid != null) {
            owner = ProcessHandle.of(ownerPid).orElseThrow(() -> new IllegalArgumentException("--owner-pid " + ownerPid
                    + " is not a running process; expected the pid of the process that owns this server"));
        }
        List<TrustGroup> groups = new java.util.ArrayList<>();
        for (String spec : trustGroups == null ? List.<String>of() : trustGroups) {
            groups.add(TrustGroup.parse(spec));
        }
        TrustGroup.checkApart(groups, poolGroup); // every group refused before any file is made
        PegaflowServer server = PegaflowServer.start(config, localSocket, busyPollUs);
        List<PegaflowServer> grouped = new java.util.ArrayList<>();
        try {
            for (TrustGroup g : groups) {
                PegaflowServer s = PegaflowServer.start(groupConfig(config, g, server.operatorTokenFile()), localSocket, busyPollUs);
                grouped.add(s);
                System.out.println("pegaflow-server trust group " + g.name() + " serving " + s.describe() + " token=" + s.tokenFile());
            }
        } catch (Throwable e) { // whatever stopped a group's start: nothing of this start is left behind
            grouped.forEach(PegaflowServer::close);
            server.close();
            throw e;
        }
        if (injectLoadFailures != 0) {
            server.store().injectLoadFailures(injectLoadFailures);
        }
        if (owner != null) {
            long pid = ownerPid;
            owner.onExit().thenRun(() -> {
                Logger.getLogger("io.pegaflow.server").info("owner process " + pid + " exited: stopping");
                server.close();
            });
        }
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            grouped.forEach(PegaflowServer::close);
            server.close();
        }, "pegaflow-server-stop"));
        System.out.println("pegaflow-server " + Version.VERSION + " ready " + server.describe());
        System.out.flush();
        server.awaitTermination();
        grouped.forEach(PegaflowServer::close); // the server's Shutdown (the operator's) stops every group
        server.close();
        return 0;
    }

    /**
     * A trust group's server: the server's settings but its own pool (beside the server's), its
     * own token (beside its pool, 0640 to its Unix group), its Unix group for every file, its
     * addresses, the server's operator token, and neither the SSD tier nor the cluster (they
     * serve the server's pool).
     */
    static PegaflowServer.Config groupConfig(PegaflowServer.Config server, TrustGroup g, Path operatorToken) {
        return new PegaflowServer.Config(g.addr(), g.httpAddr(), g.poolBytes(), g.poolPath(server.poolPath()),
                server.leaseTtl(), server.sessionGrace(), server.prometheus() && g.httpAddr() != null, g.unixGroup(),
                server.copyTtl(), null, server.prefaultThreads(), null, null,
                server.tenancy().operatorToken(operatorToken), server.admission(), server.eviction(), server.tls());
    }

    private io.pegaflow.server.cluster.ClusterConfig clusterConfig() {
        io.lettuce.core.SslOptions ssl = null;
        if (redisUrl.startsWith("rediss://") && peerTlsCa != null) {
            io.lettuce.core.SslOptions.Builder b = io.lettuce.core.SslOptions.builder().jdkSslProvider().trustManager(peerTlsCa.toFile());
            if (peerTlsCert != null && peerTlsKey != null) {
                b.keyManager(peerTlsCert.toFile(), peerTlsKey.toFile(), null);
            }
            ssl = b.build();
        }
        var registry = new io.pegaflow.server.cluster.RedisBlockRegistry.Settings(redisUrl, clusterMaxNodes,
                Duration.ofMillis(heartbeatMs), Duration.ofMillis(staleMs), registryQueue, Duration.ofSeconds(2), ssl, redisCluster);
        var d = io.pegaflow.server.cluster.ClusterTier.Settings.DEFAULTS;
        var fetch = new io.pegaflow.server.cluster.ClusterTier.Settings(Duration.ofSeconds(fetchDeadlineSecs), d.negativeTtl(),
                d.suspectFor(), d.fetchThreads(), d.maxQueuedFetches(), d.maxRun());
        return new io.pegaflow.server.cluster.ClusterConfig(registry, peerAddr, peerAdvertiseAddr, peerAllowRemote,
                clusterSecret(), peerTlsCert, peerTlsKey, peerTlsCa, fetch);
    }

    /**
     * The cluster secret's file: its own, or the server secret's only when the operator says so.
     * Why not the server secret by default: every tenant holding the server token could then act
     * as a host of the cluster.
     */
    private Path clusterSecret() {
        if (clusterSecretFromAuthToken) {
            if (clusterSecretFile != null) {
                throw new InvalidArgumentException("--cluster-secret-file " + clusterSecretFile
                        + " and --cluster-secret-from-auth-token name two cluster secrets; give one");
            }
            if (authTokenFile == null) {
                throw new InvalidArgumentException("--cluster-secret-from-auth-token needs --auth-token-file FILE, the same file on every host");
            }
            return authTokenFile;
        }
        return clusterSecretFile;
    }

    public static void main(String[] args) {
        CommandLine cli = new CommandLine(new ServerMain());
        cli.setExecutionExceptionHandler((e, cmd, parsed) -> {
            if (e instanceof PegaflowException || e instanceof IllegalArgumentException || e instanceof java.io.IOException) {
                cmd.getErr().println("pegaflow-server: " + e.getMessage());
                return 2;
            }
            throw e;
        });
        System.exit(cli.execute(args));
    }
}
