package io.pegaflow.server.cluster;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.EngineConfig;
import io.pegaflow.engine.store.LocalStore;
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.lang.foreign.Arena;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * The peer channel's hello proves the cluster secret without sending it: whatever address
 * Redis names as a peer sees two nonces and proofs it cannot replay, an impostor learns
 * nothing, and the old clear-text hello is refused.
 */
class PeerHelloTest {
    private static final byte[] SECRET = "a-cluster-secret-that-is-forty-bytes-lng".getBytes(StandardCharsets.US_ASCII);

    @Test
    void anImpostorPeerSeesNeitherTheSecretNorAProofAndIsNotTrusted() throws Exception {
        try (ServerSocket impostor = new ServerSocket(0, 1, InetAddress.getLoopbackAddress());
                TcpPeerTransport transport = new TcpPeerTransport(SECRET, null, Duration.ofSeconds(2))) {
            CompletableFuture<byte[]> seen = CompletableFuture.supplyAsync(() -> {
                try (Socket s = impostor.accept()) {
                    s.setSoTimeout(5_000);
                    InputStream in = s.getInputStream();
                    byte[] hello = in.readNBytes(PeerWire.MAGIC.length + PeerWire.NONCE_BYTES);
                    OutputStream out = s.getOutputStream();
                    out.write(PeerWire.OK); // a challenge with a proof made without the secret
                    out.write(PeerWire.nonce());
                    out.write(PeerWire.nonce());
                    out.flush();
                    ByteArrayOutputStream all = new ByteArrayOutputStream();
                    all.write(hello);
                    all.write(in.readAllBytes()); // whatever the host sends before it hangs up
                    return all.toByteArray();
                } catch (IOException e) {
                    throw new IllegalStateException(e);
                }
            });
            var node = new BlockRegistry.Node(1, "impostor", "127.0.0.1:" + impostor.getLocalPort(), System.currentTimeMillis());
            assertThatThrownBy(() -> transport.pin(node, "ns", BlockHashes.of(new byte[][] {new byte[16]}), Duration.ofSeconds(1)))
                    .isInstanceOf(IOException.class).hasMessageContaining("does not hold this host's cluster secret");
            byte[] sent = seen.get(10, TimeUnit.SECONDS);
            assertThat(sent).hasSize(PeerWire.MAGIC.length + PeerWire.NONCE_BYTES); // the hello, and nothing after it
            assertThat(new String(sent, StandardCharsets.ISO_8859_1)).doesNotContain(new String(SECRET, StandardCharsets.ISO_8859_1));
        }
    }

    @Test
    void aPeerServerAnswersOnlyAClientThatProvesTheSecret() throws Exception {
        long bytes = 1 << 20;
        try (Arena arena = Arena.ofShared();
                LocalStore store = new LocalStore(EngineConfig.builder().poolBytes(bytes).build(), bytes);
                PeerServer server = new PeerServer(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), store,
                        arena.allocate(bytes, 4096), SECRET, null)) {
            // the clear-text hello of the previous version: the secret itself after the old magic
            try (Socket s = connect(server)) {
                OutputStream out = s.getOutputStream();
                out.write("PFPEER03".getBytes(StandardCharsets.US_ASCII));
                out.write(new byte[] {0, (byte) SECRET.length});
                out.write(SECRET);
                out.flush();
                assertThat(s.getInputStream().read()).isEqualTo(PeerWire.REFUSED);
            }
            // the right magic, then a proof made with another secret
            byte[] other = "another-cluster-secret-of-forty-bytes-ok".getBytes(StandardCharsets.US_ASCII);
            assertThat(hello(server, other)).isEqualTo(PeerWire.REFUSED);
            // the right secret
            assertThat(hello(server, SECRET)).isEqualTo(PeerWire.OK);
            assertThat(server.refusedConnections()).isEqualTo(2);
        }
    }

    /** A client's side of the hello with {@code secret}; checks the server's proof, returns its last status. */
    private static int hello(PeerServer server, byte[] secret) throws IOException {
        try (Socket s = connect(server)) {
            byte[] clientNonce = PeerWire.nonce();
            OutputStream out = s.getOutputStream();
            out.write(PeerWire.MAGIC);
            out.write(clientNonce);
            out.flush();
            DataInputStream in = new DataInputStream(s.getInputStream());
            assertThat(in.readByte()).isEqualTo(PeerWire.OK);
            byte[] serverNonce = in.readNBytes(PeerWire.NONCE_BYTES);
            byte[] serverProof = in.readNBytes(PeerWire.PROOF_BYTES);
            assertThat(serverProof).isEqualTo(PeerWire.proof(SECRET, "server", clientNonce, serverNonce));
            assertThat(serverProof).isNotEqualTo(PeerWire.proof(SECRET, "client", clientNonce, serverNonce));
            out.write(PeerWire.proof(secret, "client", clientNonce, serverNonce));
            out.flush();
            return in.read();
        }
    }

    private static Socket connect(PeerServer server) throws IOException {
        Socket s = new Socket(server.address().getAddress(), server.address().getPort());
        s.setSoTimeout(5_000);
        return s;
    }
}
