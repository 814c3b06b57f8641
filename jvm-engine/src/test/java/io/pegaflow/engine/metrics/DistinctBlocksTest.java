package io.pegaflow.engine.metrics;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.assertj.core.api.Assertions.within;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.InvalidArgumentException;
import java.nio.ByteBuffer;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** The hit-rate ceiling's sketch: distinct blocks and lookups over sliding windows. */
class DistinctBlocksTest {
    private static final long MIN = TimeUnit.MINUTES.toNanos(1);

    /** {@code n} 32-byte hashes numbered from {@code first}. */
    private static BlockHashes hashes(long first, int n) {
        ByteBuffer b = ByteBuffer.allocate(32 * n);
        for (int i = 0; i < n; i++) {
            b.putLong(first + i).putLong(0).putLong(0).putLong(first + i);
        }
        return new BlockHashes(b.array(), 32);
    }

    @Test
    void distinctBlocksAreEstimatedWithinAFewPercentAndRepeatsAreNotCounted() {
        DistinctBlocks d = DistinctBlocks.of(List.of("15m"));
        DistinctBlocks.Window w = d.windows().get(0);
        for (int q = 0; q < 100; q++) {
            d.observe("ns", hashes(q * 1000L, 1000), MIN);
        }
        assertThat(w.distinct(MIN)).isCloseTo(100_000, within(5_000.0));
        for (int q = 0; q < 100; q++) {
            d.observe("ns", hashes(q * 1000L, 1000), 2 * MIN); // the same blocks again
        }
        assertThat(w.distinct(2 * MIN)).isCloseTo(100_000, within(5_000.0));
        assertThat(w.lookups(2 * MIN)).isEqualTo(200_000);
        assertThat(w.ceiling(2 * MIN)).isCloseTo(0.5, within(0.03)); // every second lookup was a repeat
    }

    @Test
    void theSameHashInAnotherNamespaceIsAnotherBlock() {
        DistinctBlocks d = DistinctBlocks.of(List.of("1h"));
        d.observe("a", hashes(0, 500), MIN);
        d.observe("b", hashes(0, 500), MIN);
        assertThat(d.windows().get(0).distinct(MIN)).isCloseTo(1000, within(50.0));
    }

    @Test
    void whatIsOlderThanTheWindowIsForgotten() {
        DistinctBlocks d = DistinctBlocks.of(List.of("6m", "1h"));
        d.observe("ns", hashes(0, 1000), MIN);
        DistinctBlocks.Window six = d.windows().get(0);
        DistinctBlocks.Window hour = d.windows().get(1);
        assertThat(six.lookups(4 * MIN)).isEqualTo(1000); // within the window
        assertThat(six.lookups(8 * MIN)).isZero(); // a window and more later
        assertThat(six.distinct(8 * MIN)).isZero();
        assertThat(six.ceiling(8 * MIN)).isZero();
        assertThat(hour.lookups(8 * MIN)).isEqualTo(1000);
        d.observe("ns", hashes(5000, 10), 8 * MIN); // the old slice's slot is reused cleanly
        assertThat(six.lookups(8 * MIN)).isEqualTo(10);
        assertThat(six.distinct(8 * MIN)).isCloseTo(10, within(1.0));
    }

    @Test
    void badWindowsAreRefusedNamingTheValue() {
        assertThatThrownBy(() -> DistinctBlocks.of(List.of("15x"))).isInstanceOf(InvalidArgumentException.class)
                .hasMessage("hit-ceiling window '15x'; expected a positive length such as 30s, 15m, 1h or 1d");
        assertThatThrownBy(() -> DistinctBlocks.of(List.of("0m"))).isInstanceOf(InvalidArgumentException.class);
        assertThatThrownBy(() -> DistinctBlocks.of(List.of("1m", "2m", "3m", "4m", "5m", "6m", "7m", "8m", "9m")))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("expected at most 8");
        assertThat(DistinctBlocks.of(List.of()).windows()).isEmpty();
        assertThatThrownBy(() -> io.pegaflow.engine.EngineConfig.builder().hitCeilingWindows(List.of("1h", "15x")).build())
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("hit-ceiling window '15x'");
    }
}
