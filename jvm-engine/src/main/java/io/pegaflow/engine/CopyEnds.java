package io.pegaflow.engine;

import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.function.LongSupplier;

/**
 * Owns the end of every copy {@link PegaEngine} starts: when the control plane is told that a
 * plan ended, and when the caller hears of it. One rule table ({@link Rule}), chosen when the
 * copy's parts have finished:
 *
 * <table>
 *   <caption>When a copy ends</caption>
 *   <tr><th>outcome</th><th>rule</th><th>why</th></tr>
 *   <tr><td>a save landed</td><td>{@link Rule#BESIDE}</td><td>the GPU blocks are free to reuse at once;
 *       the seal, a control-plane round trip, goes out on an end thread</td></tr>
 *   <tr><td>a load landed within half its plan's hold</td><td>{@link Rule#BESIDE}</td><td>the store
 *       promised to keep its pins that long, so the bytes read were the plan's</td></tr>
 *   <tr><td>a load landed later (or with no hold)</td><td>{@link Rule#END_FIRST}</td><td>its end
 *       succeeding is what proves its slots stayed pinned through the copy</td></tr>
 *   <tr><td>a copy failed or could not start</td><td>{@link Rule#ROLL_BACK}</td><td>rolled back before
 *       the caller hears, so a retry never meets the old reservation</td></tr>
 * </table>
 *
 * <p>Ends told beside their futures are tracked ({@link #awaitEnds}) so the engine's own reads
 * (query, stats, flush) see every save whose future completed.
 */
final class CopyEnds {
    private static final System.Logger LOG = System.getLogger(PegaEngine.class.getName());

    /** How a finished copy ends (see the class's table). */
    enum Rule {
        /** The caller hears at once; the plan's end goes out beside it. */
        BESIDE,
        /** The plan's end first, then the caller (a failed end fails the load). */
        END_FIRST,
        /** Rolled back first, then the caller hears of the failure. */
        ROLL_BACK
    }

    /**
     * The rule for a copy: {@code save}, whether it failed, and for a load whether the plan's
     * hold ({@code holdNanos}, 0: none) still covers it {@code sinceAsked} nanoseconds after the
     * plan was asked for (half the hold: margin for the two clocks; a hold is seconds, a copy
     * milliseconds).
     */
    static Rule rule(boolean save, boolean failed, long holdNanos, long sinceAsked) {
        if (failed) {
            return Rule.ROLL_BACK;
        }
        if (save || (holdNanos > 0 && sinceAsked < holdNanos / 2)) {
            return Rule.BESIDE;
        }
        return Rule.END_FIRST;
    }

    private final BlockStore store;
    private final LongSupplier clock;
    /** Saves that landed whose seal is still being told to the control plane (their settled futures). */
    private final Set<CompletableFuture<Void>> ending = ConcurrentHashMap.newKeySet();
    /** Held loads that landed whose end (the unpin) is still being told (their settled futures). */
    private final Set<CompletableFuture<Void>> unpinning = ConcurrentHashMap.newKeySet();
    /** Tells the control plane those ends, off the copy engine's completer threads. */
    private final ExecutorService enders = java.util.concurrent.Executors.newCachedThreadPool(
            Thread.ofPlatform().daemon().name("pegaflow-end-", 0).factory());

    CopyEnds(BlockStore store, LongSupplier clock) {
        this.store = store;
        this.clock = clock;
    }

