package io.pegaflow.server.cluster;

import java.nio.ByteBuffer;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;

/**
 * This host's registry updates on their way out: the store's threads queue them, netted per key,
 * without blocking; the {@code pegaflow-registry-flush} thread sends them through a {@link Sender}
 * (Lettuce-free, so a test fakes it). A drop is repaired by advertising every resident block
 * again, and {@link #flush} is the barrier that waits for both.
 */
final class AdvertisementQueue {
    static final int FLUSH_BATCH = 16_384;

    /** Where the queue's updates go: Redis in {@link RedisBlockRegistry}, a fake in a test. Called by the flusher thread. */
    interface Sender {
        /**
         * Sends netted updates, key to advertise (true) or withdraw (false), and other hosts'
         * claims to clear, key to owner index (negative: {@code -1 - index} of a departed host).
         * False when they were dropped instead for want of a healthy connection; throws when
         * Redis failed on the way.
         */
        boolean send(Map<ByteBuffer, Boolean> updates, Map<ByteBuffer, Integer> forgets) throws Exception;

        /** Whether this host holds an index and Redis answered its last heartbeat: a repair can run now. */
        boolean healthy();

        /** A send threw: counted, and Redis is taken as down until a heartbeat answers. */
        void failed(String what, Exception e);

        /** This host's registry index, named by the log line of a finished repair. */
        int index();
    }

    /** Time for the flush deadline: {@link #SYSTEM}, or a test's that moves only when told. */
    interface Clock {
        Clock SYSTEM = new Clock() {
            @Override
            public long nanoTime() {
                return System.nanoTime();
            }

            @Override
            public void await(Object lock, long nanos) throws InterruptedException {
                lock.wait(Math.max(1, nanos / 1_000_000));
            }
        };

        long nanoTime();

        /** Waits on {@code lock}, which the caller holds, until notified or about {@code nanos} passed. */
        void await(Object lock, long nanos) throws InterruptedException;
    }

    private static final System.Logger LOG = System.getLogger(RedisBlockRegistry.class.getName());

    private final RedisBlockRegistry.Settings settings;
    private final Sender sender;
    /** Walks the keys of this host's resident blocks, for a full re-advertisement. */
    private final Consumer<Consumer<byte[]>> resident;
    private final Clock clock;
    private Thread flusher;

    private final Object queueLock = new Object();
    /** Netted updates: key -> true (advertise) / false (withdraw). Guarded by queueLock. */
    private LinkedHashMap<ByteBuffer, Boolean> queued = new LinkedHashMap<>();
    /** Other hosts' claims to clear: key -> owner index (negative: -1 - index of a departed host). Guarded by queueLock. */
    private LinkedHashMap<ByteBuffer, Integer> forgets = new LinkedHashMap<>();
    private boolean resyncWanted;
    private long flushRequested;
    private long flushDone;
    /**
     * Advertisements dropped so far (Redis unreachable, or the queue full), as an epoch, and
     * the epoch a full re-advertisement last covered: while the first is ahead, a flush cannot
     * say that every save before it is visible to other hosts. Guarded by queueLock.
     */
    private long dropEpoch;
    private long resyncedEpoch;
    private volatile boolean closed;

    private final AtomicLong dropped = new AtomicLong();
    private final AtomicLong resyncs = new AtomicLong();

    AdvertisementQueue(RedisBlockRegistry.Settings settings, Sender sender, Consumer<Consumer<byte[]>> resident, Clock clock) {
        this.settings = settings;
        this.sender = sender;
        this.resident = resident;
        this.clock = clock;
    }

    /** Starts the flusher thread. */
    void start() {
        flusher = Thread.ofPlatform().daemon().name("pegaflow-registry-flush").start(this::flushLoop);
    }

    long dropped() {
        return dropped.get();
    }

    long resyncs() {
        return resyncs.get();
    }

    // ------------------------------------------------------------ queueing (never blocks)

    /** Queues advertising ({@code holds}) or withdrawing {@code key}; a full queue drops it and wants a repair. */
    void enqueue(byte[] key, boolean holds) {
        ByteBuffer k = ByteBuffer.wrap(key);
        synchronized (queueLock) {
            if (queued.size() >= settings.queueDepth() && !queued.containsKey(k)) {
                dropped.incrementAndGet();
                dropEpoch++;
                resyncWanted = true; // the full re-advertisement is what repairs a lost one
                return;
            }
            queued.put(k, holds);
            if (queued.size() == 1 || queued.size() >= FLUSH_BATCH) {
                queueLock.notifyAll();
            }
        }
    }

    /** Queues clearing live host {@code owner}'s claim on {@code key}; a full queue drops it (counted). */
    void forget(byte[] key, int owner) {
        synchronized (queueLock) {
            if (!queueForget(key, owner)) {
                dropped.incrementAndGet();
                return;
            }
            queueLock.notifyAll();
        }
    }

    /** Queues clearing departed host {@code owner}'s bit on {@code key} (checked against its node key in Redis). */
    void forgetDeparted(byte[] key, int owner) {
        synchronized (queueLock) {
            queueForget(key, -1 - owner);
        }
    }

    /** False when the queue of claims to clear is full. Holds queueLock. */
    private boolean queueForget(byte[] key, int claim) {
        if (forgets.size() >= settings.queueDepth()) {
            return false;
        }
        forgets.put(ByteBuffer.wrap(key), claim);
        return true;
    }

