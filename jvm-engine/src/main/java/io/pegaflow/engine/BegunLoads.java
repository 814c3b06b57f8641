package io.pegaflow.engine;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.LongSupplier;

/**
 * Loads that a query began for a worker of this process ({@link PegaEngine#queryAndBegin}),
 * by lease, until that worker's load takes the plan ({@link PegaEngine#load}) or the lease is
 * released (the load is then rolled back). A begun load is open in the store: its blocks stay
 * pinned until it is ended, or until the store's copy TTL rolls it back, so every entry left
 * here is rolled back by its owner ({@link PegaEngine}'s release, unregister and close), and
 * those older than their plan's hold are rolled back once this many are kept ({@link #MAX}).
 */
final class BegunLoads {
    /**
     * A load begun at {@code asked} (the engine's clock before the query was sent); {@code
     * staged}: its pool side being staged for its copy ({@link io.pegaflow.engine.transfer.Stager}),
     * null where it is not. Whoever removes an entry takes the staging: claims it or lets it go.
     */
    record Begun(Token lease, String instanceId, int workerRank, CopyPlan plan, long asked,
            io.pegaflow.engine.transfer.StagedLoad staged) {}

    /** How many begun loads are kept before stale ones are swept (a scheduler holds one per waiting request). */
    static final int MAX = 4096;

    private final ConcurrentHashMap<Token, Begun> byLease = new ConcurrentHashMap<>();
    private final LongSupplier clock;

    BegunLoads(LongSupplier clock) {
        this.clock = clock;
    }

    /** Keeps {@code b}; returns the entries to roll back (past their plan's hold) when too many are kept. */
    List<Begun> put(Begun b) {
        byLease.put(b.lease(), b);
        if (byLease.size() <= MAX) {
            return List.of();
        }
        long now = clock.getAsLong();
        return removeAll(x -> now - x.asked() > x.plan().holdNanos());
    }

    /** The load begun for this lease, instance and worker, removed; null if none (the load asks for its plan). */
    Begun take(Token lease, String instanceId, int workerRank) {
        Begun b = byLease.get(lease);
        if (b == null || !b.instanceId().equals(instanceId) || b.workerRank() != workerRank
                || !byLease.remove(lease, b)) {
            return null;
        }
        return b;
    }

    /** Whether the load begun with this lease, still kept, has a staging. */
    boolean staged(Token lease) {
        Begun b = byLease.get(lease);
        return b != null && b.staged() != null;
    }

    /** The load begun with this lease of {@code instanceId}, removed; null if none. */
    Begun drop(Token lease, String instanceId) {
        Begun b = byLease.get(lease);
        return b != null && b.instanceId().equals(instanceId) && byLease.remove(lease, b) ? b : null;
    }

    /** Every load begun for {@code instanceId} (null: all), removed. */
    List<Begun> dropAll(String instanceId) {
        return removeAll(b -> instanceId == null || b.instanceId().equals(instanceId));
    }

    /**
     * Removes the entries {@code which} selects and returns those this call removed: an entry a
     * concurrent {@link #take} won is the load's, never also rolled back.
     */
    private List<Begun> removeAll(java.util.function.Predicate<Begun> which) {
        List<Begun> out = new ArrayList<>();
        for (Begun b : byLease.values()) {
            if (which.test(b) && byLease.remove(b.lease(), b)) {
                out.add(b);
            }
        }
        return out;
    }
}
