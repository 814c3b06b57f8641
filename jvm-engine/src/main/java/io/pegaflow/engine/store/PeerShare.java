package io.pegaflow.engine.store;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.ErrorCode;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.PegaflowException;
import io.pegaflow.engine.Token;
import io.pegaflow.engine.metrics.Counter;
import io.pegaflow.engine.pool.OffsetAllocator;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.function.BiConsumer;
import java.util.function.LongSupplier;
import java.util.function.ObjLongConsumer;

/**
 * Other hosts' pools (cross-node sharing, {@link RemoteTier}): resident blocks are advertised
 * and summed ahead, pinned for peers' reads, and blocks peers hold are fetched into reserved
 * pool space. Runs under {@link LocalStore}'s lock: its entry points (called by the store's
 * public methods, on the server's and the remote tier's threads) take it; the rest run with it
 * held; {@link #sumAhead} runs on the thread of {@link BlockChecksums}.
 */
final class PeerShare {
    private record PinnedForPeer(Block[] blocks, long deadlineNanos) {}

    private final StoreLock lock;
    private final PoolSpace pool;
    private final InstanceRegistry registry;
    private final OpenCopies copies;
    private final ObjLongConsumer<Counter> count;
    private final LongSupplier clock;
    /** Blocks pinned for peers' reads, by pin id, with their deadlines; guarded by lock. */
    private final Map<Token, PinnedForPeer> transfers = new HashMap<>();
    /** Other hosts' pools; set once, before use. */
    private volatile RemoteTier remote;
    /** Sums sealed blocks ahead of peers' reads; set with {@link #remote}. */
    private volatile BlockChecksums checksums;

    PeerShare(StoreLock lock, PoolSpace pool, InstanceRegistry registry, OpenCopies copies, ObjLongConsumer<Counter> count,
            LongSupplier clock) {
        this.lock = lock;
        this.pool = pool;
        this.registry = registry;
        this.copies = copies;
        this.count = count;
        this.clock = clock;
    }

    /** The attached tier, or null. */
    RemoteTier remote() {
        return remote;
    }

    /** Under lock: attaches the tier ({@link LocalStore#attachRemote}); fetched blocks land in {@code memory}. */
    void attach(RemoteTier tier, MemorySegment memory) {
        if (remote != null) {
            throw new InvalidArgumentException("a remote tier is already attached");
        }
        MemorySegment mapped = pool.memory();
        if (mapped != null && mapped.address() != memory.address()) {
            throw new InvalidArgumentException("remote tier pool memory differs from the SSD tier's");
        }
        pool.map(memory);
        checksums = new BlockChecksums(this::sumAhead);
        remote = tier;
    }

