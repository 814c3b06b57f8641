package io.pegaflow.bench;

import java.util.Comparator;
import java.util.concurrent.ConcurrentLinkedQueue;

/**
 * Submit and completion times of the worker's batches and its calls to the store, recorded
 * while a timed operation runs ({@link TimedTransfer}, {@link ServerProcess#attachTimed}):
 * where a server-mode save's or load's time went.
 */
final class Timeline {
    private record Event(long nanos, String what, long batchBytes) {}

    private final ConcurrentLinkedQueue<Event> events = new ConcurrentLinkedQueue<>();

    void clear() {
        events.clear();
    }

    /** {@code what}: "submit" (a batch of {@code batchBytes}), "done", or a store call's name ("/" before it: returned). */
    void add(String what, long batchBytes) {
        events.add(new Event(System.nanoTime(), what, batchBytes));
    }

    /** e.g. {@code reserveSave 41, /reserveSave 627, submit 697 (32 MiB), done 1587, ..., end 12096} in µs from t0. */
    String since(long t0, long end) {
        StringBuilder b = new StringBuilder();
        events.stream().sorted(Comparator.comparingLong(Event::nanos)).forEach(e -> b.append(e.what()).append(' ')
                .append((e.nanos() - t0) / 1000).append(e.what().equals("submit") ? " (" + (e.batchBytes() >> 20) + " MiB)" : "")
                .append(", "));
        return b.append("end ").append((end - t0) / 1000).toString();
    }
}
