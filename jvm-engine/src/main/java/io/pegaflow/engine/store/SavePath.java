package io.pegaflow.engine.store;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.CopyPlan;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.Limits;
import io.pegaflow.engine.PoolExhaustedException;
import io.pegaflow.engine.QuotaExceededException;
import io.pegaflow.engine.Sizes;
import io.pegaflow.engine.Token;
import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.pool.OffsetAllocator;
import io.pegaflow.engine.store.OpenCopy.PlannedBlock;
import io.pegaflow.engine.store.OpenCopy.Reservation;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.function.LongSupplier;
import java.util.function.ObjLongConsumer;

/**
 * The write path: plans a save (what to write, whether the pool can hold it, then the claims
 * through {@link PoolSpace#claim}) and ends one (fills its slots and seals the blocks it
 * completed, or rolls it back). Runs under {@link LocalStore}'s lock, on callers' threads:
 * {@link #reserve} (the store's {@code reserveSave}) takes it; {@link #commit} runs with it held.
 */
final class SavePath {
    private final StoreLock lock;
    private final InstanceRegistry registry;
    private final PoolSpace pool;
    private final OpenCopies copies;
    private final Quotas quotas;
    private final CachePolicy policy;
    private final ObjLongConsumer<Counter> count;
    private final LongSupplier clock;

    SavePath(StoreLock lock, InstanceRegistry registry, PoolSpace pool, OpenCopies copies, Quotas quotas, CachePolicy policy,
            ObjLongConsumer<Counter> count, LongSupplier clock) {
        this.lock = lock;
        this.registry = registry;
        this.pool = pool;
        this.copies = copies;
        this.quotas = quotas;
        this.policy = policy;
        this.count = count;
        this.clock = clock;
    }

    /** See {@link LocalStore#reserveSave}. */
    CopyPlan reserve(String instanceId, int workerRank, List<String> layerNames, long[] blockIds, BlockHashes hashes) {
        if (blockIds == null || hashes == null) {
            throw new InvalidArgumentException("save: blockIds and hashes must not be null");
        }
        if (blockIds.length != hashes.count()) {
            throw new InvalidArgumentException("save: " + blockIds.length + " block ids but " + hashes.count()
                    + " hashes; expected equal counts");
        }
        List<PlannedBlock> planned = new ArrayList<>();
        return lock.locked(() -> {
            lock.checkOpen();
            Instance inst = registry.sealed(instanceId);
            Instance.Worker worker = InstanceRegistry.worker(inst, workerRank);
            int[] regionIdx = worker.selectRegions(inst.spec.instanceId(), layerNames);
            Limits.checkPlan("save", blockIds.length, regionIdx.length);
            worker.checkBlockIds(regionIdx, blockIds, "blockIds");
            quotas.checkCopy(inst, "a save", copies.size());
            int notAdmitted = plan(inst, worker, regionIdx, hashes, planned);
            int skipped = hashes.count() - planned.size();
            count.accept(Counter.SAVE_REQUESTS, 1);
            count.accept(Counter.SAVE_SKIPPED_BLOCKS, skipped - notAdmitted);
            count.accept(Counter.SAVE_NOT_ADMITTED_BLOCKS, notAdmitted);
            if (planned.isEmpty()) {
                return nothing(skipped);
            }
            Token id = copies.newId();
            Reservation reservation = new Reservation(inst, worker, planned, copies.deadline());
            copies.opened(id, reservation);
            return reservation.plan(id, skipped, copies.holdNanos());
        });
    }

    /** A save with nothing to copy. */
    private static CopyPlan nothing(int skippedBlocks) {
        return new CopyPlan(Token.NONE, CopyPlan.Direction.SAVE, 0, skippedBlocks, new int[0], new int[0], new int[0],
                new long[0], 0);
    }

