package io.pegaflow.server;

import io.pegaflow.engine.store.LocalStore;
import io.prometheus.metrics.core.metrics.GaugeWithCallback;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.util.List;
import java.util.Map;

/**
 * {@code pegaflow_tenant_usage{tenant,resource}} on /metrics: per tenant (the digest of
 * {@link Caller#tenant}, never a secret or an id), its instances, the leases, leased blocks
 * and open copies they hold in the store, its calls in flight, and the pool bytes its saves
 * hold resident (its pool share's use): what each of its quotas
 * ({@link Tenancy}, {@link io.pegaflow.engine.store.Quotas}) is measured against. One store
 * snapshot per scrape.
 */
final class TenantMetrics {
    private TenantMetrics() {}

    static void register(PrometheusRegistry registry, Tenants tenants, LocalStore store, CallQuota calls) {
        GaugeWithCallback.builder().name("pegaflow_tenant_usage")
                .help("per tenant: instances, leases, leased_blocks, open_copies, calls (in flight) and pool_bytes it holds")
                .labelNames("tenant", "resource").callback(cb -> {
                    Map<String, LocalStore.Usage> usage = store.usage();
                    Map<String, List<String>> byTenant = tenants.byTenant();
                    Map<String, Long> poolBytes = new java.util.HashMap<>();
                    Map<Integer, String> owners = tenants.ownerTenants();
                    store.ownedPoolBytes().forEach((owner, bytes) -> {
                        String t = owners.get(owner);
                        if (t != null) {
                            poolBytes.put(t, bytes);
                            byTenant.putIfAbsent(t, List.of()); // its blocks outlive its instances
                        }
                    });
                    for (String calling : calls.tenants()) {
                        byTenant.putIfAbsent(calling, List.of()); // calling without an instance of its own
                    }
                    for (Map.Entry<String, List<String>> t : byTenant.entrySet()) {
                        long leases = 0;
                        long blocks = 0;
                        long copies = 0;
                        for (String id : t.getValue()) {
                            LocalStore.Usage u = usage.get(id);
                            if (u != null) {
                                leases += u.leases();
                                blocks += u.leasedBlocks();
                                copies += u.openCopies();
                            }
                        }
                        String tenant = t.getKey();
                        cb.call(t.getValue().size(), tenant, "instances");
                        cb.call(leases, tenant, "leases");
                        cb.call(blocks, tenant, "leased_blocks");
                        cb.call(copies, tenant, "open_copies");
                        cb.call(calls.inFlight(tenant), tenant, "calls");
                        cb.call(poolBytes.getOrDefault(tenant, 0L), tenant, "pool_bytes");
                    }
                }).register(registry);
    }
}
