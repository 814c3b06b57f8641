package io.pegaflow.engine;

import java.util.ArrayList;
import java.util.List;

/**
 * What happened to the store's blocks, for routers that place a request where its prefix is
 * cached: a block stored in a tier or removed from it, with its namespace and vLLM's block
 * hash, numbered in order. A bounded ring: appending never waits for a reader, and a reader
 * that falls more than the ring's capacity behind is told so ({@link Batch#gap}) and resumes
 * at the oldest event kept. Any thread; appends come under the store's lock.
 */
public final class KvEventLog {
    /** vLLM's event names: {@code BlockStored} and {@code BlockRemoved}. */
    public enum Kind {
        STORED("BlockStored"), REMOVED("BlockRemoved");

        public final String vllmName;

        Kind(String vllmName) {
            this.vllmName = vllmName;
        }
    }

    /** The tier a block entered or left: host memory ({@code CPU}, vLLM's medium name) or the SSD tier. */
    public static final String CPU = "CPU";
    public static final String SSD = "SSD";

    /** One event; {@code seq} counts from 1 over the store's life. */
    public record Event(long seq, Kind kind, String tier, String namespace, byte[] hash, long epochMillis) {}

    /**
     * Events after the one asked for, in order; {@code next} is what to ask after next time;
     * {@code gap} when events between were dropped from the ring before this reader came.
     */
    public record Batch(List<Event> events, long next, boolean gap) {}

    /** The most events one read returns. */
    public static final int MAX_READ = 10_000;

    private final Event[] ring;
    private long nextSeq = 1;

    /** A log keeping the last {@code capacity} events (0: keeps none; every read is empty). */
    public KvEventLog(int capacity) {
        if (capacity < 0 || capacity > 1 << 24) {
            throw new InvalidArgumentException("KV event capacity " + capacity + "; expected 0..16777216");
        }
        this.ring = new Event[capacity];
    }

    synchronized void append(Kind kind, String tier, String namespace, byte[] hash) {
        if (ring.length == 0) {
            return;
        }
        long seq = nextSeq++;
        ring[(int) (seq % ring.length)] = new Event(seq, kind, tier, namespace, hash, System.currentTimeMillis());
    }

    /** Up to {@code max} events with a sequence number above {@code after} (0: from the oldest kept). */
    public synchronized Batch after(long after, int max) {
        if (after < 0 || max < 1 || max > MAX_READ) {
            throw new InvalidArgumentException("events after " + after + ", at most " + max + "; expected after >= 0 and 1.."
                    + MAX_READ + " events");
        }
        long oldest = Math.max(1, nextSeq - ring.length);
        long from = Math.max(after + 1, oldest);
        boolean gap = after + 1 < oldest;
        List<Event> out = new ArrayList<>((int) Math.min(max, Math.max(0, nextSeq - from)));
        for (long s = from; s < nextSeq && out.size() < max; s++) {
            out.add(ring[(int) (s % ring.length)]);
        }
        long next = out.isEmpty() ? Math.max(after, from - 1) : out.get(out.size() - 1).seq();
        return new Batch(out, next, gap);
    }
}
