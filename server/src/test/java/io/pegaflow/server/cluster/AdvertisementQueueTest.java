package io.pegaflow.server.cluster;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.entry;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The flush barrier without Redis: a fake sender that can hold a send, refuse it (Redis
 * unhealthy) and records what it sent, and a fake clock that moves only when the test says, so
 * a flush's deadline passes exactly when the test wants it to.
 */
class AdvertisementQueueTest {
    private static final Duration TIMEOUT = Duration.ofSeconds(1);

    /** Records what it sent; refuses while not healthy; holds each send while {@link #gate} is set. */
    static final class FakeSender implements AdvertisementQueue.Sender {
        volatile boolean healthy = true;
        volatile CountDownLatch gate;
        /** A permit per send begun. */
        final Semaphore begun = new Semaphore(0);
        final List<Map<ByteBuffer, Boolean>> sent = new CopyOnWriteArrayList<>();
        final List<String> failures = new CopyOnWriteArrayList<>();

        @Override
        public boolean send(Map<ByteBuffer, Boolean> updates, Map<ByteBuffer, Integer> forgets) throws Exception {
            begun.release();
            CountDownLatch g = gate;
            if (g != null) {
                assertThat(g.await(10, TimeUnit.SECONDS)).as("the test released the send").isTrue();
            }
            if (!healthy) {
                return false;
            }
            sent.add(new LinkedHashMap<>(updates)); // the queue reuses a repair's chunk
            return true;
        }

        @Override
        public boolean healthy() {
            return healthy;
        }

        @Override
        public void failed(String what, Exception e) {
            failures.add(what + ": " + e);
        }

        @Override
        public int index() {
            return 3;
        }

        /** Every update sent, in order: a key netted right appears once. */
        List<Map.Entry<ByteBuffer, Boolean>> updates() {
            List<Map.Entry<ByteBuffer, Boolean>> out = new ArrayList<>();
            sent.forEach(batch -> out.addAll(batch.entrySet()));
            return out;
        }
    }

    /** Moves only when {@link #advance} says; a flush waiting on it looks again every few ms. */
    static final class FakeClock implements AdvertisementQueue.Clock {
        final AtomicLong now = new AtomicLong(1_000_000_000L);
        /** A permit per wait begun: the flush took its deadline and looked at the time before it. */
        final Semaphore waits = new Semaphore(0);

        @Override
        public long nanoTime() {
            return now.get();
        }

        @Override
        public void await(Object lock, long nanos) throws InterruptedException {
            waits.release();
            lock.wait(5);
        }

        void advance(Duration d) {
            now.addAndGet(d.toNanos());
        }
    }

    private final FakeSender sender = new FakeSender();
    private final FakeClock clock = new FakeClock();
    private final List<byte[]> resident = new CopyOnWriteArrayList<>();
    private AdvertisementQueue queue;

    private AdvertisementQueue start(int queueDepth) {
        var settings = new RedisBlockRegistry.Settings("redis://:s3cret@10.0.0.5:6379", 16, Duration.ofMillis(100),
                Duration.ofMillis(600), queueDepth, TIMEOUT, null);
        queue = new AdvertisementQueue(settings, sender, each -> resident.forEach(each), clock);
        queue.start();
        return queue;
    }

    @AfterEach
    void stop() {
        CountDownLatch g = sender.gate;
        if (g != null) {
            g.countDown();
        }
        if (queue != null) {
            queue.stop();
            queue.join(2000);
        }
        assertThat(sender.failures).as("no send threw").isEmpty();
    }

    private static byte[] key(String name) {
        return name.getBytes(StandardCharsets.US_ASCII);
    }

    private static ByteBuffer k(String name) {
        return ByteBuffer.wrap(key(name));
    }

    /** {@code queue.flush(true)} on a thread of its own. */
    private CompletableFuture<Void> flushAsync() {
        CompletableFuture<Void> f = new CompletableFuture<>();
        Thread.ofPlatform().daemon().name("test-flush").start(() -> {
            try {
                queue.flush(true);
                f.complete(null);
            } catch (Throwable t) {
                f.completeExceptionally(t);
            }
        });
        return f;
    }

    private static void await(Semaphore s, String what) throws InterruptedException {
        assertThat(s.tryAcquire(10, TimeUnit.SECONDS)).as(what).isTrue();
    }

    /** A flush on its own thread, once it waits: it took its deadline from the fake clock. */
    private CompletableFuture<Void> waitingFlush() throws InterruptedException {
        CompletableFuture<Void> flush = flushAsync();
        await(clock.waits, "the flush waiting");
        return flush;
    }

