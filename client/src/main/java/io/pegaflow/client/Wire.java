package io.pegaflow.client;

import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.Limits;
import java.net.InetSocketAddress;

/**
 * What client and server agree on beyond the .proto (the call headers are in {@link Headers};
 * this class loads no gRPC code, so an embedded store link runs without it): the local socket's frame methods and cap (frames are described in
 * {@code LocalSocketServer}), message size limits derived from the engine's {@link Limits},
 * and how an address is written.
 */
public final class Wire {
    /** Local-socket method: Query (QueryRequest -> QueryResponse). */
    public static final byte QUERY = 1;
    /** Local-socket method: Release (ReleaseRequest -> Empty). */
    public static final byte RELEASE = 2;
    /** Local-socket method: the connection's first frame, the server's token (answer: Empty). */
    public static final byte AUTH = 3;
    /** Local-socket method: ReserveSave (ReserveSaveRequest -> CopyPlan). */
    public static final byte RESERVE_SAVE = 4;
    /** Local-socket method: BeginLoad (BeginLoadRequest -> CopyPlan). */
    public static final byte BEGIN_LOAD = 5;
    /** Local-socket method: EndCopy (EndCopyRequest -> CopyResult). */
    public static final byte END_COPY = 6;
    /** Local-socket method: LoadRest (LoadRestRequest -> CopyPlan). */
    public static final byte LOAD_REST = 7;
    /**
     * Most bytes one run of a copy plan takes in its answer (four varints: block, region,
     * count, offset, with their tags): a client sends a ReserveSave or BeginLoad over the
     * local socket only when {@code blocks x regions} runs of this size fit in a frame.
     */
    public static final int MAX_RUN_BYTES = 32;
    /**
     * Largest local-socket frame either side reads: a Query of up to ~130k 32-byte hashes
     * (vLLM's sha256 block hashes; 2M tokens at 16 a block). A larger query goes over gRPC;
     * the server refuses a larger frame before reading its payload.
     */
    public static final int MAX_FRAME = 4 << 20;

    /**
     * The largest request the caps in {@link Limits} allow, with room for protobuf framing: a
     * ReserveSave of {@link Limits#MAX_HASHES_PER_CALL} hashes of {@link Limits#MAX_HASH_BYTES}
     * and as many block ids (at most 10 bytes each) naming {@link Limits#MAX_LAYERS_PER_WORKER}
     * layers, or a RegisterWorker of that many regions (names of {@link Limits#MAX_NAME_BYTES}
     * plus at most 80 bytes of fields each). The server's gRPC inbound message limit (~24 MiB):
     * anything larger is refused (RESOURCE_EXHAUSTED) before it is parsed.
     */
    public static final int MAX_REQUEST_BYTES = Limits.MAX_HASHES_PER_CALL * (Limits.MAX_HASH_BYTES + 10)
            + Limits.MAX_LAYERS_PER_WORKER * (Limits.MAX_NAME_BYTES + 80) + (1 << 16);

    /**
     * The client's gRPC inbound message limit: a copy plan of {@link Limits#MAX_PLAN_SLOTS}
     * entries (at most ~11 bytes each) fits.
     */
    public static final int MAX_RESPONSE_BYTES = 64 << 20;

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