    /**
     * Once every part in {@code copies} finished (or, with {@code startFailure}, those that
     * started): ends {@code plan} by its {@link Rule} and completes {@code result} (the
     * caller's) and {@code settled} (the plan's end). {@code failed}: the caller's block ids a
     * failure names; {@code start}, {@code asked}: the clock when the copy started and before
     * its plan was asked for.
     */
    void settle(String instanceId, CopyPlan plan, boolean save, String what, long[] failed,
            List<CompletableFuture<Long>> copies, Throwable startFailure, long start, long asked,
            CompletableFuture<CopyResult> result, CompletableFuture<Void> settled) {
        CompletableFuture.allOf(copies.toArray(CompletableFuture[]::new)).whenComplete((x, copyFailure) -> {
            Throwable err = startFailure != null ? startFailure
                    : copyFailure instanceof java.util.concurrent.CompletionException c && c.getCause() != null
                            ? c.getCause() : copyFailure;
            long bytes = 0;
            for (CompletableFuture<Long> c : copies) {
                bytes += c.isDone() && !c.isCompletedExceptionally() ? c.join() : 0;
            }
            // The rest of a two-part load belongs to the same open load and hold, issued later.
            Rule rule = rule(save, err != null, plan.holdNanos(), clock.getAsLong() - asked);
            if (rule == Rule.BESIDE) {
                beside(instanceId, plan, save, what, bytes, clock.getAsLong() - start, result, settled);
                return;
            }
            try {
                if (rule == Rule.END_FIRST) {
                    store.endCopy(instanceId, plan.id(), true, bytes, clock.getAsLong() - start);
                    settled.complete(null);
                    result.complete(new CopyResult(plan.blocks(), plan.skippedBlocks(), bytes));
                    return;
                }
                store.endCopy(instanceId, plan.id(), false, 0, 0);
                settled.complete(null); // before the caller's callbacks, which may flush or close
                if (startFailure != null && copies.isEmpty()) {
                    result.completeExceptionally(new TransferFailedException(what + " could not start: " + err, failed, err));
                } else {
                    result.completeExceptionally(new TransferFailedException(what + " failed: " + err, failed, err));
                }
            } catch (Throwable t) {
                settled.complete(null);
                if (err != null) {
                    // the store rejects nothing it handed out; report the copy's failure
                    result.completeExceptionally(new TransferFailedException(what + " failed: " + err, failed, err));
                } else {
                    result.completeExceptionally(t); // a load whose plan the store no longer holds
                }
            }
        });
    }

    /**
     * {@link Rule#BESIDE}: the caller hears at once and the plan ends on an end thread (docs/gpu.md,
     * "Saves seal beside their futures"); the engine's own reads wait for it ({@link #awaitEnds}).
     */
    private void beside(String instanceId, CopyPlan plan, boolean save, String what, long moved, long nanos,
            CompletableFuture<CopyResult> result, CompletableFuture<Void> settled) {
        Set<CompletableFuture<Void>> ends = save ? ending : unpinning;
        ends.add(settled);
        settled.whenComplete((v, e) -> ends.remove(settled));
        Runnable seal = () -> {
            try {
                store.endCopy(instanceId, plan.id(), true, moved, nanos);
            } catch (Throwable t) {
                // the bytes moved; the store's outcome is a save not made visible, its
                // reservation rolled back later (recomputed), or a load's pins released
                // later: at the end of the plan's hold (its instance unregistered) or at
                // the copy TTL
                LOG.log(System.Logger.Level.WARNING, "ending the " + what + " (plan " + plan.id()
                        + ") after its copy landed failed; " + (save ? "its blocks are not made visible"
                        : "the store releases its pins later"), t);
            } finally {
                settled.complete(null);
            }
        };
        try {
            enders.execute(seal);
        } catch (Throwable t) {
            seal.run(); // no thread for it (closing, or none could start): seal here
        }
        result.complete(new CopyResult(plan.blocks(), plan.skippedBlocks(), moved));
    }

    /** Whether no end is being told beside its future (nothing a full pool could wait for). */
    boolean idle() {
        return ending.isEmpty() && unpinning.isEmpty();
    }

    /**
     * Waits until every save whose future has completed has also been sealed with the control
     * plane (ends never fail: a failed end is logged), so the engine reads its own saves; with
     * {@code loads}, every held load's end too (its pins: stats, space for a save).
     */
    void awaitEnds(boolean loads) {
        for (Object end : ending.toArray()) {
            ((CompletableFuture<?>) end).join();
        }
        if (loads) {
            for (Object end : unpinning.toArray()) {
                ((CompletableFuture<?>) end).join();
            }
        }
    }

    void shutdown() {
        enders.shutdown();
    }
}
