package io.pegaflow.client;

import io.grpc.Metadata;
import io.pegaflow.engine.InvalidArgumentException;
import java.net.InetSocketAddress;

/**
 * What client and server agree on beyond the .proto: the call headers (credential, client
 * id), the local socket's frame methods and cap (frames are described in
 * {@code LocalSocketServer}), and how an address is written.
 */
public final class Wire {
    /** Local-socket method: Query (QueryRequest -> QueryResponse). */
    public static final byte QUERY = 1;
    /** Local-socket method: Release (ReleaseRequest -> Empty). */
    public static final byte RELEASE = 2;
    /** Local-socket method: the connection's first frame, the server's token (answer: Empty). */
    public static final byte AUTH = 3;
    /** Every call but Health: {@code Bearer <the server's token>}. */
    public static final Metadata.Key<String> AUTHORIZATION =
            Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);
    /** The calling client process's id: 128 random bits, hex. */
    public static final Metadata.Key<String> CLIENT_ID = Metadata.Key.of("pegaflow-client-id", Metadata.ASCII_STRING_MARSHALLER);
    /** Largest local-socket frame either side reads. */
    public static final int MAX_FRAME = 64 << 20;

    private Wire() {}

    /** Parses {@code host:port}; throws naming the flag and the value. */
    public static InetSocketAddress hostPort(String text, String flag) {
        int colon = text == null ? -1 : text.lastIndexOf(':');
        try {
            if (colon <= 0) {
                throw new NumberFormatException();
            }
            int port = Integer.parseInt(text.substring(colon + 1));
            if (port < 0 || port > 65535) {
                throw new NumberFormatException();
            }
            return new InetSocketAddress(text.substring(0, colon), port);
        } catch (NumberFormatException e) {
            throw new InvalidArgumentException(flag + " '" + text + "' is not HOST:PORT (e.g. 127.0.0.1:50055)");
        }
    }
}
