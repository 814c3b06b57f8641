package io.pegaflow.engine;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.metrics.Gauge;
import io.pegaflow.engine.store.LocalStore;
import java.time.Duration;
import java.util.Random;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The pool's policies on the store alone: {@code seen:N} writes a block only after N lookups
 * asked for it; {@code lfu} evicts the least asked for of the least recently used; bad flags
 * are refused naming them; the defaults behave as plain LRU.
 */
class CachePolicyTest {
    private static final long SEG = 512; // the allocator's unit: a block takes exactly its bytes
    private final Random rnd = new Random(36);
    private LocalStore store;

    @AfterEach
    void close() {
        if (store != null) {
            store.verifyInvariants();
            store.close();
        }
    }

    /** A pool of 8 blocks of one slot each, with the given policies. */
    private LocalStore store(String admission, String eviction) {
        store = new LocalStore(EngineConfig.builder().poolSize("4kb").sweepInterval(Duration.ZERO).admission(admission)
                .eviction(eviction).build(), 8 * SEG);
        PlanOnly.register(store, "i", "ns", SEG, 64);
        return store;
    }

    private int hit(BlockHashes h) {
        QueryResult q = store.query("i", h);
        if (q.hasLease()) {
            store.release("i", q.lease());
        }
        return q.hitBlocks();
    }

    @Test
    void seenTwoWritesABlockOnlyOnceLookupsAskedForItTwice() {
        store("seen:2", "lru");
        BlockHashes h = PlanOnly.hashes(rnd, 3);
        assertThat(hit(h)).isZero(); // the first lookup: seen once
        PlanOnly.saved(store, "i", h);
        assertThat(store.stats().get(Counter.SAVE_NOT_ADMITTED_BLOCKS)).isEqualTo(3);
        assertThat(store.stats().get(Gauge.RESIDENT_BLOCKS)).as("nothing written yet").isZero();
        assertThat(hit(h)).isZero(); // the second lookup
        PlanOnly.saved(store, "i", h);
        assertThat(store.stats().get(Gauge.RESIDENT_BLOCKS)).isEqualTo(3);
        assertThat(hit(h)).isEqualTo(3);
        assertThat(store.stats().get(Counter.SAVE_NOT_ADMITTED_BLOCKS)).as("counted apart from resident skips").isEqualTo(3);
        assertThat(store.stats().get(Counter.SAVE_SKIPPED_BLOCKS)).isZero();
    }

    @Test
    void lfuEvictsTheLeastAskedForOfTheOldestWhereLruTakesTheOldest() {
        for (String eviction : new String[] {"lru", "lfu"}) {
            store("all", eviction);
            BlockHashes popular = PlanOnly.hashes(rnd, 1);
            BlockHashes others = PlanOnly.hashes(rnd, 7);
            PlanOnly.saved(store, "i", popular); // the oldest block
            PlanOnly.saved(store, "i", others);
            for (int k = 0; k < 5; k++) {
                hit(popular);
            }
            // touching made the popular block the newest: age it again behind the others
            for (int k = 0; k < 7; k++) {
                hit(others.slice(k, k + 1));
            }
            PlanOnly.saved(store, "i", PlanOnly.hashes(rnd, 1)); // the pool is full: one block goes
            assertThat(store.stats().get(Counter.EVICTIONS)).isEqualTo(1);
            int kept = hit(popular);
            assertThat(kept).as(eviction).isEqualTo(eviction.equals("lfu") ? 1 : 0);
            store.verifyInvariants();
            store.close();
            store = null;
        }
    }

    @Test
    void badPoliciesAreRefusedNamingTheValueAndWhatWasExpected() {
        assertThatThrownBy(() -> EngineConfig.builder().admission("seen:0").build()).isInstanceOf(InvalidArgumentException.class)
                .hasMessageContaining("admission 'seen:0'").hasMessageContaining("seen:N with N in 1..15");
        assertThatThrownBy(() -> EngineConfig.builder().admission("tinylfu").build()).isInstanceOf(InvalidArgumentException.class)
                .hasMessageContaining("admission 'tinylfu'");
        assertThatThrownBy(() -> EngineConfig.builder().eviction("arc").build()).isInstanceOf(InvalidArgumentException.class)
                .hasMessageContaining("eviction 'arc'; expected lru or lfu");
    }
}
