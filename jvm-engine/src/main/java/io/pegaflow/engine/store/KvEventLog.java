package io.pegaflow.engine.store;

import io.pegaflow.engine.InvalidArgumentException;
import java.util.ArrayList;
import java.util.List;

/**
 * What happened to the store's blocks, for routers that place a request where its prefix is
 * cached: a block stored in a tier or removed from it, with its namespace and vLLM's block
 * hash, numbered in order. A bounded ring: appending never waits for a reader, and a reader
 * that falls more than the ring's capacity behind is told so ({@link Batch#gap}) and resumes
 * at the oldest event kept. Any thread: the store appends under its lock, the SSD tier from its
 * writer threads.
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

    /**
     * The tier a block entered or left: host memory ({@code CPU}, vLLM's medium name), the SSD
     * tier, or the cluster ({@code REMOTE}: advertised to other hosts, or withdrawn).
     */
    public static final String CPU = "CPU";
    public static final String SSD = "SSD";
    public static final String REMOTE = "REMOTE";

    /** One event; {@code seq} counts from 1 over the store's life. */
    public record Event(long seq, Kind kind, String tier, String namespace, byte[] hash, long epochMillis) {}

    /**
     * Events after the one asked for, in order; {@code next} is what to ask after next time;
     * {@code gap} when events between were dropped from the ring before this reader came.
     */
    public record Batch(List<Event> events, long next, boolean gap) {}

    /** The most events one read returns. */
    public static final int MAX_READ = 10_000;
    /** Events one filtered read may look at, per event it may return. */
    public static final int SCAN_PER_EVENT = 8;

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
    public Batch after(long after, int max) {
        return after(after, max, null);
    }

    /**
     * {@link #after(long, int)} of one namespace's events ({@code null}: every namespace). The
     * reader resumes at {@code next} either way: events of other namespaces it skipped are not
     * read again, and {@code gap} says events were dropped from the ring, of any namespace. One
     * read looks at most {@link #SCAN_PER_EVENT} x {@code max} events: the store appends under
     * its own lock and waits for this monitor, so a reader of a quiet namespace behind a busy
     * one gets fewer events per read (and asks again from {@code next}), never a long hold.
     */
    public synchronized Batch after(long after, int max, String namespace) {
        if (after < 0 || max < 1 || max > MAX_READ) {
            throw new InvalidArgumentException("events after " + after + ", at most " + max + "; expected after >= 0 and 1.."
                    + MAX_READ + " events");
        }
        long oldest = Math.max(1, nextSeq - ring.length);
        long from = Math.max(after + 1, oldest);
        boolean gap = after + 1 < oldest;
        List<Event> out = new ArrayList<>((int) Math.min(max, Math.max(0, nextSeq - from)));
        long s = from;
        long scanEnd = from + (long) max * SCAN_PER_EVENT;
        for (; s < nextSeq && s < scanEnd && out.size() < max; s++) {
            Event e = ring[(int) (s % ring.length)];
            if (namespace == null || namespace.equals(e.namespace())) {
                out.add(e);
            }
        }
        long next = Math.max(after, s - 1);
        return new Batch(out, next, gap);
    }
}