    /**
     * Under lock: decides what to write, checks capacity, then allocates and claims slots. The
     * per-region facts (slot, bytes) come from the worker (computed when it was sealed); a block none of whose
     * selected slots exist yet (the usual case) shares the call's region list; a hash repeated
     * in the call is planned once (its later copies count as skipped), and a new block the
     * admission policy does not take yet is skipped ({@link CachePolicy}); returns how many were.
     */
    private int plan(Instance inst, Instance.Worker worker, int[] regionIdx, BlockHashes hashes, List<PlannedBlock> plans) {
        NamespaceIndex ns = inst.ns;
        int[] slotOf = worker.slots;
        long[] slotBytesOf = worker.slotBytes;
        long allBytes = 0;
        for (int r : regionIdx) {
            allBytes += slotBytesOf[r];
        }
        Set<HashKey> seen = new HashSet<>();
        long needed = 0;
        int notAdmitted = 0;
        byte[] packed = hashes.packed();
        int len = hashes.hashLen();
        for (int i = 0; i < hashes.count(); i++) {
            Block b = ns.blocks.get(packed, i * len, len);
            if (b != null && b.sealed) {
                continue;
            }
            HashKey key = b == null ? HashKey.of(hashes, i) : b.key;
            if (!seen.add(key)) {
                continue; // repeated in this call: its first copy is planned
            }
            if (b == null && !policy.admits(ns, key)) {
                notAdmitted++;
                continue; // not asked for often enough yet; a block in flight follows its first rank
            }
            int[] todo = regionIdx;
            long bytes = allBytes;
            if (b != null) {
                int[] some = new int[regionIdx.length];
                int n = 0;
                bytes = 0;
                for (int r : regionIdx) {
                    if (b.slotState[slotOf[r]] == Block.EMPTY) {
                        some[n++] = r;
                        bytes += slotBytesOf[r];
                    }
                }
                if (n == 0) {
                    continue;
                }
                todo = n == some.length ? regionIdx : Arrays.copyOf(some, n);
            }
            plans.add(new PlannedBlock(i, key, b, todo, bytes));
            needed += pool.allocatedBytes(bytes);
        }
        if (needed > pool.room()) {
            PoolExhaustedException refused = pool.exhausted(needed); // counted
            plans.clear();
            throw refused;
        }
        long now = clock.getAsLong();
        long share = quotas.tenantPoolBytes();
        long ownClaimed = 0; // bytes this save claimed so far for blocks its tenant owns
        for (int p = 0; p < plans.size(); p++) {
            PlannedBlock plan = plans.get(p);
            // A hash repeated in this call was filtered above, so a new block's key is still absent.
            Block b = plan.block != null ? plan.block : new Block(ns, plan.key, now);
            if (plan.block == null) {
                b.owner = inst.owner;
            }
            if (share > 0 && inst.owner >= 0 && b.owner == inst.owner) {
                long claiming = pool.allocatedBytes(plan.bytes); // what the block will count when sealed
                if (!pool.keepShare(inst.owner, claiming, ownClaimed, share)) {
                    pool.rollBack(worker, plans.subList(0, p));
                    plans.clear();
                    throw new QuotaExceededException("a save of instance '" + inst.spec.instanceId() + "': its tenant's blocks "
                            + "hold " + Sizes.format(pool.ownedBytes(inst.owner) + ownClaimed) + " of the pool, its share is "
                            + Sizes.format(share) + " (Quotas.tenantPoolBytes, --tenant-pool-share), and its own blocks "
                            + "left to evict are in use; release or load some first");
                }
                ownClaimed += claiming;
            }
            long handle = pool.claim(b, plan.bytes, worker, plan.regions);
            if (handle == OffsetAllocator.NO_SPACE) {
                pool.rollBack(worker, plans.subList(0, p));
                count.accept(Counter.POOL_ALLOC_FAILURES, 1);
                plans.clear();
                throw new PoolExhaustedException("host pool exhausted: no free range of " + Sizes.format(plan.bytes)
                        + " after evicting every unreferenced block (" + Sizes.format(pool.freeBytes())
                        + " free in fragments)");
            }
            plan.allocation = handle;
            if (plan.block == null) {
                plan.block = b;
                pool.admit(b); // indexed as in flight, pinned
            } else {
                pool.pin(b);
            }
        }
        return notAdmitted;
    }

    /** Under lock: fills (ok) or releases the slots of a reservation. */
    void commit(Instance.Worker worker, List<PlannedBlock> plans, boolean ok) {
        if (!ok) {
            pool.rollBack(worker, plans);
            return;
        }
        long now = clock.getAsLong();
        for (PlannedBlock plan : plans) {
            Block b = plan.block;
            for (int r : plan.regions) {
                b.slotState[worker.slots[r]] = Block.FILLED;
                b.filled++;
            }
            b.touchedNanos = now;
            if (b.complete() && !b.sealed) {
                pool.seal(b, true);
            }
            pool.unpin(b); // the save's own reference: a block it sealed may become evictable
        }
    }
}
