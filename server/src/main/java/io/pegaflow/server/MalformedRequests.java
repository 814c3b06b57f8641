package io.pegaflow.server;

import io.grpc.ForwardingServerCall;
import io.grpc.ForwardingServerCallListener;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.ServerCall;
import io.grpc.ServerCallHandler;
import io.grpc.ServerInterceptor;
import io.grpc.ServerMethodDefinition;
import io.grpc.ServerServiceDefinition;
import io.grpc.Status;
import io.pegaflow.client.Errors;
import io.pegaflow.engine.ErrorCode;
import java.io.InputStream;

/**
 * A request message that does not parse is answered INVALID_ARGUMENT ("malformed request")
 * and counted ({@link Rejections}), instead of grpc-java's UNKNOWN with a SEVERE stack trace
 * in the log per request (a thousand three-byte Health requests, which need no credential,
 * wrote megabytes of them). How: each method's request marshaller is wrapped so a parse
 * failure is noted for the calling thread (the transport thread that parses, then delivers)
 * and the message replaced by the default instance; the outermost listener sees the note and
 * closes the call instead of delivering. Every parse sets the note afresh, so one left by a
 * call that was closed earlier (refused credentials) never reaches another.
 */
final class MalformedRequests implements ServerInterceptor {
    private static final ThreadLocal<RuntimeException> FAILED = new ThreadLocal<>();

    private final Rejections rejections;

    private MalformedRequests(Rejections rejections) {
        this.rejections = rejections;
    }

    /** {@code service} (already intercepted) with guarded request parsing, its interceptor outermost. */
    static ServerServiceDefinition guard(ServerServiceDefinition service, Rejections rejections) {
        ServerServiceDefinition intercepted = io.grpc.ServerInterceptors.intercept(service, new MalformedRequests(rejections));
        ServerServiceDefinition.Builder b = ServerServiceDefinition.builder(intercepted.getServiceDescriptor().getName());
        for (ServerMethodDefinition<?, ?> m : intercepted.getMethods()) {
            b.addMethod(wrapped(m));
        }
        return b.build();
    }

    private static <Q, R> ServerMethodDefinition<Q, R> wrapped(ServerMethodDefinition<Q, R> m) {
        MethodDescriptor<Q, R> d = m.getMethodDescriptor();
        MethodDescriptor.Marshaller<Q> parse = d.getRequestMarshaller();
        Q empty = parse instanceof MethodDescriptor.PrototypeMarshaller<Q> p ? p.getMessagePrototype() : null;
        if (empty == null) {
            return m;
        }
        MethodDescriptor.Marshaller<Q> guarded = new MethodDescriptor.PrototypeMarshaller<>() {
            @Override
            public InputStream stream(Q value) {
                return parse.stream(value);
            }

            @Override
            public Q parse(InputStream in) {
                try {
                    Q q = parse.parse(in);
                    FAILED.remove();
                    return q;
                } catch (RuntimeException e) {
                    FAILED.set(e);
                    return empty;
                }
            }

            @Override
            public Q getMessagePrototype() {
                return empty;
            }

            @Override
            public Class<Q> getMessageClass() {
                return ((MethodDescriptor.PrototypeMarshaller<Q>) parse).getMessageClass();
            }
        };
        return ServerMethodDefinition.create(d.toBuilder(guarded, d.getResponseMarshaller()).build(), m.getServerCallHandler());
    }

    @Override
    public <Q, R> ServerCall.Listener<Q> interceptCall(ServerCall<Q, R> call, Metadata headers, ServerCallHandler<Q, R> next) {
        String method = call.getMethodDescriptor().getBareMethodName();
        boolean[] closed = {false};
        ServerCall<Q, R> tracked = new ForwardingServerCall.SimpleForwardingServerCall<>(call) {
            @Override
            public void close(Status status, Metadata trailers) {
                closed[0] = true;
                super.close(status, trailers);
            }
        };
        ServerCall.Listener<Q> inner = next.startCall(tracked, headers);
        return new ForwardingServerCallListener.SimpleForwardingServerCallListener<>(inner) {
            private boolean refused;

            @Override
            public void onMessage(Q message) {
                RuntimeException failed = FAILED.get();
                FAILED.remove();
                if (failed == null && !refused) {
                    super.onMessage(message);
                    return;
                }
                if (!refused) {
                    refused = true;
                    rejections.record(Rejections.Reason.MALFORMED, method + ": " + failed.getMessage());
                    if (!closed[0]) {
                        Metadata trailers = new Metadata();
                        trailers.put(Errors.CODE, Integer.toString(ErrorCode.INVALID_ARGUMENT.value()));
                        tracked.close(Status.INVALID_ARGUMENT.withDescription(Errors.bounded("malformed " + method
                                + " request: " + failed.getMessage())), trailers);
                    }
                }
            }

            @Override
            public void onHalfClose() {
                if (!refused) {
                    super.onHalfClose();
                }
            }

            @Override
            public void onReady() {
                if (!refused) {
                    super.onReady();
                }
            }
        };
    }
}