    /** See {@link LocalStore#flush}: the remote tier's queue of advertisements, sent (not under the lock). */
    void flush() {
        RemoteTier r = remote;
        if (r == null) {
            return;
        }
        try {
            r.flush();
        } catch (java.util.concurrent.TimeoutException e) {
            throw new PegaflowException(ErrorCode.TIMEOUT, "flush: the cluster registry did not confirm in time: " + e.getMessage(), e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new PegaflowException(ErrorCode.UNAVAILABLE, "flush interrupted", e);
        } catch (PegaflowException e) {
            throw e;
        } catch (Exception e) {
            throw new PegaflowException(ErrorCode.UNAVAILABLE, "flush: the cluster registry is unavailable: " + e, e);
        }
    }

    /**
     * Under lock: reports a block that just became resident to the remote tier, and queues it to
     * be summed ahead of peers' reads unless its checksum is known (checked on arrival); false
     * without a remote tier (nothing advertised).
     */
    boolean advertise(Block b) {
        RemoteTier r = remote;
        if (r == null) {
            return false;
        }
        r.resident(b.ns.namespace, b.key.bytes());
        if (b.crc == BlockChecksum.UNKNOWN && !checksums.offer(b)) {
            count.accept(Counter.BLOCK_CHECKSUMS_DEFERRED, 1);
        }
        return true;
    }

    /** Under lock: reports a resident block that left the pool to the remote tier; false without one. */
    boolean evicted(Block b) {
        RemoteTier r = remote;
        if (r == null) {
            return false;
        }
        r.evicted(b.ns.namespace, b.key.bytes());
        return true;
    }

    /**
     * On the background thread of {@link BlockChecksums}: sums a sealed block's slots outside
     * the lock and keeps the sum with it, unless it left the pool meanwhile (evicted: its space
     * may hold other bytes by now). A sealed block's slots and bytes never change while it stays,
     * and a Block is never reused once removed, so "still there" is the whole check.
     */
    private void sumAhead(Block b) {
        boolean gone = lock.locked(() -> lock.closed() || b.removed || !b.sealed || b.crc != BlockChecksum.UNKNOWN);
        if (gone) {
            return;
        }
        int crc = BlockChecksum.of(pool.memory(), b.slotOffset, b.ns.slotBytes);
        lock.locked(() -> {
            if (!lock.closed() && !b.removed) {
                b.crc = Integer.toUnsignedLong(crc);
                count.accept(Counter.BLOCK_CHECKSUMS_AHEAD, 1);
            }
        });
    }

    /** See {@link LocalStore#pinForTransfer}. */
    TransferPin pinForTransfer(String namespace, BlockHashes hashes, java.time.Duration ttl) {
        if (namespace == null || hashes == null || ttl == null || ttl.isNegative() || ttl.isZero()) {
            throw new InvalidArgumentException("pinForTransfer(" + namespace + ", " + hashes + ", " + ttl
                    + "); expected a namespace, hashes and a positive deadline");
        }
        return lock.locked(() -> {
            lock.checkOpen();
            NamespaceIndex ns = registry.namespace(namespace);
            if (ns == null) {
                return null;
            }
            Block[] found = new Block[hashes.count()];
            int hit = ns.blocks.sealedPrefix(hashes.packed(), hashes.hashLen(), hashes.count(), found);
            if (hit == 0) {
                return null;
            }
            Block[] pinned = Arrays.copyOf(found, hit);
            List<long[]> offsets = new ArrayList<>(hit);
            long[] sums = new long[hit];
            for (int i = 0; i < hit; i++) {
                Block b = pinned[i];
                pool.pin(b);
                offsets.add(b.slotOffset.clone());
                sums[i] = b.crc;
            }
            Token id = copies.newId(transfers::containsKey);
            transfers.put(id, new PinnedForPeer(pinned, clock.getAsLong() + ttl.toNanos()));
            return new TransferPin(id, ns.slotBytes.clone(), offsets, sums);
        });
    }

    /** See {@link LocalStore#releaseTransfer}. */
    boolean releaseTransfer(Token id) {
        if (id == null) {
            return false;
        }
        return lock.locked(() -> {
            if (lock.closed()) {
                return false;
            }
            PinnedForPeer p = transfers.remove(id);
            if (p == null) {
                return false;
            }
            pool.unpinAll(p.blocks());
            return true;
        });
    }

    /** See {@link LocalStore#transferLive}. */
    boolean transferLive(Token id) {
        return lock.locked(() -> {
            PinnedForPeer p = lock.closed() || id == null ? null : transfers.get(id);
            return p != null && p.deadlineNanos() - clock.getAsLong() > 0;
        });
    }

    /** Under lock: pins held for peers' reads now. */
    int pins() {
        return transfers.size();
    }

    /** See {@link LocalStore#reserveFetch}. */
    FetchReservation reserveFetch(String namespace, BlockHashes run, int alreadyHit, long[] slotBytes) {
        if (namespace == null || run == null || slotBytes == null) {
            throw new InvalidArgumentException("reserveFetch(" + namespace + ", " + run + "); expected a namespace and hashes");
        }
        return lock.locked(() -> {
            lock.checkOpen();
            NamespaceIndex ns = registry.namespace(namespace);
            if (ns == null) {
                return null;
            }
            if (!Arrays.equals(ns.slotBytes, slotBytes)) {
                count.accept(Counter.PEER_FETCH_GEOMETRY_MISMATCH, 1);
                return null;
            }
            long cap = Math.max(0, pool.capacityBytes() / 2 / Math.max(1, ns.blockBytes) - alreadyHit);
            int n = (int) Math.min(run.count(), cap);
            Block[] blocks = new Block[n];
            long[] handles = new long[n];
            MemorySegment[] dst = new MemorySegment[n];
            long now = clock.getAsLong();
            byte[] packed = run.packed();
            int len = run.hashLen();
            int got = 0;
            for (int i = 0; i < n; i++, got++) {
                if (ns.blocks.get(packed, i * len, len) != null) {
                    continue; // resident, read back or being saved here: not fetched
                }
                Block b = new Block(ns, HashKey.of(run, i), now);
                long handle = pool.claim(b, ns.blockBytes, null, null);
                if (handle == OffsetAllocator.NO_SPACE) {
                    break;
                }
                dst[i] = pool.slice(handle, ns.blockBytes);
                pool.admit(b);
                b.prefetching = true;
                blocks[i] = b;
                handles[i] = handle;
            }
            if (got == 0) {
                return null;
            }
            return new FetchReservation(Arrays.copyOf(blocks, got), Arrays.copyOf(handles, got), Arrays.copyOf(dst, got));
        });
    }

    /** See {@link LocalStore#completeFetch}. */
    void completeFetch(FetchReservation r, boolean[] ok) {
        if (r == null || ok == null || ok.length != r.length()) {
            throw new InvalidArgumentException("completeFetch: " + (ok == null ? "null" : ok.length) + " outcomes for a reservation of "
                    + (r == null ? "null" : r.length()) + "; expected one per reserved block");
        }
        lock.locked(() -> {
            if (lock.closed() || r.completed) {
                return;
            }
            r.completed = true;
            long now = clock.getAsLong();
            for (int i = 0; i < r.length(); i++) {
                Block b = r.blocks[i];
                if (b == null) {
                    continue;
                }
                b.fromPeer = ok[i];
                if (ok[i]) {
                    b.crc = r.checksum(i); // checked on arrival: not summed again
                }
                pool.endRead(b, r.handles[i], ok[i], now);
            }
        });
    }

    /** See {@link LocalStore#forEachResident}. */
    void forEachResident(BiConsumer<String, byte[]> each) {
        List<String> names = new ArrayList<>();
        List<byte[]> keys = new ArrayList<>();
        lock.locked(() -> {
            lock.checkOpen();
            for (NamespaceIndex ns : registry.namespaces()) {
                for (Block b : ns.blocks.values()) {
                    if (b.sealed) {
                        names.add(ns.namespace);
                        keys.add(b.key.bytes());
                    }
                }
            }
        });
        for (int i = 0; i < keys.size(); i++) {
            each.accept(names.get(i), keys.get(i));
        }
    }

    /** Under lock: releases pins whose reader neither released them nor finished in time. */
    void expireTransfers(long now) {
        for (Iterator<PinnedForPeer> it = transfers.values().iterator(); it.hasNext(); ) {
            PinnedForPeer p = it.next();
            if (p.deadlineNanos() - now <= 0) {
                it.remove();
                pool.unpinAll(p.blocks());
                count.accept(Counter.TRANSFER_PINS_EXPIRED, p.blocks().length);
            }
        }
    }

    /** Under lock: forgets every pin (at close). */
    void clear() {
        transfers.clear();
    }

    /** Stops summing ahead; unlocked, before the store takes its lock to close (the summer's thread takes it). */
    void closeChecksums() {
        BlockChecksums sums = checksums;
        if (sums != null) {
            sums.close();
        }
    }
}
