package io.pegaflow.client;

import io.grpc.Metadata;

/** The gRPC headers every call but Health carries (kept apart from {@link Wire}, which loads no gRPC code). */
public final class Headers {
    /** {@code Bearer <the server's token>}. */
    public static final Metadata.Key<String> AUTHORIZATION = Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);
    /** The calling client process's id: 128 random bits, hex. */
    public static final Metadata.Key<String> CLIENT_ID = Metadata.Key.of("pegaflow-client-id", Metadata.ASCII_STRING_MARSHALLER);
    /** The join secret the client presents for the instances it names (hex; absent when it has none). */
    public static final Metadata.Key<String> JOIN_SECRET = Metadata.Key.of("pegaflow-join-secret", Metadata.ASCII_STRING_MARSHALLER);

    private Headers() {}
}
