package io.pegaflow.engine.cuda;

import io.pegaflow.engine.ErrorCode;
import io.pegaflow.engine.PegaflowException;

/**
 * A CUDA driver or NVRTC call failed (the message names the call, its arguments and the
 * driver's error name and text), or CUDA is not available on this machine.
 */
public final class CudaException extends PegaflowException {
    private final int result;

    public CudaException(String message, int result) {
        super(ErrorCode.CUDA, message);
        this.result = result;
    }

    public CudaException(String message, Throwable cause) {
        super(ErrorCode.CUDA, message, cause);
        this.result = -1;
    }

    /** The CUresult / nvrtcResult code, or -1 when no call was made. */
    public int result() {
        return result;
    }
}
