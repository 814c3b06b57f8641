package io.pegaflow.engine.metrics;

/** Instantaneous values the engine reports; the engine supplies each as a callback. */
public enum Gauge {
    POOL_CAPACITY_BYTES("pegaflow_pool_capacity_bytes", "host pool size"),
    POOL_USED_BYTES("pegaflow_pool_used_bytes", "host pool bytes allocated to blocks"),
    RESIDENT_BLOCKS("pegaflow_cache_resident_blocks", "sealed blocks in the index"),
    RESIDENT_BYTES("pegaflow_cache_resident_bytes", "bytes held by sealed blocks"),
    INFLIGHT_BLOCKS("pegaflow_inflight_blocks", "blocks with some but not all slots saved"),
    PINNED_BLOCKS("pegaflow_pinned_blocks", "sealed blocks referenced by a lease or a load (not evictable)"),
    ACTIVE_LEASES("pegaflow_active_leases", "leases not yet released, consumed or expired"),
    SSD_BLOCKS("pegaflow_ssd_blocks", "blocks indexed on SSD"),
    SSD_BYTES("pegaflow_ssd_bytes", "SSD bytes held by indexed records"),
    SSD_PREFETCH_INFLIGHT("pegaflow_ssd_prefetch_inflight_blocks", "blocks being read back from SSD (their pool space reserved)"),
    ADMIN_PINNED_BLOCKS("pegaflow_admin_pinned_blocks", "sealed blocks the operator pinned (never evicted until unpinned or cleared)"),
    ADMIN_PINNED_BYTES("pegaflow_admin_pinned_bytes", "bytes of the blocks the operator pinned (at most half the pool)");

    private final String metricName;
    private final String help;

    Gauge(String metricName, String help) {
        this.metricName = metricName;
        this.help = help;
    }

    public String metricName() {
        return metricName;
    }

    public String help() {
        return help;
    }
}
