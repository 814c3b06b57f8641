package io.pegaflow.engine.store;

import io.pegaflow.engine.Token;
import java.util.List;

/**
 * Blocks pinned for a peer to read (docs/cluster.md): the leading {@code blocks()} of the
 * asked prefix, each slot's pool offset in slot order, the slot sizes of their namespace, and
 * each block's {@link BlockChecksum} where it is already known (-1 where it is not: the sender
 * sums it).
 * The pin lasts until {@link LocalStore#releaseTransfer} or its deadline, whichever is first;
 * {@code id} is unguessable and names nothing else.
 */
public record TransferPin(Token id, long[] slotBytes, List<long[]> slotOffsets, long[] checksums) {
    public int blocks() {
        return slotOffsets.size();
    }

    public long blockBytes() {
        long sum = 0;
        for (long s : slotBytes) {
            sum += s;
        }
        return sum;
    }
}
