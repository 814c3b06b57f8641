package io.pegaflow.server.cluster;

import io.pegaflow.client.Wire;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.store.LocalStore;
import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.net.InetSocketAddress;
import java.nio.file.Path;
import java.time.Duration;

/**
 * Settings of cross-node sharing (docs/cluster.md), validated in one place. {@code peerAddr}:
 * where the peer channel listens; {@code advertiseAddr}: the address other hosts reach it at
 * (default {@code peerAddr}). Listening beyond loopback needs {@code allowRemote}; every host
 * shares {@code secretFile}; TLS is on when the three PEM files are given.
 */
public record ClusterConfig(RedisBlockRegistry.Settings registry, String peerAddr, String advertiseAddr, boolean allowRemote,
        Path secretFile, Path tlsCert, Path tlsKey, Path tlsCa, ClusterTier.Settings fetch) {
    public ClusterConfig {
        InetSocketAddress bind = Wire.hostPort(peerAddr, "--peer-addr");
        if (!allowRemote && !bind.getAddress().isLoopbackAddress()) {
            throw new InvalidArgumentException("--peer-addr " + peerAddr + " listens beyond loopback; pass --peer-allow-remote "
                    + "(and --peer-tls-cert/--peer-tls-key/--peer-tls-ca) to serve other hosts");
        }
        if (advertiseAddr != null) {
            Wire.hostPort(advertiseAddr, "--peer-advertise-addr");
        } else if (bind.getAddress().isAnyLocalAddress()) {
            throw new InvalidArgumentException("--peer-addr " + peerAddr + " is a wildcard; give --peer-advertise-addr HOST:PORT "
                    + "(the address other hosts reach this one at)");
        }
        if (secretFile == null) {
            throw new InvalidArgumentException("cross-node sharing needs a secret every host shares: --cluster-secret-file FILE, "
                    + "or --cluster-secret-from-auth-token with --auth-token-file given the same file on every host");
        }
        boolean anyTls = tlsCert != null || tlsKey != null || tlsCa != null;
        if (anyTls && (tlsCert == null || tlsKey == null || tlsCa == null)) {
            throw new InvalidArgumentException("--peer-tls-cert, --peer-tls-key and --peer-tls-ca go together; got cert="
                    + tlsCert + " key=" + tlsKey + " ca=" + tlsCa);
        }
        if (fetch == null) {
            fetch = ClusterTier.Settings.DEFAULTS;
        }
    }

    boolean tls() {
        return tlsCert != null;
    }

    /** The peer channel, the registry and the tier, started and attached to {@code store}. */
    public Cluster start(LocalStore store, MemorySegment pool) throws IOException {
        return start(store, pool, null);
    }

    /**
     * The same, {@code poolFile} being the file {@code pool} maps (null: none): over plaintext
     * the peer channel sends payloads from it with sendfile.
     */
    public Cluster start(LocalStore store, MemorySegment pool, java.nio.file.Path poolFile) throws IOException {
        byte[] secret = io.pegaflow.server.Secrets.read(secretFile, "cluster secret file");
        PeerTls tlsContext = tls() ? PeerTls.load(tlsCert, tlsKey, tlsCa) : null;
        if (!tls() && allowRemote) {
            System.getLogger(ClusterConfig.class.getName()).log(System.Logger.Level.WARNING,
                    "peer channel on " + peerAddr + " without TLS: KV bytes cross the network in the clear");
        }
        PeerServer server = new PeerServer(Wire.hostPort(peerAddr, "--peer-addr"), store, pool, poolFile, secret, tlsContext);
        try {
            String reachable = advertiseAddr != null ? advertiseAddr
                    : server.address().getHostString() + ":" + server.address().getPort();
            RedisBlockRegistry reg = new RedisBlockRegistry(registry, reachable, store::forEachResident);
            ClusterTier tier = new ClusterTier(store, reg, new TcpPeerTransport(secret, tlsContext, Duration.ofSeconds(2)), fetch);
            store.attachRemote(tier, pool);
            return new Cluster(server, tier, reachable);
        } catch (RuntimeException e) {
            server.close();
            throw e;
        }
    }

    /** What {@link #start} started; closing stops the tier (and registry) and then the peer channel. */
    public record Cluster(PeerServer server, ClusterTier tier, String peerAddr) implements AutoCloseable {
        @Override
        public void close() {
            tier.close();
            server.close();
        }
    }
}
