package io.pegaflow.server;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.client.RemoteStore;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.InvalidArgumentException;
import java.io.FileInputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.Key;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.time.Duration;
import java.util.Base64;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * TLS on the gRPC port ({@link GrpcTls}): a server with {@code --tls-cert}/{@code --tls-key}
 * serves a client that trusts its CA ({@code PEGAFLOW_TLS_CA}) and not a plaintext one; a
 * plaintext port beyond loopback is refused at start unless the operator allows it. The
 * certificate is made here with the JDK's keytool (a self-signed one for 127.0.0.1).
 */
class GrpcTlsTest {
    @TempDir
    Path dir;

    private PegaflowServer.Config config(String addr) {
        return new PegaflowServer.Config(addr, "127.0.0.1:0", 4L << 20, dir.resolve("pool-" + System.nanoTime()),
                Duration.ofSeconds(600), Duration.ofMillis(100), true);
    }

    /** cert.pem and key.pem (PKCS#8) of a self-signed EC certificate for 127.0.0.1, via keytool. */
    private Path[] selfSigned() throws Exception {
        Path ks = dir.resolve("server.p12");
        Path keytool = Path.of(System.getProperty("java.home"), "bin", "keytool");
        Process p = new ProcessBuilder(keytool.toString(), "-genkeypair", "-alias", "server", "-keyalg", "EC", "-groupname",
                "secp256r1", "-dname", "CN=pegaflow-test", "-ext", "SAN=ip:127.0.0.1", "-validity", "2", "-storetype", "PKCS12",
                "-keystore", ks.toString(), "-storepass", "changeit", "-keypass", "changeit").redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        assertThat(p.waitFor()).as(out).isZero();
        KeyStore store = KeyStore.getInstance("PKCS12");
        try (FileInputStream in = new FileInputStream(ks.toFile())) {
            store.load(in, "changeit".toCharArray());
        }
        Certificate cert = store.getCertificate("server");
        Key key = store.getKey("server", "changeit".toCharArray());
        Base64.Encoder b64 = Base64.getMimeEncoder(64, "\n".getBytes(StandardCharsets.US_ASCII));
        Path certPem = dir.resolve("cert.pem");
        Path keyPem = dir.resolve("key.pem");
        Files.writeString(certPem, "-----BEGIN CERTIFICATE-----\n" + b64.encodeToString(cert.getEncoded())
                + "\n-----END CERTIFICATE-----\n");
        Files.writeString(keyPem, "-----BEGIN PRIVATE KEY-----\n" + b64.encodeToString(key.getEncoded())
                + "\n-----END PRIVATE KEY-----\n");
        return new Path[] {certPem, keyPem};
    }

    @Test
    void aTlsServerServesAClientTrustingItsCaAndNotAPlaintextOne() throws Exception {
        Path[] pem = selfSigned();
        try (PegaflowServer server = PegaflowServer.start(config("127.0.0.1:0").withTls(new GrpcTls(pem[0], pem[1], false)),
                false)) {
            String endpoint = "127.0.0.1:" + server.port();
            var channel = RemoteStore.channelBuilder(endpoint, pem[0].toString()).build();
            try (RemoteStore tls = RemoteStore.over(channel, endpoint, 5000)) {
                tls.registerInstance(new InstanceSpec("over-tls", "ns", 1, 1));
                assertThat(server.store().isRegistered("over-tls")).isTrue();
            } finally {
                channel.shutdownNow();
            }
            var plain = RemoteStore.channelBuilder(endpoint, null).build();
            try (RemoteStore clear = RemoteStore.over(plain, endpoint, 2000)) {
                assertThatThrownBy(() -> clear.registerInstance(new InstanceSpec("in-clear", "ns", 1, 1)))
                        .as("a plaintext client gets no answer from the TLS port").isInstanceOf(RuntimeException.class);
            } finally {
                plain.shutdownNow();
            }
        }
        assertThatThrownBy(() -> RemoteStore.channelBuilder("127.0.0.1:1", dir.resolve("missing.pem").toString()))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("PEGAFLOW_TLS_CA=");
    }

    @Test
    void plaintextBeyondLoopbackIsRefusedUnlessTheOperatorAllowsIt() throws Exception {
        assertThatThrownBy(() -> PegaflowServer.start(config("0.0.0.0:0"), false)).isInstanceOf(InvalidArgumentException.class)
                .hasMessageContaining("--addr 0.0.0.0:0 listens beyond loopback without TLS")
                .hasMessageContaining("--tls-cert").hasMessageContaining("--allow-plaintext-remote");
        try (PegaflowServer server = PegaflowServer.start(config("0.0.0.0:0").withTls(new GrpcTls(null, null, true)), false)) {
            assertThat(server.port()).isPositive();
        }
        assertThatThrownBy(() -> new GrpcTls(dir.resolve("c.pem"), null, false)).isInstanceOf(InvalidArgumentException.class)
                .hasMessageContaining("both --tls-cert and --tls-key");
        assertThat(List.of(GrpcTls.NONE.enabled())).containsExactly(false);
    }
}
