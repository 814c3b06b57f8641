package io.pegaflow.engine;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.metrics.Gauge;
import io.pegaflow.engine.store.LocalStore;
import io.pegaflow.engine.store.Quotas;
import java.time.Duration;
import java.util.Random;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The store's {@link Quotas}: an instance over its leases, leased blocks or open copies, or
 * the store over its totals, is refused with a {@link QuotaExceededException} naming the
 * quota, before anything changes (no lease, no reservation, no pin; invariants hold), and
 * the instance's own release or end makes room again. Another instance is not affected by
 * one at its quota. The copies here are never made (the store plans, nothing moves).
 */
class QuotasTest {
    private static final long SEG = 256;
    private final Random rnd = new Random(34);
    private LocalStore store;

    @AfterEach
    void close() {
        if (store != null) {
            store.verifyInvariants();
        }
    }

    private LocalStore store(Quotas quotas) {
        store = new LocalStore(EngineConfig.builder().poolSize("64kb").sweepInterval(Duration.ZERO).quotas(quotas).build(),
                64 * 1024);
        return store;
    }

    private void register(String id) {
        PlanOnly.register(store, id, "ns", SEG, 16);
    }

    private BlockHashes hashes(int n) {
        return PlanOnly.hashes(rnd, n);
    }

    private void saved(String id, BlockHashes h) {
        PlanOnly.saved(store, id, h);
    }

    @Test
    void leasesAndLeasedBlocksPerInstanceAreCappedAndFreedByRelease() {
        store(Quotas.DEFAULTS.perInstance(2, 5, 8));
        register("a");
        register("b");
        BlockHashes two = hashes(2);
        saved("a", two);
        QueryResult q1 = store.query("a", two);
        QueryResult q2 = store.query("a", two);
        assertThat(q1.hasLease() && q2.hasLease()).isTrue();
        long pinned = store.stats().get(Gauge.PINNED_BLOCKS);
        assertThatThrownBy(() -> store.query("a", two)).isInstanceOf(QuotaExceededException.class)
                .isInstanceOf(PoolExhaustedException.class).hasMessageContaining("instance 'a'")
                .hasMessageContaining("Quotas.leasesPerInstance").hasMessageContaining("--max-leases-per-instance");
        assertThat(store.stats().get(Gauge.ACTIVE_LEASES)).as("nothing issued").isEqualTo(2);
        assertThat(store.stats().get(Gauge.PINNED_BLOCKS)).isEqualTo(pinned);
        assertThat(store.query("b", two).hitBlocks()).as("another instance is not held by a's quota").isEqualTo(2);
        store.release("a", q1.lease());
        // 2 leased blocks held, 5 allowed: a query of 4 hashes could lease 4 more
        assertThatThrownBy(() -> store.query("a", hashes(4))).isInstanceOf(QuotaExceededException.class)
                .hasMessageContaining("Quotas.leasedBlocksPerInstance");
        assertThat(store.query("a", two).hitBlocks()).isEqualTo(2);
        assertThat(store.usage().get("a")).isEqualTo(new LocalStore.Usage(2, 4, 0));
    }

    @Test
    void openCopiesPerInstanceAreCappedBeforeAnythingIsReservedOrPinned() {
        store(Quotas.DEFAULTS.perInstance(16, 64, 1));
        register("a");
        BlockHashes h = hashes(1);
        saved("a", h);
        CopyPlan open = store.reserveSave("a", 0, null, new long[] {3}, hashes(1));
        long used = store.stats().get(Gauge.POOL_USED_BYTES);
        assertThatThrownBy(() -> store.reserveSave("a", 0, null, new long[] {4}, hashes(1)))
                .isInstanceOf(QuotaExceededException.class).hasMessageContaining("a save of instance 'a'")
                .hasMessageContaining("Quotas.openCopiesPerInstance");
        assertThat(store.stats().get(Gauge.POOL_USED_BYTES)).as("nothing reserved").isEqualTo(used);
        QueryResult q = store.query("a", h);
        long pinned = store.stats().get(Gauge.PINNED_BLOCKS);
        assertThatThrownBy(() -> store.beginLoad("a", 0, q.lease(), new long[] {5}))
                .isInstanceOf(QuotaExceededException.class).hasMessageContaining("a load of instance 'a'");
        assertThat(store.stats().get(Gauge.PINNED_BLOCKS)).as("the lease's share not consumed").isEqualTo(pinned);
        store.endCopy("a", open.id(), false, 0, 0);
        CopyPlan load = store.beginLoad("a", 0, q.lease(), new long[] {5}); // the same share, now room
        store.endCopy("a", load.id(), true, 0, 0);
        assertThat(store.openOperations()).isZero();
    }

