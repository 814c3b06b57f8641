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

    private static RedisBlockRegistry registry(int port, String addr, int queueDepth, byte[] resident) {
        var settings = new RedisBlockRegistry.Settings("redis://127.0.0.1:" + port, 16, Duration.ofMillis(100),
                Duration.ofMillis(600), queueDepth, Duration.ofSeconds(1), null);
        return new RedisBlockRegistry(settings, addr, each -> {
            for (int i = 0; i < resident.length / 32; i++) {
                each.accept("ns", Arrays.copyOfRange(resident, i * 32, (i + 1) * 32));
            }
        });
    }

    private static void waitFor(java.util.function.BooleanSupplier ok, String what) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!ok.getAsBoolean()) {
            assertThat(System.nanoTime()).as(what).isLessThan(deadline);
            Thread.sleep(20);
        }
    }

    @Test
    void aFlushConfirmsWhatWasSentRepairsAnOverflowAndFailsWhileRedisIsDown() throws Exception {
        int port = startRedis();
        byte[] packed = new byte[50 * 32];
        new Random(9).nextBytes(packed);
        // a queue of 4: most of the 50 advertisements below overflow it
        try (RedisBlockRegistry owner = registry(port, "10.0.0.1:1", 4, packed);
                RedisBlockRegistry asker = registry(port, "10.0.0.2:1", 4, new byte[0])) {
            waitFor(() -> owner.connected() && asker.connected() && asker.liveNodes().size() == 1, "both hosts registered");
            for (int i = 0; i < 50; i++) {
                owner.advertise("ns", Arrays.copyOfRange(packed, i * 32, (i + 1) * 32));
            }
            assertThat(owner.stats().dropped()).as("the queue overflowed").isPositive();
            owner.flush(); // the overflow is repaired by advertising every resident block again
            assertThat(asker.lookup("ns", new BlockHashes(packed, 32), List.of()).blocks()).isEqualTo(50);

            redis.destroy();
            redis.waitFor(5, TimeUnit.SECONDS);
            redis = null;
            waitFor(() -> !owner.connected(), "the owner noticed Redis went away");
            owner.advertise("ns", new byte[32]);
            assertThatThrownBy(owner::flush).isInstanceOf(IOException.class)
                    .hasMessageContaining("advertisements were dropped").hasMessageContaining("127.0.0.1:" + port);
        }
    }
}
