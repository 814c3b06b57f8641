package io.pegaflow.client;

import io.pegaflow.engine.InvalidArgumentException;
import java.net.InetSocketAddress;

/**
 * What client and server agree on beyond the .proto: the local socket's frame methods and
 * cap (frames are described in {@code LocalSocketServer}), and how an address is written.
 */
public final class Wire {
    /** Local-socket method: Query (QueryRequest -> QueryResponse). */
    public static final byte QUERY = 1;
    /** Local-socket method: Release (ReleaseRequest -> Empty). */
    public static final byte RELEASE = 2;
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
