package io.pegaflow.engine;

/**
 * The caller may not do this: a lease, copy or session of another instance, or a call to
 * pegaflow-server without its credential. Nothing was changed.
 */
public class PermissionDeniedException extends PegaflowException {
    public PermissionDeniedException(String message) {
        super(ErrorCode.PERMISSION_DENIED, message);
    }
}