    @Test
    void theStoresTotalsBoundAllInstancesTogether() {
        store(new Quotas(2, 100, 4, 3, 100, 4));
        register("a");
        register("b");
        BlockHashes h = hashes(1);
        saved("a", h);
        store.query("a", h);
        store.query("a", h);
        store.query("b", h);
        assertThatThrownBy(() -> store.query("b", h)).isInstanceOf(QuotaExceededException.class)
                .hasMessageContaining("over all instances (Quotas.leases, Quotas.leasedBlocks)");
        assertThatThrownBy(() -> new Quotas(2, 1, 1, 1, 1, 1)).isInstanceOf(InvalidArgumentException.class);
        store.unregisterInstance("a"); // its leases go, and with them its share of the totals
        assertThat(store.query("b", h).hitBlocks()).isEqualTo(1);
    }

    /**
     * A pool share per tenant ({@link Quotas#tenantPoolBytes}): a tenant over its share evicts
     * its own least recently used blocks first, never another tenant's; with its own blocks all
     * in use the save is refused naming the share, and nothing is reserved.
     */
    @Test
    void aTenantOverItsPoolShareEvictsItsOwnBlocksFirstThenIsRefused() {
        store(Quotas.DEFAULTS);
        register("probe");
        store.assignOwner("probe", 7);
        saved("probe", hashes(1));
        long block = store.ownedPoolBytes().get(7); // one block's pool bytes
        store = null;
        store(Quotas.DEFAULTS.tenantPoolShare(8 * block));
        register("a");
        register("b");
        store.assignOwner("a", 0);
        store.assignOwner("b", 1);
        BlockHashes theirs = hashes(4);
        saved("b", theirs);
        BlockHashes first = hashes(8);
        saved("a", first);
        assertThat(store.ownedPoolBytes()).containsEntry(0, 8 * block).containsEntry(1, 4 * block);
        BlockHashes more = hashes(4);
        saved("a", more); // over its share: its own 4 oldest go
        assertThat(store.ownedPoolBytes()).as("a stays within its share").containsEntry(0, 8 * block);
        assertThat(store.query("a", first.slice(0, 4)).hitBlocks()).as("a's oldest were evicted").isZero();
        QueryResult bHit = store.query("b", theirs);
        assertThat(bHit.hitBlocks()).as("b's blocks untouched").isEqualTo(4);
        store.release("b", bHit.lease());
        // every block of a's share leased: nothing of its own left to evict
        QueryResult held = store.query("a", first.slice(4, 8));
        QueryResult held2 = store.query("a", more);
        assertThat(held.hitBlocks() + held2.hitBlocks()).isEqualTo(8);
        long used = store.stats().get(Gauge.POOL_USED_BYTES);
        assertThatThrownBy(() -> saved("a", hashes(1))).isInstanceOf(QuotaExceededException.class)
                .hasMessageContaining("a save of instance 'a'").hasMessageContaining("Quotas.tenantPoolBytes")
                .hasMessageContaining("--tenant-pool-share");
        assertThat(store.stats().get(Gauge.POOL_USED_BYTES)).as("nothing reserved").isEqualTo(used);
        assertThat(store.query("b", theirs).hitBlocks()).as("and b still holds its blocks").isEqualTo(4);
        store.release("a", held.lease());
        store.release("a", held2.lease());
        saved("a", hashes(1)); // its own unleased blocks are evictable again
        assertThat(store.ownedPoolBytes()).containsEntry(0, 8 * block);
    }
}
