package io.pegaflow.server.cluster;

import static org.assertj.core.api.Assertions.assertThat;

import io.pegaflow.engine.BlockHashes;
import java.io.IOException;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The registry on a real Redis Cluster of three shards (redis-server in cluster mode, joined by
 * redis-cli): block keys spread over the shards, lookups read across them, withdrawals and a
 * departed host's cleanup run shard by shard.
 */
class RedisClusterRegistryTest {
    @TempDir
    Path dir;
    private final List<Process> shards = new ArrayList<>();
    private final List<Integer> ports = new ArrayList<>();

    @BeforeEach
    void startCluster() throws Exception {
        for (int i = 0; i < 3; i++) {
            int port;
            try (ServerSocket s = new ServerSocket(0)) {
                port = s.getLocalPort();
            }
            ports.add(port);
            shards.add(new ProcessBuilder("redis-server", "--port", Integer.toString(port), "--bind", "127.0.0.1",
                    "--cluster-enabled", "yes", "--cluster-config-file", "nodes-" + port + ".conf", "--dir", dir.toString(),
                    "--save", "", "--appendonly", "no").redirectErrorStream(true)
                    .redirectOutput(dir.resolve("redis-" + port + ".log").toFile()).start());
        }
        for (int port : ports) {
            waitListening(port);
        }
        List<String> create = new ArrayList<>(List.of("redis-cli", "--cluster", "create"));
        for (int port : ports) {
            create.add("127.0.0.1:" + port);
        }
        create.addAll(List.of("--cluster-replicas", "0", "--cluster-yes"));
        Process p = new ProcessBuilder(create).redirectErrorStream(true).redirectOutput(dir.resolve("create.log").toFile()).start();
        assertThat(p.waitFor(60, TimeUnit.SECONDS)).isTrue();
        assertThat(p.exitValue()).as("redis-cli --cluster create").isZero();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        while (!clusterOk()) {
            assertThat(System.nanoTime()).as("cluster_state:ok").isLessThan(deadline);
            Thread.sleep(100);
        }
    }

    private boolean clusterOk() throws Exception {
        for (int port : ports) {
            if (!cli(port, "cluster", "info").contains("cluster_state:ok")) {
                return false;
            }
        }
        return true;
    }

    private static String cli(int port, String... args) throws Exception {
        List<String> cmd = new ArrayList<>(List.of("redis-cli", "-p", Integer.toString(port)));
        cmd.addAll(List.of(args));
        Process p = new ProcessBuilder(cmd).start();
        String out = new String(p.getInputStream().readAllBytes()).trim();
        p.waitFor();
        return out;
    }

    private static void waitListening(int port) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (true) {
            try (Socket s = new Socket("127.0.0.1", port)) {
                return;
            } catch (IOException e) {
                assertThat(System.nanoTime()).isLessThan(deadline);
                Thread.sleep(20);
            }
        }
    }

    @AfterEach
    void stop() throws Exception {
        for (Process p : shards) {
            p.destroy();
            p.waitFor(5, TimeUnit.SECONDS);
        }
    }

    /**
     * A registry whose resident blocks (what a full re-advertisement sends, as the server's store
     * would) are {@code resident}'s. Node keys live 3 s: a heartbeat late on a loaded 2-core CI
     * machine does not lose this host its index mid-test.
     */
    private RedisBlockRegistry registry(String addr, Set<ByteBuffer> resident) {
        String url = "redis://127.0.0.1:" + ports.get(0) + ",127.0.0.1:" + ports.get(1);
        var settings = new RedisBlockRegistry.Settings(url, 16, Duration.ofMillis(100), Duration.ofSeconds(3), 100_000,
                Duration.ofSeconds(2), null, true);
        return new RedisBlockRegistry(settings, addr, each -> resident.forEach(h -> each.accept("ns", h.array())));
    }

    private static void waitFor(java.util.function.BooleanSupplier ok, String what) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!ok.getAsBoolean()) {
            assertThat(System.nanoTime()).as(what).isLessThan(deadline);
            Thread.sleep(20);
        }
    }

    private long keys() throws Exception {
        long sum = 0;
        for (int port : ports) {
            sum += Long.parseLong(cli(port, "dbsize"));
        }
        return sum;
    }

    @Test
    void blocksSpreadOverTheShardsAndALookupReadsAcrossThem() throws Exception {
        byte[] packed = new byte[2048 * 32];
        new Random(5).nextBytes(packed);
        BlockHashes prefix = new BlockHashes(packed, 32);
        Set<ByteBuffer> resident = ConcurrentHashMap.newKeySet();
        RedisBlockRegistry owner = registry("10.0.0.1:1", resident);
        try (RedisBlockRegistry asker = registry("10.0.0.2:1", Set.of()); RedisBlockRegistry third = registry("10.0.0.3:1", Set.of())) {
            waitFor(() -> owner.connected() && asker.connected() && asker.liveNodes().size() == 2, "three hosts registered");
            for (int i = 0; i < 2048; i++) {
                byte[] h = Arrays.copyOfRange(packed, i * 32, (i + 1) * 32);
                resident.add(ByteBuffer.wrap(h));
                owner.advertise("ns", h);
            }
            owner.flush();
            assertThat(owner.stats().advertised()).isEqualTo(2048);
            for (int port : ports) {
                assertThat(Long.parseLong(cli(port, "dbsize"))).as("shard %d holds a share of the blocks", port).isGreaterThan(400);
            }
            BlockRegistry.Owner o = asker.lookup("ns", prefix, List.of());
            assertThat(o.blocks()).isEqualTo(2048);
            assertThat(o.node().peerAddr()).isEqualTo("10.0.0.1:1");
            // the owner drops block 1023: the lookup's probes (0, 1, 3, ..., 1023, 2047) bound the run there
            byte[] dropped = Arrays.copyOfRange(packed, 1023 * 32, 1024 * 32);
            resident.remove(ByteBuffer.wrap(dropped));
            owner.withdraw("ns", dropped);
            owner.flush();
            assertThat(asker.lookup("ns", prefix, List.of()).blocks()).isEqualTo(1023);
            assertThat(asker.lookup("ns", prefix, List.of(o.node().id())).blocks()).as("the owner excluded").isZero();
            // the owner leaves (its node key deleted): never chosen, and the bits of it that a
            // lookup meets are cleared shard by shard
            owner.close();
            waitFor(() -> asker.liveNodes().size() == 1, "the owner gone from the live view");
            long before = keys();
            assertThat(asker.lookup("ns", prefix, List.of()).blocks()).isZero();
            asker.flush();
            assertThat(keys()).as("the probed block keys whose only owner left were deleted").isLessThan(before);
        } finally {
            owner.close();
        }
    }
}
