package io.pegaflow.server.cluster;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.BlockHashes;
import java.io.IOException;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The flush barrier on a real redis-server: it returns once the advertisements before it are in
 * Redis, repairs a queue that overflowed by advertising every resident block again, and fails
 * (rather than claim visibility) while Redis is unreachable.
 */
class RegistryFlushTest {
    @TempDir
    Path dir;
    private Process redis;

    @AfterEach
    void stop() throws Exception {
        if (redis != null) {
            redis.destroy();
            redis.waitFor(5, TimeUnit.SECONDS);
        }
    }

    private int startRedis() throws Exception {
        int port;
        try (ServerSocket s = new ServerSocket(0)) {
            port = s.getLocalPort();
        }
        redis = new ProcessBuilder("redis-server", "--port", Integer.toString(port), "--bind", "127.0.0.1", "--dir",
                dir.toString(), "--save", "", "--appendonly", "no").redirectErrorStream(true)
                .redirectOutput(dir.resolve("redis.log").toFile()).start();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (true) {
            try (Socket s = new Socket("127.0.0.1", port)) {
                return port;
            } catch (IOException e) {
                assertThat(System.nanoTime()).as("redis-server listening").isLessThan(deadline);
                Thread.sleep(20);
            }
        }
    }

    /** A registry whose resident blocks (what a full re-advertisement sends) are {@code resident}'s, read at each walk. */
    private static RedisBlockRegistry registry(int port, String addr, int queueDepth, List<byte[]> resident) {
        var settings = new RedisBlockRegistry.Settings("redis://127.0.0.1:" + port, 16, Duration.ofMillis(100),
                Duration.ofMillis(600), queueDepth, Duration.ofSeconds(1), null);
        return new RedisBlockRegistry(settings, addr, each -> resident.forEach(h -> each.accept("ns", h)));
    }

    private static List<byte[]> hashes(int n, long seed) {
        byte[] packed = new byte[n * 32];
        new Random(seed).nextBytes(packed);
        List<byte[]> out = new CopyOnWriteArrayList<>();
        for (int i = 0; i < n; i++) {
            out.add(Arrays.copyOfRange(packed, i * 32, (i + 1) * 32));
        }
        return out;
    }

    private static BlockHashes packed(List<byte[]> hashes) {
        byte[] out = new byte[hashes.size() * 32];
        for (int i = 0; i < hashes.size(); i++) {
            System.arraycopy(hashes.get(i), 0, out, i * 32, 32);
        }
        return new BlockHashes(out, 32);
    }

    private static void signal(Process p, String sig) throws Exception {
        assertThat(new ProcessBuilder("kill", "-" + sig, Long.toString(p.pid())).start().waitFor()).as("kill -%s", sig).isZero();
    }

    private static void waitFor(java.util.function.BooleanSupplier ok, String what) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!ok.getAsBoolean()) {
            assertThat(System.nanoTime()).as(what).isLessThan(deadline);
            Thread.sleep(20);
        }
    }

    /** Waits until both hosts answer and the asker sees the owner, then advertises {@code hashes} on the owner. */
    private static void registerAndAdvertise(RedisBlockRegistry owner, RedisBlockRegistry asker, List<byte[]> hashes)
            throws InterruptedException {
        waitFor(() -> owner.connected() && asker.connected() && asker.liveNodes().size() == 1, "both hosts registered");
        for (byte[] h : hashes) {
            owner.advertise("ns", h);
        }
    }

    /** CPU time of every registry flusher thread in this JVM, in ns. */
    private static long flusherCpuNanos() {
        java.lang.management.ThreadMXBean mx = java.lang.management.ManagementFactory.getThreadMXBean();
        return Thread.getAllStackTraces().keySet().stream().filter(t -> t.getName().equals("pegaflow-registry-flush"))
                .mapToLong(t -> Math.max(0, mx.getThreadCpuTime(t.threadId()))).sum();
    }

    @Test
    void aFlushConfirmsWhatWasSentRepairsAnOverflowAndFailsWhileRedisIsDown() throws Exception {
        int port = startRedis();
        List<byte[]> resident = hashes(50, 9);
        // a queue of 4: most of the 50 advertisements below overflow it
        try (RedisBlockRegistry owner = registry(port, "10.0.0.1:1", 4, resident);
                RedisBlockRegistry asker = registry(port, "10.0.0.2:1", 4, List.of())) {
            registerAndAdvertise(owner, asker, resident);
            assertThat(owner.stats().dropped()).as("the queue overflowed").isPositive();
            owner.flush(); // the overflow is repaired by advertising every resident block again
            assertThat(asker.lookup("ns", packed(resident), List.of()).blocks()).isEqualTo(50);

            redis.destroy();
            redis.waitFor(5, TimeUnit.SECONDS);
            redis = null;
            waitFor(() -> !owner.connected(), "the owner noticed Redis went away");
            owner.advertise("ns", new byte[32]);
            long t0 = System.nanoTime();
            long cpu0 = flusherCpuNanos();
            assertThatThrownBy(owner::flush).isInstanceOf(IOException.class)
                    .hasMessageContaining("advertisements were dropped").hasMessageContaining("127.0.0.1:" + port);
            assertThat(Duration.ofNanos(System.nanoTime() - t0)).as("the flush waited its 4 timeouts, no longer")
                    .isBetween(Duration.ofMillis(3900), Duration.ofSeconds(8));
            // the wanted re-advertisement waits for Redis: the flusher sleeps meanwhile instead of spinning
            assertThat(Duration.ofNanos(flusherCpuNanos() - cpu0)).as("flusher CPU over the 4 s wait")
                    .isLessThan(Duration.ofMillis(400));
        }
    }

    /**
     * Redis stops answering for a moment (SIGSTOP, then SIGCONT): the advertisement sent meanwhile
     * is dropped, and a flush waits for the re-advertisement that repairs it instead of failing.
     */
    @Test
    void aFlushWaitsForTheRepairOfAnAdvertisementDroppedInABlip() throws Exception {
        int port = startRedis();
        List<byte[]> resident = hashes(20, 11);
        try (RedisBlockRegistry owner = registry(port, "10.0.0.1:1", 1024, resident);
                RedisBlockRegistry asker = registry(port, "10.0.0.2:1", 1024, List.of())) {
            registerAndAdvertise(owner, asker, resident);
            owner.flush();
            long droppedBefore = owner.stats().dropped();

            signal(redis, "STOP");
            Thread resume = null;
            try {
                waitFor(() -> !owner.connected(), "the owner's heartbeat timed out");
                byte[] late = hashes(1, 12).get(0);
                resident.add(late);
                owner.advertise("ns", late);
                waitFor(() -> owner.stats().dropped() > droppedBefore, "the advertisement dropped");
                resume = Thread.ofPlatform().start(() -> {
                    try {
                        Thread.sleep(500);
                        signal(redis, "CONT");
                    } catch (Exception e) {
                        throw new IllegalStateException(e);
                    }
                });
                owner.flush(); // returns once Redis answers again and every resident block is advertised again
            } finally {
                if (resume != null) {
                    resume.join();
                } else {
                    signal(redis, "CONT");
                }
            }
            assertThat(owner.stats().resyncs()).as("repaired by a re-advertisement").isGreaterThan(1);
            waitFor(() -> asker.connected() && asker.liveNodes().size() == 1, "the asker sees the owner again");
            assertThat(asker.lookup("ns", packed(resident), List.of()).blocks()).as("the late block visible").isEqualTo(21);
        }
    }
}
