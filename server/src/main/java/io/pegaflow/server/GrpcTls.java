package io.pegaflow.server;

import io.pegaflow.engine.InvalidArgumentException;
import java.net.InetSocketAddress;
import java.nio.file.Files;
import java.nio.file.Path;

/**
 * TLS on the gRPC port ({@code --tls-cert}, {@code --tls-key}: a PEM certificate chain and its
 * PEM PKCS#8 key), or the operator's explicit choice of plaintext beyond loopback
 * ({@code --allow-plaintext-remote}). Every call carries the tenants' token, so a plaintext
 * port reachable from other hosts hands the token to whoever listens on the wire: the server
 * refuses to listen beyond loopback without one of the two ({@link #check}). Clients trust
 * the server's certificate through {@code PEGAFLOW_TLS_CA} ({@code RemoteStore}).
 *
 * @param cert            the certificate chain (null: plaintext)
 * @param key             its private key (null: plaintext)
 * @param plaintextRemote the operator accepts plaintext beyond loopback (a trusted network)
 */
public record GrpcTls(Path cert, Path key, boolean plaintextRemote) {
    /** Plaintext, loopback only: the default. */
    public static final GrpcTls NONE = new GrpcTls(null, null, false);

    public GrpcTls {
        if ((cert == null) != (key == null)) {
            throw new InvalidArgumentException("TLS needs both --tls-cert and --tls-key; got cert=" + cert + " key=" + key);
        }
        for (Path p : new Path[] {cert, key}) {
            if (p != null && !Files.isReadable(p)) {
                throw new InvalidArgumentException("TLS file " + p + " is not a readable file; expected a PEM file");
            }
        }
    }

    public boolean enabled() {
        return cert != null;
    }

    /** Refuses plaintext on {@code addr} (the gRPC listen address) beyond loopback unless allowed. */
    void check(InetSocketAddress addr, String text) {
        boolean loopback = addr.getAddress() != null && addr.getAddress().isLoopbackAddress();
        if (!enabled() && !plaintextRemote && !loopback) {
            throw new InvalidArgumentException("--addr " + text + " listens beyond loopback without TLS: every call carries "
                    + "the tenants' token in clear there; give --tls-cert and --tls-key (clients set PEGAFLOW_TLS_CA to the CA "
                    + "file), or --allow-plaintext-remote on a network you trust");
        }
    }
}
