package io.pegaflow.server;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.inprocess.InProcessServerBuilder;
import io.grpc.stub.MetadataUtils;
import io.grpc.stub.StreamObserver;
import io.pegaflow.client.Headers;
import io.pegaflow.client.RemoteStore;
import io.pegaflow.client.Version;
import io.pegaflow.client.proto.Empty;
import io.pegaflow.client.proto.EngineGrpc;
import io.pegaflow.client.proto.FlushRequest;
import io.pegaflow.client.proto.RegisterInstanceRequest;
import io.pegaflow.client.proto.StatsRequest;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.PoolExhaustedException;
import io.pegaflow.engine.store.Quotas;
import io.pegaflow.engine.store.RemoteTier;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.pool.HostPool;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Quotas per tenant (one join secret, or a client without one): instances per tenant and in
 * all, calls in flight per tenant, the store's per-instance quotas from the server's settings,
 * and instances whose clients never open a session expiring. Each refusal names its quota and
 * changes nothing; another tenant is served meanwhile; /metrics shows each tenant's use.
 * In-process transport.
 */
class TenantQuotasTest {
    @TempDir
    Path dir;

    private PegaflowServer server;
    private String name;
    private final List<ManagedChannel> channels = new ArrayList<>();
    private final List<AutoCloseable> closing = new ArrayList<>();

    private void start(Tenancy tenancy) throws Exception {
        name = "pegaflow-quotas-" + System.nanoTime();
        server = PegaflowServer.start(new PegaflowServer.Config("127.0.0.1:0", "127.0.0.1:0", 4L << 20, dir.resolve("pool"),
                Duration.ofSeconds(600), Duration.ofMillis(100), true).withTenancy(tenancy),
                InProcessServerBuilder.forName(name).directExecutor());
    }

    @AfterEach
    void stop() throws Exception {
        for (AutoCloseable c : closing) {
            c.close();
        }
        channels.forEach(ManagedChannel::shutdownNow);
        if (server != null) {
            server.close();
        }
    }

    private ManagedChannel channel() {
        ManagedChannel c = InProcessChannelBuilder.forName(name).directExecutor().build();
        channels.add(c);
        return c;
    }

    /** A client of the tenant that presents {@code secret} (null: a tenant of its own). */
    private RemoteStore tenant(String secret) {
        RemoteStore s = RemoteStore.over(channel(), name, 5000, secret == null ? null : secret.getBytes(StandardCharsets.UTF_8));
        closing.add(s);
        return s;
    }

    /** A raw stub with the token and client id {@code client} (no session, no secret). */
    private EngineGrpc.EngineBlockingStub raw(String client) throws Exception {
        Metadata h = new Metadata();
        h.put(Headers.AUTHORIZATION, "Bearer " + Files.readString(Path.of(server.poolPath() + ".token")).trim());
        h.put(Headers.CLIENT_ID, client);
        return EngineGrpc.newBlockingStub(channel()).withInterceptors(MetadataUtils.newAttachHeadersInterceptor(h));
    }

    private static RegisterInstanceRequest instance(String id) {
        return RegisterInstanceRequest.newBuilder().setClientVersion(Version.VERSION).setInstanceId(id).setNamespace("ns")
                .setTpSize(1).setWorldSize(1).build();
    }

