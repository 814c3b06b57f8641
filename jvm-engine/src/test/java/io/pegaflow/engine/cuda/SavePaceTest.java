package io.pegaflow.engine.cuda;

import static org.assertj.core.api.Assertions.assertThat;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * The save pace's permits without a GPU: save lanes on threads of their own queue copies on a
 * stand-in copy engine that runs them one after another (the GPU side of {@link SavePace.Ends});
 * at no time are more copies queued than the pace allows, no lane waits forever, and every
 * permit is back at the end. On the GPU the same class runs in CudaSavePaceContractTest.
 */
class SavePaceTest {
    /** A copy engine that runs the copies in the order they were queued, ~20 us each. */
    static final class CopyEngine implements SavePace.Ends {
        private final LinkedBlockingQueue<Long> queue = new LinkedBlockingQueue<>();
        private final Map<Long, Long> lastCopyOf = new ConcurrentHashMap<>();
        private final AtomicLong events = new AtomicLong();
        private long queued;
        private volatile long ended;
        private long mostInFlight;
        private final Thread runner = Thread.ofPlatform().daemon().start(() -> {
            try {
                while (true) {
                    long copy = queue.take();
                    LockSupport.parkNanos(20_000);
                    ended = copy;
                }
            } catch (InterruptedException e) {
                // done
            }
        });

        @Override
        public long create() {
            return events.incrementAndGet();
        }

        @Override
        public synchronized void record(long event, long stream) {
            long copy = ++queued; // the copy just queued ahead of this mark
            lastCopyOf.put(event, copy);
            mostInFlight = Math.max(mostInFlight, copy - ended);
            queue.add(copy);
        }

        @Override
        public boolean ended(long event) {
            return lastCopyOf.getOrDefault(event, 0L) <= ended;
        }

        @Override
        public void await(long event) {
            while (!ended(event)) {
                LockSupport.parkNanos(5_000);
            }
        }

        @Override
        public void destroy(long event) {
            lastCopyOf.remove(event);
        }

        synchronized long queued() {
            return queued;
        }

        synchronized long mostInFlight() {
            return mostInFlight;
        }

        void stop() {
            runner.interrupt();
        }
    }

    @ParameterizedTest(name = "{0} copies at a time")
    @ValueSource(ints = {1, 2, 3})
    void fourLanesNeverQueueMoreThanThePaceAndGiveEveryPermitBack(int copies) throws Exception {
        CopyEngine gpu = new CopyEngine();
        SavePace pace = new SavePace(copies, gpu);
        int lanes = 4;
        int perLane = 150;
        ExecutorService threads = Executors.newFixedThreadPool(lanes);
        try {
            List<Future<?>> done = new ArrayList<>();
            for (int l = 0; l < lanes; l++) {
                done.add(threads.submit(() -> {
                    SavePace.Lane lane = pace.new Lane(2);
                    for (int k = 0; k < perLane; k++) {
                        lane.acquire();
                        lane.queued(k % 2, 0L);
                    }
                    // the lane's completer, once the batch's done event passed: every copy ended
                    while (gpu.ended < gpu.queued()) {
                        LockSupport.parkNanos(10_000);
                    }
                    lane.releaseAll();
                    lane.destroy();
                    return null;
                }));
            }
            for (Future<?> f : done) {
                f.get(30, TimeUnit.SECONDS); // no lane waits forever for a permit
            }
            assertThat(gpu.mostInFlight()).isBetween(1L, (long) copies);
            assertThat(pace.permitsFree()).isEqualTo(copies);
            assertThat(pace.pacedCopies()).isEqualTo((long) lanes * perLane);
        } finally {
            threads.shutdownNow();
            gpu.stop();
        }
    }

    @ParameterizedTest(name = "{0} copies at a time")
    @ValueSource(ints = {1, 4})
    void aBatchThatEndsGivesBackWhatItStillHolds(int copies) {
        CopyEngine gpu = new CopyEngine();
        try {
            SavePace pace = new SavePace(copies, gpu);
            SavePace.Lane lane = pace.new Lane(2);
            lane.acquire();
            lane.queued(0, 0L);
            assertThat(pace.permitsFree()).isEqualTo(copies - 1);
            lane.releaseAll(); // a failed batch drained, or its done event passed
            assertThat(pace.permitsFree()).isEqualTo(copies);
            lane.releaseAll(); // twice gives nothing back twice
            assertThat(pace.permitsFree()).isEqualTo(copies);
        } finally {
            gpu.stop();
        }
    }

    /**
     * A failure between a permit and its copy's mark (the driver refused the copy of a unit of
     * long runs, or of a slot): the lane's drain gives that permit back too, so the next save
     * of a pace of one does not wait for it forever; and a lane whose marks are reused before
     * their copies ended (more permits than marks) still gives back exactly what it took.
     */
    @ParameterizedTest(name = "{0} copies at a time")
    @ValueSource(ints = {1, 3})
    void aPermitWhoseCopyWasNeverMarkedComesBackWithTheDrain(int copies) throws Exception {
        CopyEngine gpu = new CopyEngine();
        try {
            SavePace pace = new SavePace(copies, gpu);
            SavePace.Lane lane = pace.new Lane(1);
            for (int k = 0; k < copies - 1; k++) {
                lane.acquire();
                lane.queued(0, 0L); // one mark for every copy: each marks the latest
            }
            lane.acquire(); // then the failure: no copy queued, no mark
            assertThat(pace.permitsFree()).isZero();
            while (gpu.ended < gpu.queued()) {
                LockSupport.parkNanos(10_000);
            }
            lane.releaseAll();
            assertThat(pace.permitsFree()).isEqualTo(copies);
            SavePace.Lane next = pace.new Lane(2); // the next batch, on another lane
            ExecutorService one = Executors.newSingleThreadExecutor();
            try {
                one.submit(() -> {
                    next.acquire();
                    next.queued(1, 0L);
                }).get(5, TimeUnit.SECONDS);
            } finally {
                one.shutdownNow();
            }
            assertThat(pace.pacedCopies()).isEqualTo(copies + 1L);
        } finally {
            gpu.stop();
        }
    }
}