    /** Lets the waiting flush look at the clock again a few times: it is still waiting after. */
    private void flushKeepsWaiting(CompletableFuture<Void> flush) throws InterruptedException {
        clock.waits.drainPermits();
        assertThat(clock.waits.tryAcquire(3, 10, TimeUnit.SECONDS)).as("the flush looked at the clock again").isTrue();
        assertThat(flush).as("the flush still waits").isNotDone();
    }

    /** Holds the flusher in the send of a first update, so that what is queued next waits for it. */
    private void holdTheFlusher() throws InterruptedException {
        sender.gate = new CountDownLatch(1);
        queue.enqueue(key("plug"), true);
        await(sender.begun, "the flusher sending");
    }

    private void releaseTheFlusher() {
        CountDownLatch g = sender.gate;
        sender.gate = null;
        g.countDown();
    }

    @Test
    void aFlushReturnsOnceEverythingQueuedBeforeItWasSent() throws Exception {
        start(1024);
        holdTheFlusher();
        queue.enqueue(key("a"), true);
        CompletableFuture<Void> flush = waitingFlush();
        flushKeepsWaiting(flush); // the send under way began before the flush: it does not count
        releaseTheFlusher();
        flush.get(10, TimeUnit.SECONDS);
        assertThat(sender.updates()).containsExactly(entry(k("plug"), true), entry(k("a"), true));
        assertThat(queue.dropped()).isZero();
        assertThat(queue.resyncs()).isZero();
    }

    @Test
    void aDropMakesAFlushWaitForTheRepairAndSucceedWhenItHappens() throws Exception {
        start(1024);
        sender.healthy = false;
        resident.add(key("a"));
        queue.enqueue(key("a"), true);
        await(sender.begun, "the advertisement refused"); // a flush from now on sees it dropped
        CompletableFuture<Void> flush = waitingFlush();
        flushKeepsWaiting(flush); // sent nothing it was asked to, and no repair yet
        assertThat(sender.sent).isEmpty();

        sender.healthy = true;
        queue.redisAnswers(); // as the heartbeat that sees Redis again does
        flush.get(10, TimeUnit.SECONDS);
        assertThat(queue.dropped()).isEqualTo(1);
        assertThat(queue.resyncs()).as("one full re-advertisement").isEqualTo(1);
        assertThat(sender.updates()).as("the dropped block, advertised again").containsExactly(entry(k("a"), true));
        assertThat(clock.now.get()).as("no fake time passed").isEqualTo(1_000_000_000L);
    }

    @Test
    void aFlushWhoseRepairDoesNotComeWithinItsDeadlineFails() throws Exception {
        start(1024);
        sender.healthy = false;
        queue.enqueue(key("a"), true);
        await(sender.begun, "the advertisement refused"); // a flush from now on sees it dropped
        CompletableFuture<Void> flush = waitingFlush();

        clock.advance(TIMEOUT.multipliedBy(4).minusNanos(1));
        flushKeepsWaiting(flush); // its deadline is 4 timeouts
        clock.advance(Duration.ofNanos(1));
        assertThat(flush).failsWithin(Duration.ofSeconds(10)).withThrowableOfType(ExecutionException.class)
                .havingCause().isInstanceOf(IOException.class).withMessage("registry: advertisements were dropped"
                + " (Redis at redis://***@10.0.0.5:6379 unreachable, or the queue of 1024 full) and not advertised again"
                + " within PT4S; this host's blocks are advertised again once Redis answers, and other hosts do not see"
                + " them until then");
        assertThat(queue.dropped()).isEqualTo(1);
        assertThat(queue.resyncs()).isZero();
    }

    @Test
    void anAdvertisementThenAWithdrawalOfOneKeySendsOnlyTheLast() throws Exception {
        start(1024);
        holdTheFlusher();
        queue.enqueue(key("a"), true);
        queue.enqueue(key("b"), true);
        queue.enqueue(key("a"), false);
        releaseTheFlusher();
        queue.flush(true);
        assertThat(sender.sent).hasSize(2);
        assertThat(sender.sent.get(1)).containsExactly(entry(k("a"), false), entry(k("b"), true));
    }

    @Test
    void anOverflowingQueueAsksForTheRepair() throws Exception {
        start(2);
        resident.addAll(List.of(key("a"), key("b"), key("c")));
        holdTheFlusher();
        queue.enqueue(key("a"), true);
        queue.enqueue(key("b"), true);
        queue.enqueue(key("a"), true); // queued already: netted, not dropped
        assertThat(queue.dropped()).isZero();
        queue.enqueue(key("c"), true); // a third key in a queue of 2
        assertThat(queue.dropped()).isEqualTo(1);
        releaseTheFlusher();
        queue.flush(true);
        assertThat(queue.resyncs()).as("the repair ran").isEqualTo(1);
        assertThat(sender.sent.getLast()).as("every resident block advertised again, the dropped one too")
                .containsExactly(entry(k("a"), true), entry(k("b"), true), entry(k("c"), true));
    }
}
