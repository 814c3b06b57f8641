package io.pegaflow.engine.store;

import java.util.concurrent.ArrayBlockingQueue;
import java.util.function.Consumer;

/**
 * Sums sealed blocks once, on one background thread, while other hosts may read them
 * ({@link LocalStore#attachRemote}): a peer's read then sends the kept checksum instead of
 * summing the block on its critical path, as a one-sided (RDMA) read needs anyway, where the
 * owner's CPU takes no part. The queue is bounded: a block offered to a full queue is summed
 * when it is first sent instead (counted), so a host saving faster than one core sums never
 * falls behind or blocks a save.
 */
final class BlockChecksums implements AutoCloseable {
    static final int QUEUE = 1 << 16;

    private final ArrayBlockingQueue<Block> queue = new ArrayBlockingQueue<>(QUEUE);
    private final Thread thread;

    BlockChecksums(Consumer<Block> sum) {
        this.thread = Thread.ofPlatform().daemon().name("pegaflow-block-crc").start(() -> {
            try {
                while (true) {
                    Block b = queue.take();
                    try {
                        sum.accept(b);
                    } catch (RuntimeException e) {
                        // the store closed under it: the block is summed when sent, if ever
                    }
                }
            } catch (InterruptedException e) {
                // closed
            } catch (Throwable t) {
                // a fault reading the pool, out of memory: blocks are summed when sent from now on
                System.getLogger(BlockChecksums.class.getName()).log(System.Logger.Level.WARNING,
                        "summing sealed blocks ahead stopped; peers' reads sum them when sent", t);
            } finally {
                queue.clear();
            }
        });
    }

    /**
     * Queues {@code b} (under the store's lock: never waits); false when the queue is full or the
     * thread has stopped (the block is then summed when first sent).
     */
    boolean offer(Block b) {
        return thread.isAlive() && queue.offer(b);
    }

    /** Stops the thread and waits for the block it is summing (called before the pool goes away). */
    @Override
    public void close() {
        queue.clear();
        thread.interrupt();
        boolean interrupted = false;
        while (thread.isAlive()) { // a block's sum takes milliseconds; the pool must outlive it
            try {
                thread.join();
            } catch (InterruptedException e) {
                interrupted = true;
            }
        }
        if (interrupted) {
            Thread.currentThread().interrupt();
        }
    }
}
