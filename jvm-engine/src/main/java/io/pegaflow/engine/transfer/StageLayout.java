package io.pegaflow.engine.transfer;

/**
 * Where a load's pool side goes in a staging buffer ({@link Stager}): the pool stretches the
 * load reads, in the order its pieces read them, grouped as its layer-wise batch is (one group
 * per layer group), each stretch placed right after the one before. A piece of the load lies
 * inside one stretch of its group, so its staged address follows from its pool offset ({@link
 * Cursor}), whatever its destination is: the layout is known before vLLM allocates the blocks
 * the load writes.
 */
public final class StageLayout {
    private final long[] stretchHost;
    private final long[] stretchLen;
    private final long[] stretchAt;
    private final int[] groupEnds;
    private final long totalBytes;

    /**
     * @param stretchHost pool offset of each stretch
     * @param stretchLen  bytes of each stretch (positive)
     * @param groupEnds   one past the last stretch of each group, ascending, the last one the stretch count
     */
    public StageLayout(long[] stretchHost, long[] stretchLen, int[] groupEnds) {
        if (stretchHost.length != stretchLen.length) {
            throw new IllegalArgumentException(stretchHost.length + " stretch offsets for " + stretchLen.length
                    + " lengths; expected equal counts");
        }
        int previous = 0;
        for (int end : groupEnds) {
            if (end < previous || end > stretchHost.length) {
                throw new IllegalArgumentException("group end " + end + " after " + previous + " of "
                        + stretchHost.length + " stretches; expected ascending ends within the stretches");
            }
            previous = end;
        }
        if (previous != stretchHost.length) {
            throw new IllegalArgumentException("groups end at stretch " + previous + " of " + stretchHost.length
                    + "; expected every stretch in a group");
        }
        this.stretchHost = stretchHost;
        this.stretchLen = stretchLen;
        this.groupEnds = groupEnds;
        this.stretchAt = new long[stretchHost.length];
        long at = 0;
        for (int k = 0; k < stretchHost.length; k++) {
            if (stretchLen[k] <= 0) {
                throw new IllegalArgumentException("stretch " + k + " of " + stretchLen[k] + " bytes; expected > 0");
            }
            stretchAt[k] = at;
            at += stretchLen[k];
        }
        this.totalBytes = at;
    }

    public int groups() {
        return groupEnds.length;
    }

    /** First stretch of group {@code g}. */
    public int groupStart(int g) {
        return g == 0 ? 0 : groupEnds[g - 1];
    }

    /** One past the last stretch of group {@code g}. */
    public int groupEnd(int g) {
        return groupEnds[g];
    }

    public long stretchHost(int k) {
        return stretchHost[k];
    }

    public long stretchLen(int k) {
        return stretchLen[k];
    }

    /** Offset of stretch {@code k} in the staging buffer. */
    public long stretchAt(int k) {
        return stretchAt[k];
    }

    public long totalBytes() {
        return totalBytes;
    }

    /** A cursor over one batch's pieces, group by group, in the order the layout was made from. */
    public Cursor cursor() {
        return new Cursor();
    }

    /**
     * Maps the pieces of a load, in batch order, to their offsets in the staging buffer: each
     * piece lies in the group's current stretch or a later one, so the walk only goes forward.
     */
    public final class Cursor {
        private int k;
        private int end;

        /** Moves to group {@code g}'s stretches. */
        public void group(int g) {
            if (g < 0 || g >= groupEnds.length) {
                throw new IllegalStateException("group " + g + " of a staged load of " + groupEnds.length
                        + " groups; the batch and its staging layout disagree");
            }
            k = groupStart(g);
            end = groupEnds[g];
        }

        /** The staging offset of the piece at pool offset {@code host}, {@code len} bytes. */
        public long offset(long host, long len) {
            while (k < end && (host < stretchHost[k] || host + len > stretchHost[k] + stretchLen[k])) {
                k++;
            }
            if (k == end) {
                throw new IllegalStateException("piece at pool offset " + host + " (" + len
                        + " bytes) is in no stretch left of its group; the batch and its staging layout disagree");
            }
            return stretchAt[k] + host - stretchHost[k];
        }
    }
}
