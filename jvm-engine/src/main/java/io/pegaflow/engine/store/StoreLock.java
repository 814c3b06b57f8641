package io.pegaflow.engine.store;

import io.pegaflow.engine.EngineClosedException;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.Supplier;

/**
 * The store's one lock, and whether the store is closed. {@link LocalStore} and every
 * collaborator it aggregates ({@link PoolSpace}, {@link SavePath}, {@link LoadPath},
 * {@link OpenCopies}, {@link SsdReadBack}, {@link PeerShare}, {@link OperatorOps}) read and
 * change their state only while holding it, so each call sees all of them consistent. Any thread may take it: callers' threads, the sweeper,
 * the SSD tier's and the checksum summer's threads. Nothing waits for a copy under it.
 */
final class StoreLock {
    private final ReentrantLock lock = new ReentrantLock();
    /** Guarded by the lock. */
    private boolean closed;

    /** Takes the lock; for a block that must unlock early (pair with {@link #unlock} in a finally). */
    void lock() {
        lock.lock();
    }

    void unlock() {
        lock.unlock();
    }

    /** Runs {@code body} under the lock and returns what it returns. */
    <T> T locked(Supplier<T> body) {
        lock.lock();
        try {
            return body.get();
        } finally {
            lock.unlock();
        }
    }

    /** Runs {@code body} under the lock. */
    void locked(Runnable body) {
        lock.lock();
        try {
            body.run();
        } finally {
            lock.unlock();
        }
    }

    /** Under lock: whether the store was closed. */
    boolean closed() {
        return closed;
    }

    /** Under lock: marks the store closed; false when it already was. */
    boolean markClosed() {
        if (closed) {
            return false;
        }
        closed = true;
        return true;
    }

    /** Under lock: throws {@link EngineClosedException} once the store is closed. */
    void checkOpen() {
        if (closed) {
            throw new EngineClosedException("engine is closed");
        }
    }
}