    /** Wants a full re-advertisement; it runs once the sender is healthy (the heartbeat's thread). */
    void repairWanted() {
        synchronized (queueLock) {
            resyncWanted = true;
            queueLock.notifyAll();
        }
    }

    /** Redis answers again (the heartbeat's thread): a wanted re-advertisement can run now. */
    void redisAnswers() {
        synchronized (queueLock) {
            queueLock.notifyAll();
        }
    }

    // ------------------------------------------------------------ the barrier

    /**
     * Returns once every update queued before it was sent. With {@code awaitRepair}, a drop
     * since the last full re-advertisement is waited for too: the barrier fails naming Redis
     * when that repair has not happened within its deadline (4 timeouts) rather than return as
     * if the saves were visible. Without it (a clean stop), a repair is not waited for.
     */
    void flush(boolean awaitRepair) throws Exception {
        synchronized (queueLock) {
            long ticket = ++flushRequested;
            queueLock.notifyAll();
            long deadline = clock.nanoTime() + settings.timeout().toNanos() * 4;
            while (!closed && (flushDone < ticket || (awaitRepair && dropEpoch > resyncedEpoch))) {
                long left = deadline - clock.nanoTime();
                if (left <= 0) {
                    break;
                }
                clock.await(queueLock, left);
            }
            if (dropEpoch > resyncedEpoch) {
                throw new java.io.IOException("registry: advertisements were dropped (Redis at "
                        + RedisBlockRegistry.redacted(settings.url()) + " unreachable, or the queue of " + settings.queueDepth()
                        + " full) and not advertised again within " + settings.timeout().multipliedBy(4)
                        + "; this host's blocks are advertised again once Redis answers, and other hosts do not see them until then");
            }
            if (flushDone < ticket && !closed) {
                throw new java.util.concurrent.TimeoutException("registry flush not done in " + settings.timeout().multipliedBy(4));
            }
        }
    }

    /** Stops the flusher: a flush waiting returns, and nothing more is sent once the round in progress ends. */
    void stop() {
        closed = true;
        synchronized (queueLock) {
            queueLock.notifyAll();
        }
    }

    boolean stopped() {
        return closed;
    }

    /** Waits up to {@code millis} for the flusher to end after {@link #stop}. */
    void join(long millis) {
        try {
            flusher.join(millis);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    // ------------------------------------------------------------ the flusher

    private void flushLoop() {
        while (!closed) {
            LinkedHashMap<ByteBuffer, Boolean> batch;
            LinkedHashMap<ByteBuffer, Integer> forget;
            boolean resync;
            long ticket;
            long epochAtStart;
            synchronized (queueLock) {
                // a wanted re-advertisement waits for Redis to answer (the heartbeat wakes this thread)
                while (!closed && queued.isEmpty() && forgets.isEmpty() && !(resyncWanted && sender.healthy())
                        && flushDone == flushRequested) {
                    try {
                        queueLock.wait(100);
                    } catch (InterruptedException e) {
                        return;
                    }
                }
                batch = queued;
                queued = new LinkedHashMap<>();
                forget = forgets;
                forgets = new LinkedHashMap<>();
                resync = resyncWanted && sender.healthy();
                if (resync) {
                    resyncWanted = false;
                }
                ticket = flushRequested;
                epochAtStart = dropEpoch;
            }
            boolean sent = false;
            boolean resynced = false;
            try {
                sent = send(batch, forget);
                if (resync) {
                    resynced = resyncAll();
                }
            } catch (Exception e) {
                sender.failed("sending " + batch.size() + " registry updates", e);
                if (resync) {
                    synchronized (queueLock) {
                        resyncWanted = true;
                    }
                }
            }
            synchronized (queueLock) {
                if (!sent) {
                    dropEpoch++;
                    resyncWanted = true; // runs once Redis answers: the heartbeat that sees it notifies
                }
                if (resynced) {
                    resyncedEpoch = Math.max(resyncedEpoch, epochAtStart); // what was dropped before it began
                }
                flushDone = Math.max(flushDone, ticket);
                queueLock.notifyAll();
            }
        }
    }

    /** Sends the updates; false when they were dropped instead (counted: the repair after reconnecting re-advertises). */
    private boolean send(Map<ByteBuffer, Boolean> batch, Map<ByteBuffer, Integer> forget) throws Exception {
        if (batch.isEmpty() && forget.isEmpty()) {
            return true;
        }
        if (!sender.send(batch, forget)) {
            dropped.addAndGet(batch.size() + forget.size());
            return false;
        }
        return true;
    }

    /**
     * Advertises every resident block again (Redis restarted empty, or answered again after an
     * outage); true when every chunk was sent (none dropped for want of a healthy connection).
     */
    private boolean resyncAll() throws Exception {
        resyncs.incrementAndGet();
        LinkedHashMap<ByteBuffer, Boolean> chunk = new LinkedHashMap<>();
        Exception[] failure = new Exception[1];
        boolean[] all = {true};
        resident.accept(key -> {
            if (failure[0] != null) {
                return;
            }
            chunk.put(ByteBuffer.wrap(key), true);
            if (chunk.size() >= FLUSH_BATCH) {
                try {
                    all[0] &= send(chunk, Map.of());
                } catch (Exception e) {
                    failure[0] = e;
                }
                chunk.clear();
            }
        });
        if (failure[0] != null) {
            throw failure[0];
        }
        all[0] &= send(chunk, Map.of());
        if (all[0]) {
            LOG.log(System.Logger.Level.INFO, "registry: resident blocks advertised again (node " + sender.index() + ")");
        }
        return all[0];
    }
}
