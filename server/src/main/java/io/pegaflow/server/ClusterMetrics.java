package io.pegaflow.server;

import io.pegaflow.server.cluster.ClusterTier;
import io.pegaflow.server.cluster.PeerServer;
import io.prometheus.metrics.core.metrics.CounterWithCallback;
import io.prometheus.metrics.core.metrics.GaugeWithCallback;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.util.function.LongSupplier;

/** Cross-node sharing on /metrics (docs/cluster.md, "Metrics"). */
final class ClusterMetrics {
    private ClusterMetrics() {}

    static void register(PrometheusRegistry registry, ClusterTier tier, PeerServer server) {
        ClusterTier.Stats s = tier.statsView();
        counter(registry, "pegaflow_registry_advertised_blocks", "block advertisements sent to the registry", () -> tier.registry().stats().advertised());
        counter(registry, "pegaflow_registry_withdrawn_blocks", "block withdrawals sent to the registry", () -> tier.registry().stats().withdrawn());
        counter(registry, "pegaflow_registry_dropped_updates", "registry updates dropped (queue full or registry down; re-advertised on reconnect)",
                () -> tier.registry().stats().dropped());
        counter(registry, "pegaflow_registry_errors", "registry calls that failed (Redis down or slow)", () -> tier.registry().stats().errors());
        counter(registry, "pegaflow_registry_resyncs", "full re-advertisements (Redis answered again or came back empty)",
                () -> tier.registry().stats().resyncs());
        counter(registry, "pegaflow_peer_lookups", "registry lookups for local misses", s.lookups());
        counter(registry, "pegaflow_peer_lookup_errors", "registry lookups that failed (the query was a miss)", s.lookupErrors());
        counter(registry, "pegaflow_peer_fetch_blocks", "blocks fetched from other hosts and checked", s.fetchedBlocks());
        counter(registry, "pegaflow_peer_fetch_bytes", "bytes fetched from other hosts", s.fetchedBytes());
        counter(registry, "pegaflow_peer_fetch_failures", "fetches that failed (peer gone, link broken, deadline): misses", s.fetchFailures());
        counter(registry, "pegaflow_peer_checksum_failures", "fetched blocks whose CRC32 did not match: misses, never served",
                s.checksumFailures());
        counter(registry, "pegaflow_peer_fetch_rejected", "lookups not started: the fetch queue was full", s.rejected());
        counter(registry, "pegaflow_peer_served_blocks", "blocks this host served to other hosts", server::blocksServed);
        counter(registry, "pegaflow_peer_refused_connections", "peer connections refused (secret, certificate, or too many)",
                server::refusedConnections);
        CounterWithCallback.builder().name("pegaflow_peer_fetch_phase_seconds")
                .help("time fetches spent per phase: registry lookup, peer pin, pool reservation, read and check, sealing")
                .labelNames("phase").callback(cb -> {
                    for (int i = 0; i < ClusterTier.PHASES.size(); i++) {
                        cb.call(tier.phaseSeconds(i), ClusterTier.PHASES.get(i));
                    }
                }).register(registry);
        GaugeWithCallback.builder().name("pegaflow_peer_live_hosts").help("other hosts whose heartbeat is fresh")
                .callback(cb -> cb.call(tier.registry().liveNodes().size())).register(registry);
        GaugeWithCallback.builder().name("pegaflow_registry_connected").help("1 while the registry answers heartbeats")
                .callback(cb -> cb.call(tier.registry().connected() ? 1 : 0)).register(registry);
    }

    private static void counter(PrometheusRegistry registry, String name, String help, LongSupplier value) {
        CounterWithCallback.builder().name(name).help(help).callback(cb -> cb.call(value.getAsLong())).register(registry);
    }
}
