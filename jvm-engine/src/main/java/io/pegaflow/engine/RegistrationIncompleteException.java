package io.pegaflow.engine;

/** The instance's topology is not sealed yet: not every worker has registered. */
public final class RegistrationIncompleteException extends PegaflowException {
    public RegistrationIncompleteException(String message) {
        super(ErrorCode.REGISTRATION_INCOMPLETE, message);
    }
}
