package io.pegaflow.engine.transfer;

import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Piece arrays of large copy batches ({@link CopyBatch}), handed back once a batch's copies
 * ended ({@link CopyBatch#release}) and given to the next batch of that size. A warm 16K-token
 * load of a Llama-3.1-8B-shaped model lists 65,536 pieces, three longs each, and its save as
 * many. Allocated anew each time, that array alone filled the small young generation of the JVM
 * inside vLLM's process (its heap starts small, docs/bridge.md) within a request or two, and
 * each collection stops every Java thread for its length: the copy lane's thread between the
 * layers it queues, vLLM's thread in {@code wait_for_layer_load} (docs/benchmarks/README.md, the
 * nineteenth GPU run and the probe's figures under "JMH micro-benchmarks").
 *
 * <p>Arrays of {@link #MIN_LONGS} longs or more are kept by power-of-two length, at most
 * {@link #PER_LENGTH} of each and {@link #MAX_KEPT_BYTES} together; smaller batches allocate
 * as before (a young collection takes them cheaply). Thread-safe.
 */
public final class PieceArrays {
    /** Smallest array kept (64 KiB: 2,730 pieces). */
    public static final int MIN_LONGS = 1 << 13;
    /** Largest array kept (32 MiB: a batch of 1,048,576 pieces, the most {@code CopyBatches} sizes one for). */
    static final int MAX_LONGS = 1 << 22;
    /** Arrays of one length kept at most: loads and saves of several requests at once. */
    static final int PER_LENGTH = 4;
    /** Bytes of arrays kept at most, all lengths together. */
    static final long MAX_KEPT_BYTES = 64L << 20;

    private static final int MIN_SHIFT = Integer.numberOfTrailingZeros(MIN_LONGS);
    private static final int MAX_SHIFT = Integer.numberOfTrailingZeros(MAX_LONGS);
    @SuppressWarnings("unchecked")
    private static final ArrayBlockingQueue<long[]>[] FREE = new ArrayBlockingQueue[MAX_SHIFT - MIN_SHIFT + 1];
    private static final AtomicLong KEPT_BYTES = new AtomicLong();
    private static final AtomicLong REUSED = new AtomicLong();

    static {
        for (int i = 0; i < FREE.length; i++) {
            FREE[i] = new ArrayBlockingQueue<>(PER_LENGTH);
        }
    }

    private PieceArrays() {}

    /** An array of at least {@code longs} longs: a kept one where there is one, else a new one (rounded up to a power of two when it may be kept). */
    static long[] take(int longs) {
        int shift = shiftFor(longs);
        if (shift < 0) {
            return new long[longs];
        }
        long[] kept = FREE[shift - MIN_SHIFT].poll();
        if (kept != null) {
            KEPT_BYTES.addAndGet(-8L * kept.length);
            REUSED.incrementAndGet();
            return kept;
        }
        return new long[1 << shift];
    }

    /** Keeps {@code array} for a later {@link #take} where its length is one kept and there is room; else drops it. */
    static void give(long[] array) {
        int n = array.length;
        int shift = shiftFor(n);
        if (shift < 0 || n != 1 << shift) { // only the lengths take hands out
            return;
        }
        long bytes = 8L * n;
        if (KEPT_BYTES.addAndGet(bytes) > MAX_KEPT_BYTES) {
            KEPT_BYTES.addAndGet(-bytes);
            return;
        }
        if (!FREE[shift - MIN_SHIFT].offer(array)) {
            KEPT_BYTES.addAndGet(-bytes);
        }
    }

    /** Whether a batch sized for {@code longs} longs takes its array from here (and so gives it back on release). */
    static boolean kept(int longs) {
        return shiftFor(longs) >= 0;
    }

    /** Arrays handed out again since the process started (the batches that allocated no array). */
    public static long reused() {
        return REUSED.get();
    }

    /** Bytes of arrays kept now. */
    public static long keptBytes() {
        return KEPT_BYTES.get();
    }

    /** log2 of the kept length for {@code longs}, or -1 when such an array is not kept. */
    private static int shiftFor(int longs) {
        if (longs < MIN_LONGS || longs > MAX_LONGS) {
            return -1;
        }
        return 32 - Integer.numberOfLeadingZeros(longs - 1);
    }
}
