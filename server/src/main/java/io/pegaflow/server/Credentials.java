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
 * <p>Shutdown and the HTTP {@code /admin} calls ({@link AdminEndpoints}) are the operator's: they
 * need a second secret, {@code <pool>.operator-token} (always 0600, never the pool group's) or
 * {@code --operator-token-file}, and the tenants' token is refused for them. Refused calls are counted and logged once per interval ({@link Rejections}).
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
    private final Path operatorFile;
    private final boolean ownsOperatorFile;
    private final byte[] operatorToken;
    private volatile Rejections rejections = new Rejections();

    private Credentials(byte[] token, Path tokenFile, boolean ownsTokenFile, byte[] operatorToken, Path operatorFile,
            boolean ownsOperatorFile) {
        this.token = token;
        this.tokenFile = tokenFile;
        this.ownsTokenFile = ownsTokenFile;
        this.operatorToken = operatorToken;
        this.operatorFile = operatorFile;
        this.ownsOperatorFile = ownsOperatorFile;
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
     * pool is shared with a group: its members' clients must read it); and the operator's
     * token (Shutdown) in {@code operatorFile}, or a new one in {@code besidePool +
     * ".operator-token"}, always 0600: the server's user alone, never the pool group.
     */
    static Credentials load(Path givenFile, Path besidePool, GroupPrincipal group, Path operatorFile) throws IOException {
        byte[] token;
        Path file;
        if (givenFile != null) {
            token = Secrets.read(givenFile, "--auth-token-file");
            file = givenFile;
        } else {
            file = Path.of(besidePool + ".token");
            token = write(file, group);
        }
        try {
            byte[] operator;
            Path opFile;
            if (operatorFile != null) {
                operator = Secrets.read(operatorFile, "--operator-token-file");
                opFile = operatorFile;
            } else {
                opFile = Path.of(besidePool + ".operator-token");
                operator = write(opFile, null);
            }
            if (MessageDigest.isEqual(operator, token)) {
                throw new InvalidArgumentException("--operator-token-file " + opFile + " holds the tenants' token; expected "
                        + "a secret of the operator's own (Shutdown must not be open to every tenant)");
            }
            return new Credentials(token, file, givenFile == null, operator, opFile, operatorFile == null);
        } catch (IOException | RuntimeException e) {
            if (givenFile == null) {
                Files.deleteIfExists(file); // a refused start leaves only what it found
            }
            throw e;
        }
    }

    /** Compatibility for callers without an operator file: one is generated beside the pool. */
    static Credentials load(Path givenFile, Path besidePool, GroupPrincipal group) throws IOException {
        return load(givenFile, besidePool, group, null);
    }

    /** A new secret (32 random bytes, hex) in {@code file}: 0600, or 0640 with {@code group}. */
    private static byte[] write(Path file, GroupPrincipal group) throws IOException {
        byte[] raw = new byte[32];
        new SecureRandom().nextBytes(raw);
        byte[] secret = HexFormat.of().formatHex(raw).getBytes(StandardCharsets.US_ASCII);
        if (Files.isSymbolicLink(file)) {
            throw new InvalidArgumentException("token path " + file + " is a symbolic link; refusing to write through it");
        }
        // Written to a private temporary file and renamed over, so no reader ever sees a
        // partial token or a moment of wider permissions.
        Path tmp = Files.createTempFile(file.getParent(), ".pegaflow-token", ".tmp",
                PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rw-------")));
        try {
            Files.write(tmp, secret);
            if (group != null) {
                Files.getFileAttributeView(tmp, PosixFileAttributeView.class).setGroup(group);
                Files.setPosixFilePermissions(tmp, PosixFilePermissions.fromString("rw-r-----"));
            }
            Files.move(tmp, file, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
        } finally {
            Files.deleteIfExists(tmp);
        }
        return secret;
    }

    /** Where refusals are counted (the server's; a fresh one until it is set). */
    void rejections(Rejections r) {
        this.rejections = r;
    }

    /** The file holding the operator's secret (the one Shutdown and /admin need). */
    Path operatorFile() {
        return operatorFile;
    }

    Path tokenFile() {
        return tokenFile;
    }

    Path operatorTokenFile() {
        return operatorFile;
    }

    /** Constant time, whatever the caller sent. */
    boolean matches(String authorization) {
        return MessageDigest.isEqual(bearer(authorization), token);
    }

    /** Whom an {@code authorization} value speaks for on the operator's calls (Shutdown, HTTP /admin). */
    enum Holder {
        OPERATOR,
        /** The tenants' token: refused for the operator's calls as PERMISSION_DENIED (HTTP 403). */
        TENANT,
        /** No credential or a wrong one (UNAUTHENTICATED, HTTP 401). */
        NOBODY
    }

    /** Constant time, whatever the caller sent; null is {@link Holder#NOBODY}. */
    Holder holder(String authorization) {
        if (authorization == null) {
            return Holder.NOBODY;
        }
        if (MessageDigest.isEqual(bearer(authorization), operatorToken)) {
            return Holder.OPERATOR;
        }
        return matches(authorization) ? Holder.TENANT : Holder.NOBODY;
    }

    private static byte[] bearer(String authorization) {
        String prefix = "Bearer ";
        return authorization.startsWith(prefix)
                ? authorization.substring(prefix.length()).getBytes(StandardCharsets.UTF_8) : new byte[0];
    }

    /** The local socket's first frame: the token bytes as the client read them. */
    boolean matches(byte[] presented) {
        return MessageDigest.isEqual(presented, token);
    }

    private static final String SHUTDOWN = EngineGrpc.getShutdownMethod().getFullMethodName();
    private static final String HEALTH = EngineGrpc.getHealthMethod().getFullMethodName();

    @Override
    public <Q, R> ServerCall.Listener<Q> interceptCall(ServerCall<Q, R> call, Metadata headers,
            ServerCallHandler<Q, R> next) {
        String method = call.getMethodDescriptor().getFullMethodName();
        if (method.equals(SHUTDOWN)) {
            // The operator's alone: the tenants' token is refused as any other wrong one.
            String auth = headers.get(Headers.AUTHORIZATION);
            Holder holder = holder(auth);
            if (holder != Holder.OPERATOR) {
                boolean tenant = holder == Holder.TENANT;
                rejections.record(tenant ? Rejections.Reason.OPERATOR_ONLY : Rejections.Reason.UNAUTHENTICATED, "Shutdown");
                return refuse(call, tenant ? Status.PERMISSION_DENIED : Status.UNAUTHENTICATED,
                        tenant ? "Shutdown is the operator's: it needs the operator token (" + operatorFile
                                + ", the server's user only), not the tenants' token"
                                : auth == null ? "no credential: Shutdown needs the operator token (" + operatorFile + ")"
                                : "wrong credential");
            }
            return next.startCall(call, headers);
        }
        if (!method.equals(HEALTH)) {
            String why = check.refuse(headers);
            if (why != null) {
                rejections.record(Rejections.Reason.UNAUTHENTICATED, call.getMethodDescriptor().getBareMethodName());
                return refuse(call, Status.UNAUTHENTICATED, why);
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

    private static <Q, R> ServerCall.Listener<Q> refuse(ServerCall<Q, R> call, Status status, String why) {
        Metadata trailers = new Metadata();
        trailers.put(Errors.CODE, Integer.toString(ErrorCode.PERMISSION_DENIED.value()));
        call.close(status.withDescription(why), trailers);
        return new ServerCall.Listener<>() {};
    }

    /** Deletes the token files this server wrote. */
    void close() {
        java.util.List<Path> owned = new java.util.ArrayList<>();
        if (ownsTokenFile) {
            owned.add(tokenFile);
        }
        if (ownsOperatorFile) {
            owned.add(operatorFile);
        }
        for (Path p : owned) {
            try {
                Files.deleteIfExists(p);
            } catch (IOException e) {
                System.getLogger(Credentials.class.getName()).log(System.Logger.Level.WARNING,
                        "could not delete " + p + ": " + e);
            }
        }
    }
}
