package io.pegaflow.server.cluster;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

/**
 * Helper threads for an owner's block checksums: the blocks of the next batch that were not
 * summed ahead ({@code BlockChecksums}) are summed while the socket takes this one, so a stream
 * costs the slower of the two instead of their sum (docs/cluster.md, "Where a fetch's time goes").
 * The reader sums each piece as it lands, on its own thread ({@code TcpPeerTransport}).
 */
final class Checksummer implements AutoCloseable {
    private final ExecutorService threads;

    Checksummer(String name, int threads) {
        this.threads = Executors.newFixedThreadPool(threads, Thread.ofPlatform().daemon().name(name, 0).factory());
    }

    <T> Future<T> submit(Callable<T> task) {
        return threads.submit(task);
    }

    /** The task's result; its failure as an IOException (the transfer fails, its blocks are misses). */
    static <T> T await(Future<T> f) throws IOException {
        try {
            return f.get();
        } catch (ExecutionException e) {
            throw e.getCause() instanceof IOException io ? io : new IOException("checksum: " + e.getCause(), e.getCause());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("interrupted while checksumming");
        }
    }

    @Override
    public void close() {
        threads.shutdownNow();
    }
}