    private String metrics() throws Exception {
        return HttpClient.newHttpClient().send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + server.httpPort()
                + "/metrics")).build(), HttpResponse.BodyHandlers.ofString()).body();
    }

    @Test
    void instancesPerTenantAndInAllAreCappedAndEachRefusalNamesItsQuota() throws Exception {
        start(Tenancy.DEFAULTS.instances(4, 2));
        RemoteStore a = tenant("tenant-a-launch-secret");
        RemoteStore a2 = tenant("tenant-a-launch-secret"); // another process of the same launch
        RemoteStore b = tenant("tenant-b-launch-secret");
        a.registerInstance(new InstanceSpec("a1", "ns", 1, 1));
        a2.registerInstance(new InstanceSpec("a2", "ns", 1, 1));
        assertThatThrownBy(() -> a.registerInstance(new InstanceSpec("a3", "ns", 1, 1)))
                .isInstanceOf(PoolExhaustedException.class).hasMessageContaining("--max-instances-per-tenant")
                .hasMessageContaining("2 instances");
        b.registerInstance(new InstanceSpec("b1", "ns", 1, 1));
        b.registerInstance(new InstanceSpec("b2", "ns", 1, 1));
        assertThatThrownBy(() -> tenant("tenant-c-launch-secret").registerInstance(new InstanceSpec("c1", "ns", 1, 1)))
                .isInstanceOf(PoolExhaustedException.class).hasMessageContaining("--max-instances");
        assertThat(server.store().instanceIds()).containsExactly("a1", "a2", "b1", "b2");
        a.registerInstance(new InstanceSpec("a1", "ns", 1, 1)); // registering one it has is not another
        assertThat(metrics()).contains("resource=\"instances\"").contains("pegaflow_tenant_usage{resource=\"instances\",tenant=\"s");
        a.unregisterInstance("a1");
        tenant("tenant-c-launch-secret").registerInstance(new InstanceSpec("c1", "ns", 1, 1));
        assertThat(server.store().instanceIds()).containsExactly("a2", "b1", "b2", "c1");
    }

    /** ~116,600 RegisterInstance calls (no worker, no session) used to fill the 2 GiB heap in 50 s. */
    @Test
    void aFloodOfRegistrationsUnderFreshClientIdsStopsAtTheServersCapAndExpires() throws Exception {
        start(Tenancy.DEFAULTS.instances(64, 8).unsessioned(Duration.ofSeconds(5)));
        int refused = 0;
        for (int i = 0; i < 200; i++) {
            try {
                raw(String.format("%032x", i)).registerInstance(instance("flood-" + i));
            } catch (StatusRuntimeException e) {
                assertThat(e.getStatus().getCode()).isEqualTo(Status.Code.RESOURCE_EXHAUSTED);
                assertThat(e.getStatus().getDescription()).contains("--max-instances");
                refused++;
            }
        }
        assertThat(server.store().instanceIds()).hasSize(64);
        assertThat(refused).isEqualTo(200 - 64);
        try (RemoteStore honest = RemoteStore.over(channel(), name, 5000)) {
            long deadline = System.nanoTime() + 20_000_000_000L;
            while (server.store().instanceIds().size() > 0 && System.nanoTime() < deadline) {
                Thread.sleep(50);
            }
            assertThat(server.store().instanceIds()).as("none of them opened a session: expired").isEmpty();
            honest.registerInstance(new InstanceSpec("honest", "ns", 1, 1)); // with its session
            Thread.sleep(5500);
            assertThat(server.store().instanceIds()).as("a held session keeps it").containsExactly("honest");
        }
    }

    /** A registry whose flush waits until released (a Flush then holds its call). */
    private static final class StalledRegistry implements RemoteTier {
        final CountDownLatch answers = new CountDownLatch(1);

        @Override
        public boolean missed(String namespace, BlockHashes hashes, int from) {
            return false;
        }

        @Override
        public void resident(String namespace, byte[] hash) {}

        @Override
        public void evicted(String namespace, byte[] hash) {}

        @Override
        public void flush() throws Exception {
            answers.await(30, TimeUnit.SECONDS);
        }
    }

    @Test
    void callsInFlightPerTenantAreCappedAndAnotherTenantIsServed() throws Exception {
        start(Tenancy.DEFAULTS.calls(2));
        StalledRegistry registry = new StalledRegistry();
        HostPool mapped = HostPool.shared(server.poolPath(), 4L << 20, false);
        closing.add(0, mapped::close);
        server.store().attachRemote(registry, mapped.segment());
        closing.add(0, registry.answers::countDown);
        var hog = EngineGrpc.newStub(raw("h".repeat(32)).getChannel()).withInterceptors(MetadataUtils.newAttachHeadersInterceptor(
                headers("h".repeat(32))));
        CountDownLatch ended = new CountDownLatch(2);
        for (int i = 0; i < 2; i++) {
            hog.flush(FlushRequest.getDefaultInstance(), new StreamObserver<Empty>() {
                @Override
                public void onNext(Empty value) {}

                @Override
                public void onError(Throwable t) {
                    ended.countDown();
                }

                @Override
                public void onCompleted() {
                    ended.countDown();
                }
            });
        }
        Thread.sleep(200);
        assertThatThrownBy(() -> raw("h".repeat(32)).stats(StatsRequest.getDefaultInstance()))
                .isInstanceOfSatisfying(StatusRuntimeException.class, e -> {
                    assertThat(e.getStatus().getCode()).isEqualTo(Status.Code.RESOURCE_EXHAUSTED);
                    assertThat(e.getStatus().getDescription()).contains("--max-calls-per-tenant");
                });
        assertThat(raw("o".repeat(32)).stats(StatsRequest.getDefaultInstance()).getValuesMap()).as("another tenant").isNotEmpty();
        assertThat(metrics()).contains("resource=\"calls\",tenant=\"c");
        registry.answers.countDown();
        assertThat(ended.await(10, TimeUnit.SECONDS)).isTrue();
        assertThat(raw("h".repeat(32)).stats(StatsRequest.getDefaultInstance()).getValuesMap()).as("its calls ended").isNotEmpty();
    }

    private Metadata headers(String client) throws Exception {
        Metadata h = new Metadata();
        h.put(Headers.AUTHORIZATION, "Bearer " + Files.readString(Path.of(server.poolPath() + ".token")).trim());
        h.put(Headers.CLIENT_ID, client);
        return h;
    }

    @Test
    void theStoresPerInstanceQuotasComeFromTheServersSettings() throws Exception {
        start(Tenancy.DEFAULTS.quotas(Quotas.DEFAULTS.perInstance(1, 64, 4)));
        try (java.lang.foreign.Arena arena = java.lang.foreign.Arena.ofShared()) {
            RemoteStore a = tenant("tenant-a-launch-secret");
            long base = arena.allocate(4 * 4096, 4096).address();
            a.registerInstance(new InstanceSpec("a", "ns", 1, 1));
            a.registerWorker("a", new WorkerSpec(0, 0, 0, List.of(new LayerRegion("l", KvLayout.MLA, base, 4 * 4096, 4, 4096,
                    4096, 0))));
            byte[] h = new byte[32];
            var plan = a.reserveSave("a", 0, null, new long[] {0}, BlockHashes.of(h));
            a.endCopy("a", plan.id(), true, 0, 0);
            assertThat(a.query("a", BlockHashes.of(h)).hasLease()).isTrue();
            assertThatThrownBy(() -> a.query("a", BlockHashes.of(h))).isInstanceOf(PoolExhaustedException.class)
                    .hasMessageContaining("--max-leases-per-instance");
            assertThat(metrics()).contains("pegaflow_tenant_usage{resource=\"leases\",tenant=\"s")
                    .containsPattern("pegaflow_tenant_usage\\{resource=\"leases\",tenant=\"s[0-9a-f]{16}\"} 1.0");
        }
    }

    /**
     * A pool share per tenant from the server's settings ({@code --tenant-pool-share}): tenant
     * a's saves past its share evict a's own oldest blocks, never b's, and /metrics shows each
     * tenant's pool bytes.
     */
    @Test
    void aTenantsSavesPastItsPoolShareEvictItsOwnBlocksNotAnothers() throws Exception {
        start(Tenancy.DEFAULTS.quotas(Quotas.DEFAULTS.tenantPoolShare(4 * 4096)));
        try (java.lang.foreign.Arena arena = java.lang.foreign.Arena.ofShared()) {
            RemoteStore a = tenant("tenant-a-launch-secret");
            RemoteStore b = tenant("tenant-b-launch-secret");
            for (RemoteStore t : List.of(a, b)) {
                String id = t == a ? "a" : "b";
                long base = arena.allocate(16 * 4096, 4096).address();
                t.registerInstance(new InstanceSpec(id, "ns", 1, 1));
                t.registerWorker(id, new WorkerSpec(0, 0, 0, List.of(new LayerRegion("l", KvLayout.MLA, base, 16 * 4096, 16,
                        4096, 4096, 0))));
            }
            java.util.Random rnd = new java.util.Random(7);
            BlockHashes bs = hashes(rnd, 3);
            BlockHashes as = hashes(rnd, 8);
            save(b, "b", bs);
            for (int i = 0; i < 8; i++) {
                save(a, "a", as.slice(i, i + 1));
            }
            var bHit = b.query("b", bs);
            assertThat(bHit.hitBlocks()).as("b's blocks untouched by a's saves").isEqualTo(3);
            b.release("b", bHit.lease());
            var aOld = a.query("a", as.slice(0, 4));
            assertThat(aOld.hitBlocks()).as("a's oldest four were evicted for its own newer ones").isZero();
            var aNew = a.query("a", as.slice(4, 8));
            assertThat(aNew.hitBlocks()).isEqualTo(4);
            a.release("a", aNew.lease());
            assertThat(metrics()).containsPattern("pegaflow_tenant_usage\\{resource=\"pool_bytes\",tenant=\"s[0-9a-f]{16}\"} "
                    + (4 * 4096) + "\\.0");
        }
    }

    private static BlockHashes hashes(java.util.Random rnd, int n) {
        byte[][] h = new byte[n][32];
        for (byte[] x : h) {
            rnd.nextBytes(x);
        }
        return BlockHashes.of(h);
    }

    private static void save(RemoteStore t, String id, BlockHashes h) {
        long[] ids = new long[h.count()];
        java.util.Arrays.setAll(ids, i -> i);
        var plan = t.reserveSave(id, 0, null, ids, h);
        t.endCopy(id, plan.id(), true, 0, 0);
    }
}
