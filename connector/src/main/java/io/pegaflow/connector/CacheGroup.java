package io.pegaflow.connector;

import io.pegaflow.engine.InvalidArgumentException;

/**
 * One KV-cache group of vLLM's hybrid KV cache manager, as the connector stores it: its own
 * store instance (so its own namespace and slot geometry: a group's layers are the only ones
 * its blocks hold), what a hit needs from it, and how it is saved.
 *
 * <ul>
 *   <li>{@link Kind#FULL}: full attention (or MLA). A hit of {@code k} blocks needs every block
 *       before {@code k}; every completed block is saved.
 *   <li>{@link Kind#SLIDING}: sliding-window attention of {@code windowTokens} (vLLM's window
 *       plus the tokens it retains beyond it). A hit of {@code k} blocks needs only the blocks
 *       holding tokens {@code [k*bs - window + 1, k*bs)}, which are the only ones vLLM allocates
 *       there (the earlier ones are its null block); completed blocks are saved while vLLM
 *       still holds them, never its null block.
 *   <li>{@link Kind#RECURRENT}: Mamba / linear attention in vLLM's {@code align} mode. The state
 *       after {@code k*bs} tokens sits in block {@code k-1}; a hit of {@code k} blocks needs that
 *       one state and loads only it. A state is saved at each step that ends on a block
 *       boundary (the checkpoints vLLM makes).
 * </ul>
 */
public record CacheGroup(String instanceId, Kind kind, int windowTokens) {
    /** What a group keeps per token; see the class comment. */
    public enum Kind {
        FULL, SLIDING, RECURRENT;

        /** The C ABI's code: 0 full, 1 sliding window, 2 recurrent. */
        public static Kind of(int code) {
            return switch (code) {
                case 0 -> FULL;
                case 1 -> SLIDING;
                case 2 -> RECURRENT;
                default -> throw new InvalidArgumentException("KV-cache group kind " + code
                        + "; expected 0 (full attention), 1 (sliding window) or 2 (recurrent state, Mamba align mode)");
            };
        }
    }

    public CacheGroup {
        if (instanceId == null || instanceId.isEmpty()) {
            throw new InvalidArgumentException("KV-cache group instance id '" + instanceId + "'; expected a non-empty id");
        }
        if (kind == null) {
            throw new InvalidArgumentException("KV-cache group kind is null; expected FULL, SLIDING or RECURRENT");
        }
        if (kind == Kind.SLIDING ? windowTokens < 1 : windowTokens != 0) {
            throw new InvalidArgumentException("KV-cache group " + instanceId + " (" + kind + "): window " + windowTokens
                    + " tokens; expected " + (kind == Kind.SLIDING ? ">= 1" : "0 (only sliding-window groups have one)"));
        }
    }

    public static CacheGroup full(String instanceId) {
        return new CacheGroup(instanceId, Kind.FULL, 0);
    }

    /**
     * The first block (absolute index) a hit ending at block {@code end} needs from this group:
     * 0 for full attention, {@code end - 1} for a recurrent state, and for a sliding window
     * the block of the oldest token the next one attends to (vLLM's
     * {@code get_num_skipped_tokens}: {@code end*bs - window + 1}, rounded down to a block).
     */
    public int firstNeeded(int end, int blockSize) {
        return switch (kind) {
            case FULL -> 0;
            case RECURRENT -> end - 1;
            case SLIDING -> (int) (Math.max(0L, (long) end * blockSize - windowTokens + 1) / blockSize);
        };
    }

    /** Saves of this group read blocks vLLM frees before the request ends: they finish within their step. */
    public boolean savesWithinStep() {
        return kind != Kind.FULL;
    }
}
