package io.pegaflow.engine.cuda;

import java.util.ArrayDeque;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Saves' copies to the host kept few at a time on the GPU's copy engine
 * ({@link CudaOptions#savePaceCopies}): each save lane takes a permit before queueing a bounce
 * slot's copy (or a unit of long runs: a cross-layer layout's whole blocks) and gives it back
 * once that copy has ended, so a copy of vLLM's that comes
 * meanwhile (a decode step's sampled tokens to the host) waits behind a few of the save's copies,
 * not behind the rest of the save (docs/gpu.md, "Saves beside decode"). The permits are the
 * engine's, shared by its save lanes; each lane keeps its own slots' end events ({@link Lane}),
 * the CUDA driver's ({@link Ends#CUDA}) or, in a test without a GPU, others.
 */
final class SavePace {
    /** The end events of the lanes' slot copies: what the pace asks of the GPU. */
    interface Ends {
        /** A new event (a handle). */
        long create();

        /** Marks the end of the work queued on {@code stream} so far. */
        void record(long event, long stream);

        /** Whether the work the event last marked has ended. */
        boolean ended(long event);

        /** Waits until the work the event last marked has ended. */
        void await(long event);

        void destroy(long event);

        /** Blocking-sync CUDA events: a wait sleeps, no spin. */
        Ends CUDA = new Ends() {
            @Override
            public long create() {
                return CudaDriver.eventCreate(CudaDriver.CU_EVENT_BLOCKING_SYNC | CudaDriver.CU_EVENT_DISABLE_TIMING);
            }

            @Override
            public void record(long event, long stream) {
                CudaDriver.eventRecord(event, stream);
            }

            @Override
            public boolean ended(long event) {
                return CudaDriver.eventQuery(event);
            }

            @Override
            public void await(long event) {
                CudaDriver.eventSynchronize(event);
            }

            @Override
            public void destroy(long event) {
                CudaDriver.eventDestroy(event);
            }
        };
    }

    private final Semaphore permits;
    private final Ends ends;
    private final AtomicLong paced = new AtomicLong();

    SavePace(int copies) {
        this(copies, Ends.CUDA);
    }

    SavePace(int copies, Ends ends) {
        this.permits = new Semaphore(copies);
        this.ends = ends;
    }

    /** Copies queued under the pace since creation. */
    long pacedCopies() {
        return paced.get();
    }

    /** Permits free now: all of them ({@link CudaOptions#savePaceCopies}) when no save copy is queued. */
    int permitsFree() {
        return permits.availablePermits();
    }

    /**
     * One lane's side, used on the thread that queues the lane's batch (paced saves are queued
     * on the lane's own thread, never the caller's) and, once the batch ended, its completer.
     */
    final class Lane {
        /** Each mark's copy to the host has ended (a bounce slot's, a unit of long runs'). */
        private final long[] copied;
        /** Marks whose copy holds a permit, oldest first. */
        private final ArrayDeque<Integer> holding = new ArrayDeque<>();
        /** Permits taken whose copy is not marked yet ({@link #acquire} before {@link #queued}). */
        private int open;

        Lane(int marks) {
            copied = new long[marks];
            for (int s = 0; s < marks; s++) {
                copied[s] = ends.create();
            }
        }

        /**
         * A permit for the copy about to be queued: this lane's copies that ended give theirs back
         * first; while none is free this thread waits for its own oldest copy to end, or (holding
         * none) polls for another lane's.
         */
        void acquire() {
            try {
                while (true) {
                    reclaim();
                    if (permits.tryAcquire()) {
                        break;
                    }
                    if (!holding.isEmpty()) {
                        ends.await(copied[holding.peekFirst()]);
                    } else if (permits.tryAcquire(200, TimeUnit.MICROSECONDS)) {
                        break;
                    }
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new CudaException("interrupted while waiting for a paced save's copy", e);
            }
            open++;
            paced.incrementAndGet();
        }

        /** After the permit's copy was queued on {@code stream}: marks its end there with {@code mark}. */
        void queued(int mark, long stream) {
            ends.record(copied[mark], stream);
            holding.addLast(mark);
            open--;
        }

        /** Gives back the permits of this lane's copies that have ended, oldest first. */
        private void reclaim() {
            while (!holding.isEmpty() && ends.ended(copied[holding.peekFirst()])) {
                holding.pollFirst();
                permits.release();
            }
        }

        /**
         * Once the batch's copies ended (or were drained after a failure): every permit it still
         * holds goes back, those of copies a failure left unmarked too.
         */
        void releaseAll() {
            int held = holding.size() + open;
            if (held > 0) {
                permits.release(held);
                holding.clear();
                open = 0;
            }
        }

        void destroy() {
            for (long e : copied) {
                ends.destroy(e);
            }
        }
    }
}
