package io.pegaflow.engine.store;

import io.pegaflow.engine.Token;
import io.pegaflow.engine.UnknownLeaseException;
import java.security.SecureRandom;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.function.Consumer;

/**
 * The live leases by id in expiry order (one TTL for all, so insertion order), ids drawn as 128
 * bits from one {@link SecureRandom}; a lease's blocks are pinned and unpinned through the
 * callbacks it is given, so the table knows nothing of eviction. Not thread-safe: guarded by
 * LocalStore's lock.
 */
final class LeaseTable {
    private final LinkedHashMap<Token, Lease> leases = new LinkedHashMap<>();
    private final SecureRandom random = new SecureRandom();
    private final long ttlNanos;
    private final Consumer<Block[]> pin;
    private final Consumer<Block[]> unpin;
    /** Blocks all live leases hold (each instance's share is {@link Instance#leasedBlocks}). */
    private long leasedBlocks;

    /** Leases live {@code ttlNanos}; {@code pin} runs when one is issued, {@code unpin} when it goes. */
    LeaseTable(long ttlNanos, Consumer<Block[]> pin, Consumer<Block[]> unpin) {
        this.ttlNanos = ttlNanos;
        this.pin = pin;
        this.unpin = unpin;
    }

    int size() {
        return leases.size();
    }

    long leasedBlocks() {
        return leasedBlocks;
    }

    private void added(Lease l) {
        l.instance.leases++;
        l.instance.leasedBlocks += l.blocks.length;
        leasedBlocks += l.blocks.length;
    }

    private void gone(Lease l) {
        l.instance.leases--;
        l.instance.leasedBlocks -= l.blocks.length;
        leasedBlocks -= l.blocks.length;
        unpin.accept(l.blocks);
    }

    /** A new lease of {@code inst} on {@code blocks}, expiring a TTL after {@code now}; pins the blocks. */
    Token issue(Instance inst, Block[] blocks, long now) {
        byte[] bytes = new byte[Token.BYTES];
        Token id;
        do {
            random.nextBytes(bytes);
            id = Token.fromBytes(bytes);
        } while (leases.containsKey(id));
        Lease lease = new Lease(id, inst, blocks, now + ttlNanos);
        leases.put(id, lease);
        added(lease);
        pin.accept(blocks);
        return id;
    }

    /** The live lease {@code id}; {@link UnknownLeaseException} if there is none. */
    Lease get(Token id) {
        Lease lease = leases.get(id);
        if (lease == null) {
            throw unknown(id);
        }
        return lease;
    }

    /** Drops the live lease {@code id} and unpins its blocks; {@link UnknownLeaseException} if there is none. */
    void remove(Token id) {
        Lease lease = leases.remove(id);
        if (lease == null) {
            throw unknown(id);
        }
        gone(lease);
    }

    /** Drops (and unpins) every lease expired at {@code now}; returns how many. */
    int expireUntil(long now) {
        int expired = 0;
        for (Iterator<Lease> it = leases.values().iterator(); it.hasNext(); ) {
            Lease l = it.next();
            if (l.expiresAtNanos - now > 0) {
                break;
            }
            it.remove();
            gone(l);
            expired++;
        }
        return expired;
    }

    /** Drops (and unpins) every lease of {@code inst}. */
    void removeAll(Instance inst) {
        for (Iterator<Lease> it = leases.values().iterator(); it.hasNext(); ) {
            Lease l = it.next();
            if (l.instance == inst) {
                it.remove();
                gone(l);
            }
        }
    }

    /** Forgets every lease without unpinning (at close, when the blocks go too). */
    void clear() {
        leases.clear();
        leasedBlocks = 0;
    }

    /** Checks that every leased block is sealed, indexed and referenced. */
    void verify() {
        long blocks = 0;
        for (Lease l : leases.values()) {
            blocks += l.blocks.length;
        }
        LocalStore.require(blocks == leasedBlocks, "leases hold " + blocks + " blocks but " + leasedBlocks + " are counted");
        for (Lease l : leases.values()) {
            for (Block b : l.blocks) {
                LocalStore.require(b.sealed && !b.removed && b.refs > 0, "lease " + l.id + " holds block " + b.key
                        + " sealed=" + b.sealed + " removed=" + b.removed + " refs=" + b.refs);
            }
        }
    }

    /** Checks that {@code inst} counts the leases (and their blocks) it holds here (tests; O(leases)). */
    void verifyCounts(Instance inst) {
        long n = 0;
        long blocks = 0;
        for (Lease l : leases.values()) {
            if (l.instance == inst) {
                n++;
                blocks += l.blocks.length;
            }
        }
        LocalStore.require(inst.leases == n && inst.leasedBlocks == blocks, "instance '" + inst.spec.instanceId() + "' holds "
                + n + " leases of " + blocks + " blocks but counts " + inst.leases + " of " + inst.leasedBlocks);
    }

    private static UnknownLeaseException unknown(Token id) {
        return new UnknownLeaseException("lease " + id + " is unknown: never issued, released, consumed by every worker, or expired");
    }
}
