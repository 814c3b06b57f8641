package io.pegaflow.engine.store;

import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.QuotaExceededException;

/**
 * What one instance, and all of them together, may hold in the store at once: leases, the
 * blocks those leases pin, and open copies (saves reserved and loads begun, not ended). The
 * store checks them before it changes anything and refuses with a
 * {@link QuotaExceededException} naming the quota. Each lease keeps an array of its blocks
 * and each open copy its plan on the heap, so these bound the heap a tenant can make the
 * server hold (the pool bounds the bytes); pegaflow-server sets the per-instance ones from
 * its flags and bounds instances per tenant itself.
 *
 * @param leasesPerInstance       leases not yet released, consumed or expired, per instance
 * @param leasedBlocksPerInstance blocks those leases hold, per instance
 * @param openCopiesPerInstance   saves and loads open at once, per instance
 * @param leases                  all instances' leases
 * @param leasedBlocks            all instances' leased blocks
 * @param openCopies              all instances' open copies
 * @param tenantPoolBytes         pool bytes one tenant's saves may hold resident (0: no share):
 *                                a tenant's instances are given an owner ({@code
 *                                LocalStore.assignOwner}); a save that would take its owner past
 *                                the share evicts the owner's own least recently used blocks
 *                                first, and is refused naming the share when those are all in use
 */
public record Quotas(int leasesPerInstance, long leasedBlocksPerInstance, int openCopiesPerInstance, int leases,
        long leasedBlocks, int openCopies, long tenantPoolBytes) {
    /** 16,384 leases, 4M leased blocks and 4,096 open copies per instance; 256K, 16M and 64K in all; no pool share. */
    public static final Quotas DEFAULTS = new Quotas(16_384, 4L << 20, 4_096, 262_144, 16L << 20, 65_536);

    public Quotas {
        if (leasesPerInstance < 1 || leasedBlocksPerInstance < 1 || openCopiesPerInstance < 1 || leases < leasesPerInstance
                || leasedBlocks < leasedBlocksPerInstance || openCopies < openCopiesPerInstance) {
            throw new InvalidArgumentException("quotas " + this + "; expected each >= 1 and each total >= its per-instance quota");
        }
        if (tenantPoolBytes < 0) {
            throw new InvalidArgumentException("tenant pool share " + tenantPoolBytes + " bytes; expected 0 (none) or more");
        }
    }

    /** Without a pool share per tenant. */
    public Quotas(int leasesPerInstance, long leasedBlocksPerInstance, int openCopiesPerInstance, int leases,
            long leasedBlocks, int openCopies) {
        this(leasesPerInstance, leasedBlocksPerInstance, openCopiesPerInstance, leases, leasedBlocks, openCopies, 0);
    }

    /** The same quotas with a pool share of {@code bytes} per tenant (0: none). */
    public Quotas tenantPoolShare(long bytes) {
        return new Quotas(leasesPerInstance, leasedBlocksPerInstance, openCopiesPerInstance, leases, leasedBlocks, openCopies,
                bytes);
    }

    /** The same totals, with these per-instance quotas (each total raised to at least its per-instance one). */
    public Quotas perInstance(int leasesPerInstance, long leasedBlocksPerInstance, int openCopiesPerInstance) {
        return new Quotas(leasesPerInstance, leasedBlocksPerInstance, openCopiesPerInstance, Math.max(leases, leasesPerInstance),
                Math.max(leasedBlocks, leasedBlocksPerInstance), Math.max(openCopies, openCopiesPerInstance), tenantPoolBytes);
    }

    /** Refuses a lease of up to {@code blocks} more blocks for {@code inst}; {@code totalLeases}, {@code totalBlocks}: all instances'. */
    void checkLease(Instance inst, long blocks, int totalLeases, long totalBlocks) {
        String id = inst.spec.instanceId();
        if (inst.leases >= leasesPerInstance) {
            throw new QuotaExceededException("a query of instance '" + id + "': it holds " + inst.leases + " leases, the most "
                    + "an instance may (Quotas.leasesPerInstance, --max-leases-per-instance); release or load some first");
        }
        if (inst.leasedBlocks + blocks > leasedBlocksPerInstance) {
            throw new QuotaExceededException("a query of " + blocks + " hashes for instance '" + id + "': its leases hold "
                    + inst.leasedBlocks + " blocks, at most " + leasedBlocksPerInstance
                    + " (Quotas.leasedBlocksPerInstance, --max-leased-blocks-per-instance); release or load some first");
        }
        if (totalLeases >= leases || totalBlocks + blocks > leasedBlocks) {
            throw new QuotaExceededException("a query of instance '" + id + "': the store holds " + totalLeases + " leases of "
                    + totalBlocks + " blocks, at most " + leases + " of " + leasedBlocks
                    + " over all instances (Quotas.leases, Quotas.leasedBlocks); try again later");
        }
    }

    /**
     * Whether a query may begin a load for {@code inst} ({@code total}: all instances' open
     * copies): below half of each open-copy quota, so loads begun for requests still waiting in
     * vLLM's queue never take the room that saves and the loads of running steps need.
     */
    boolean allowsBegun(Instance inst, int total) {
        return inst.openCopies < openCopiesPerInstance / 2 && total < openCopies / 2;
    }

    /** Refuses another open copy ({@code what}: "a save", "a load") for {@code inst}; {@code total}: all instances'. */
    void checkCopy(Instance inst, String what, int total) {
        if (inst.openCopies >= openCopiesPerInstance) {
            throw new QuotaExceededException(what + " of instance '" + inst.spec.instanceId() + "': " + inst.openCopies
                    + " saves and loads open, the most an instance may (Quotas.openCopiesPerInstance, "
                    + "--max-open-copies-per-instance); end some first");
        }
        if (total >= openCopies) {
            throw new QuotaExceededException(what + " of instance '" + inst.spec.instanceId() + "': " + total
                    + " saves and loads open over all instances, the most the store holds (Quotas.openCopies); try again later");
        }
    }
}
