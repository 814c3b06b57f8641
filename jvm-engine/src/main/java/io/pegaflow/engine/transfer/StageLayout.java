package io.pegaflow.engine.transfer;

/**
 * Where a load's pool side goes in a staging buffer ({@link Stager}): the pool stretches the
 * load reads, in the order its pieces read them, grouped as its layer-wise batch is (one group
 * per layer group), each stretch placed right after the one before. A piece of the load lies
 * inside one stretch of its group, so its staged address follows from its pool offset ({@link
 * Cursor}), whatever its destination is: the layout is known before vLLM allocates the blocks
 * the load writes. A layout may be laid a group at a time ({@link #lazy}, {@link #lay}): a
 * group's stretches are read only once its copies were queued (the staging thread lays them
 * before that; readers wait for the group, {@code StagedLoad.awaitQueued}).
 */
public final class StageLayout {
    /**
     * Lays a lazily made layout's groups ({@link #lazy}): group {@code g}'s stretches as pool
     * offsets and lengths into {@code host} and {@code len} from index {@code at} on, returning
     * the index after its last one. Groups are asked for in order, each once.
     */
    @FunctionalInterface
    public interface Groups {
        int lay(int g, long[] host, long[] len, int at);
    }

    private final long[] stretchHost;
    private final long[] stretchLen;
    private final long[] stretchAt;
    private final int[] groupEnds;
    private final long totalBytes;
    /** Null once every group is laid. */
    private Groups source;
    /** Groups laid so far, and their bytes; written on the staging thread only ({@link #lay}). */
    private int laid;
    private long laidBytes;

    /**
     * A layout laid in full.
     *
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
        int k = 0;
        for (int g = 0; g < groupEnds.length; g++) {
            k = place(k, groupEnds[g], Long.MAX_VALUE);
        }
        this.laid = groupEnds.length;
        this.totalBytes = laidBytes;
    }

    private StageLayout(int groups, int maxStretches, long totalBytes, Groups source) {
        this.stretchHost = new long[maxStretches];
        this.stretchLen = new long[maxStretches];
        this.stretchAt = new long[maxStretches];
        this.groupEnds = new int[groups];
        this.totalBytes = totalBytes;
        this.source = source;
    }

    /**
     * A layout of {@code groups} groups, at most {@code maxStretches} stretches and {@code
     * totalBytes} in all, each group laid by {@code source} when {@link #lay} asks for it: the
     * staging thread queues a group's copies right after laying it, so the first copy waits for
     * one group's layout, not the whole load's, and the rest is laid while the copies run.
     */
    public static StageLayout lazy(int groups, int maxStretches, long totalBytes, Groups source) {
        if (groups < 1 || maxStretches < groups || totalBytes <= 0) {
            throw new IllegalArgumentException("staging layout of " + groups + " groups, " + maxStretches + " stretches, "
                    + totalBytes + " bytes; expected >= 1 group, >= 1 stretch a group and > 0 bytes");
        }
        return new StageLayout(groups, maxStretches, totalBytes, source);
    }

    /**
     * Lays group {@code g} (on the staging thread, before its copies are queued; a group laid
     * already is left as it is): groups in order, each stretch of positive length, never past the
     * layout's bytes (so never past the staging buffer), and the last group ending exactly there.
     */
    public void lay(int g) {
        if (g < laid) {
            return;
        }
        if (g != laid) {
            throw new IllegalStateException("staging group " + g + " laid after " + laid + " groups; expected groups in order");
        }
        int from = groupStart(g);
        int end = source.lay(g, stretchHost, stretchLen, from);
        if (end < from || end > stretchHost.length) {
            throw new IllegalStateException("staging group " + g + " ends at stretch " + end + " after " + from + " of at most "
                    + stretchHost.length + "; expected within them");
        }
        place(from, end, totalBytes);
        groupEnds[g] = end;
        laid++;
        if (laid == groupEnds.length) {
            source = null;
            if (laidBytes != totalBytes) {
                throw new IllegalStateException("staging layout of " + laidBytes + " bytes for a load of " + totalBytes
                        + "; expected equal");
            }
        }
    }

    /** Places stretches {@code [from, end)} after the bytes laid so far, refusing any past {@code limit}; returns {@code end}. */
    private int place(int from, int end, long limit) {
        long at = laidBytes;
        for (int k = from; k < end; k++) {
            if (stretchLen[k] <= 0) {
                throw new IllegalArgumentException("stretch " + k + " of " + stretchLen[k] + " bytes; expected > 0");
            }
            if (stretchLen[k] > limit - at) {
                throw new IllegalStateException("staging stretch " + k + " of " + stretchLen[k] + " bytes at " + at
                        + " passes the layout's " + limit + " bytes");
            }
            stretchAt[k] = at;
            at += stretchLen[k];
        }
        laidBytes = at;
        return end;
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

    /** Bytes of the whole layout (a lazy one's as given; {@link #lay} holds its groups to it). */
    public long totalBytes() {
        return totalBytes;
    }

    /** Groups laid so far ({@link #groups} once all are). */
    public int laidGroups() {
        return laid;
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
