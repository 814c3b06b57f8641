package io.pegaflow.engine;

import java.time.Duration;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.LongSupplier;

/** A monotonic nanosecond clock that only moves when a test says so. */
final class FakeClock implements LongSupplier {
    private final AtomicLong now = new AtomicLong(1_000_000_000L);

    @Override
    public long getAsLong() {
        return now.get();
    }

    void advance(Duration d) {
        now.addAndGet(d.toNanos());
    }
}
