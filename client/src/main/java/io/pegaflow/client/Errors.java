package io.pegaflow.client;

import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.pegaflow.engine.EngineClosedException;
import io.pegaflow.engine.ErrorCode;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.PegaflowException;
import io.pegaflow.engine.PermissionDeniedException;
import io.pegaflow.engine.PoolExhaustedException;
import io.pegaflow.engine.RegistrationIncompleteException;
import io.pegaflow.engine.ServerUnavailableException;
import io.pegaflow.engine.TopologyMismatchException;
import io.pegaflow.engine.UnknownInstanceException;
import io.pegaflow.engine.UnknownLeaseException;

/**
 * Engine errors across gRPC, both ways: the server answers a gRPC status with the message
 * as description and the exact {@link ErrorCode} in a trailer; the client turns that back
 * into the same typed exception. Transport failures become {@link ServerUnavailableException}.
 */
public final class Errors {
    public static final Metadata.Key<String> CODE = Metadata.Key.of("pegaflow-error-code", Metadata.ASCII_STRING_MARSHALLER);
    /**
     * Most bytes of an error message the server sends, as gRPC percent-encodes it in the
     * grpc-message trailer (well inside the client's 8 KiB metadata limit, so one client's
     * long input can never turn another client's error into a transport failure).
     */
    public static final int MAX_MESSAGE_BYTES = 4096;

    private Errors() {}

    /**
     * {@code message} cut to at most {@link #MAX_MESSAGE_BYTES} once percent-encoded (printable
     * ASCII but '%' 1 byte, anything else 3 per UTF-8 byte), ending in "..." when cut.
     */
    public static String bounded(String message) {
        if (message == null) {
            return null;
        }
        long cost = 0;
        int cut = -1;
        for (int i = 0; i < message.length(); ) {
            int cp = message.codePointAt(i);
            cost += cp >= 0x20 && cp < 0x7f && cp != '%' ? 1
                    : 3L * (cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4);
            if (cut < 0 && cost > MAX_MESSAGE_BYTES - 3) {
                cut = i;
            }
            if (cost > MAX_MESSAGE_BYTES) {
                return message.substring(0, cut) + "...";
            }
            i += Character.charCount(cp);
        }
        return message;
    }

    /** Server side: the status for an engine exception (or any other throwable), its message {@link #bounded}. */
    public static StatusRuntimeException toStatus(Throwable t) {
        Metadata trailers = new Metadata();
        if (t instanceof PegaflowException e) {
            trailers.put(CODE, Integer.toString(e.code().value()));
            Status status = switch (e.code()) {
                case INVALID_ARGUMENT -> Status.INVALID_ARGUMENT;
                case UNKNOWN_INSTANCE, UNKNOWN_LEASE, REGISTRATION_INCOMPLETE, TOPOLOGY_MISMATCH -> Status.FAILED_PRECONDITION;
                case POOL_EXHAUSTED -> Status.RESOURCE_EXHAUSTED;
                case CLOSED, UNAVAILABLE -> Status.UNAVAILABLE;
                case PERMISSION_DENIED -> Status.PERMISSION_DENIED;
                case TIMEOUT -> Status.DEADLINE_EXCEEDED;
                default -> Status.INTERNAL;
            };
            return status.withDescription(bounded(e.getMessage())).asRuntimeException(trailers);
        }
        trailers.put(CODE, Integer.toString(ErrorCode.INTERNAL.value()));
        return Status.INTERNAL.withDescription(bounded(t.getClass().getName() + ": " + t.getMessage())).withCause(t)
                .asRuntimeException(trailers);
    }

    /** Client side: the typed exception for a failed call to {@code endpoint}. */
    public static PegaflowException fromStatus(StatusRuntimeException e, String endpoint, long deadlineMs) {
        Status status = e.getStatus();
        String description = status.getDescription() == null ? status.getCode().name() : status.getDescription();
        Metadata trailers = e.getTrailers();
        String code = trailers == null ? null : trailers.get(CODE);
        if (code != null) {
            return byCode(Integer.parseInt(code), description);
        }
        return switch (status.getCode()) {
            case UNAVAILABLE -> new ServerUnavailableException("pegaflow-server at " + endpoint + " is unreachable ("
                    + description + "); start it with `pegaflow-server` or check --addr", e);
            case DEADLINE_EXCEEDED -> new ServerUnavailableException("pegaflow-server at " + endpoint
                    + " did not answer within " + deadlineMs + " ms", e);
            case RESOURCE_EXHAUSTED, INVALID_ARGUMENT -> new InvalidArgumentException("pegaflow-server at " + endpoint
                    + " refused the request: " + description);
            case FAILED_PRECONDITION -> new PegaflowException(ErrorCode.TOPOLOGY_MISMATCH, description);
            case UNAUTHENTICATED, PERMISSION_DENIED -> new PermissionDeniedException("pegaflow-server at " + endpoint
                    + " refused the call: " + description);
            default -> new PegaflowException(ErrorCode.INTERNAL, "pegaflow-server at " + endpoint + ": " + status.getCode()
                    + ": " + description, e);
        };
    }

    public static PegaflowException byCode(int value, String message) {
        for (ErrorCode c : ErrorCode.values()) {
            if (c.value() == value) {
                return switch (c) {
                    case INVALID_ARGUMENT -> new InvalidArgumentException(message);
                    case UNKNOWN_INSTANCE -> new UnknownInstanceException(message);
                    case UNKNOWN_LEASE -> new UnknownLeaseException(message);
                    case REGISTRATION_INCOMPLETE -> new RegistrationIncompleteException(message);
                    case TOPOLOGY_MISMATCH -> new TopologyMismatchException(message);
                    case POOL_EXHAUSTED -> new PoolExhaustedException(message);
                    case CLOSED -> new EngineClosedException(message);
                    case PERMISSION_DENIED -> new PermissionDeniedException(message);
                    default -> new PegaflowException(c, message);
                };
            }
        }
        return new PegaflowException(ErrorCode.INTERNAL, message);
    }
}
