package io.pegaflow.engine;

import java.util.Arrays;

/**
 * A copy between device regions and the host pool failed. Carries the destination (load) or
 * source (save) block ids that did not complete, so vLLM can recompute exactly those.
 */
public final class TransferFailedException extends PegaflowException {
    private final long[] blockIds;

    public TransferFailedException(String message, long[] blockIds, Throwable cause) {
        super(ErrorCode.TRANSFER_FAILED, message + " (block ids " + abbreviate(blockIds) + ")", cause);
        this.blockIds = blockIds.clone();
    }

    /** The block ids whose bytes are not valid. */
    public long[] blockIds() {
        return blockIds.clone();
    }

    private static String abbreviate(long[] ids) {
        if (ids.length <= 16) {
            return Arrays.toString(ids);
        }
        return Arrays.toString(Arrays.copyOf(ids, 16)).replace("]", ", ... " + (ids.length - 16) + " more]");
    }
}
