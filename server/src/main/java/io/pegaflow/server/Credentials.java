package io.pegaflow.server;

import io.grpc.Context;
import io.grpc.Contexts;
import io.grpc.Metadata;
import io.grpc.ServerCall;
import io.grpc.ServerCallHandler;
import io.grpc.ServerInterceptor;
import io.grpc.Status;
import io.pegaflow.client.Errors;
import io.pegaflow.client.Headers;
import io.pegaflow.client.proto.EngineGrpc;
import io.pegaflow.engine.ErrorCode;
import io.pegaflow.engine.InvalidArgumentException;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.attribute.GroupPrincipal;
import java.nio.file.attribute.PosixFileAttributeView;
import java.nio.file.attribute.PosixFilePermissions;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.util.HexFormat;

/**
 * Who may call: every gRPC call but Health carries the server's secret
 * ({@code authorization: Bearer <token>}); the local socket's first frame carries it too.
 * The secret is generated at start into a 0600 file beside the pool (clients find it through
 * Health's {@code token_path}, as they find the pool) unless {@code --auth-token-file} names
 * one. Each call also names its client ({@code pegaflow-client-id}, 128 random bits per
 * client process) and may present a join secret ({@code pegaflow-join-secret}): the
 * {@link Caller} that {@link Tenants} checks against the instance the call names.
 *
 * <p>{@link Check} is the pluggable part: cross-node TLS (6/7) adds a check on the peer's
 * certificate next to this one.
 */
final class Credentials implements ServerInterceptor {
    /** Who sent the call ({@link Caller#NOBODY} when it sent no client id), in the call's context. */
    static final Context.Key<Caller> CALLER = Context.keyWithDefault("pegaflow-caller", Caller.NOBODY);

    /** Decides whether a call's headers are allowed. */
    @FunctionalInterface
    interface Check {
        /** Null when allowed, else why not (sent to the caller). */
        String refuse(Metadata headers);
    }

    private final Check check;
    private final Path tokenFile;
    private final boolean ownsTokenFile;
    private final byte[] token;

    private Credentials(byte[] token, Path tokenFile, boolean ownsTokenFile) {
        this.token = token;
        this.tokenFile = tokenFile;
        this.ownsTokenFile = ownsTokenFile;
        this.check = headers -> {
            String auth = headers.get(Headers.AUTHORIZATION);
            if (auth == null) {
                return "no credential: every call but Health needs the server's token (" + tokenFile + ")";
            }
            return matches(auth) ? null : "wrong credential";
        };
    }

    /**
     * The token in {@code givenFile} (its text, trimmed; at least 16 characters), or a new one
     * written into {@code besidePool + ".token"} with mode 0600 (0640 and {@code group} when the
     * pool is shared with a group: its members' clients must read it).
     */
    static Credentials load(Path givenFile, Path besidePool, GroupPrincipal group) throws IOException {
        if (givenFile != null) {
            return new Credentials(Secrets.read(givenFile, "--auth-token-file"), givenFile, false);
        }
        byte[] raw = new byte[32];
        new SecureRandom().nextBytes(raw);
        byte[] token = HexFormat.of().formatHex(raw).getBytes(StandardCharsets.US_ASCII);
        Path file = Path.of(besidePool + ".token");
        if (Files.isSymbolicLink(file)) {
            throw new InvalidArgumentException("token path " + file + " is a symbolic link; refusing to write through it");
        }
        // Written to a private temporary file and renamed over, so no reader ever sees a
        // partial token or a moment of wider permissions.
        Path tmp = Files.createTempFile(file.getParent(), ".pegaflow-token", ".tmp",
                PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rw-------")));
        try {
            Files.write(tmp, token);
            if (group != null) {
                Files.getFileAttributeView(tmp, PosixFileAttributeView.class).setGroup(group);
                Files.setPosixFilePermissions(tmp, PosixFilePermissions.fromString("rw-r-----"));
            }
            Files.move(tmp, file, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
        } finally {
            Files.deleteIfExists(tmp);
        }
        return new Credentials(token, file, true);
    }

    Path tokenFile() {
        return tokenFile;
    }

    /** Constant time, whatever the caller sent. */
    boolean matches(String authorization) {
        String prefix = "Bearer ";
        byte[] given = authorization.startsWith(prefix)
                ? authorization.substring(prefix.length()).getBytes(StandardCharsets.UTF_8) : new byte[0];
        return MessageDigest.isEqual(given, token);
    }

    /** The local socket's first frame: the token bytes as the client read them. */
    boolean matches(byte[] presented) {
        return MessageDigest.isEqual(presented, token);
    }

    @Override
    public <Q, R> ServerCall.Listener<Q> interceptCall(ServerCall<Q, R> call, Metadata headers,
            ServerCallHandler<Q, R> next) {
        if (!call.getMethodDescriptor().getFullMethodName().equals(EngineGrpc.getHealthMethod().getFullMethodName())) {
            String why = check.refuse(headers);
            if (why != null) {
                Metadata trailers = new Metadata();
                trailers.put(Errors.CODE, Integer.toString(ErrorCode.PERMISSION_DENIED.value()));
                call.close(Status.UNAUTHENTICATED.withDescription(why), trailers);
                return new ServerCall.Listener<>() {};
            }
        }
        Caller caller;
        try {
            caller = Caller.of(headers.get(Headers.CLIENT_ID), headers.get(Headers.JOIN_SECRET));
        } catch (InvalidArgumentException bad) {
            io.grpc.StatusRuntimeException refused = Errors.toStatus(bad);
            call.close(refused.getStatus(), refused.getTrailers());
            return new ServerCall.Listener<>() {};
        }
        return Contexts.interceptCall(Context.current().withValue(CALLER, caller), call, headers, next);
    }

    /** Deletes the token file if this server wrote it. */
    void close() {
        if (ownsTokenFile) {
            try {
                Files.deleteIfExists(tokenFile);
            } catch (IOException e) {
                System.getLogger(Credentials.class.getName()).log(System.Logger.Level.WARNING,
                        "could not delete " + tokenFile + ": " + e);
            }
        }
    }
}
