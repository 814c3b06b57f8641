package io.pegaflow.engine.metrics;

/** Monotonic counters the engine reports. Names follow Prometheus conventions (4/6 exports them). */
public enum Counter {
    SAVE_REQUESTS("pegaflow_save_requests_total", "save calls accepted"),
    SAVE_BLOCKS("pegaflow_save_blocks_total", "blocks whose slots a save wrote"),
    SAVE_SKIPPED_BLOCKS("pegaflow_save_skipped_blocks_total", "blocks a save skipped because they were resident or being saved"),
    SAVE_NOT_ADMITTED_BLOCKS("pegaflow_save_not_admitted_blocks_total", "blocks a save skipped because the admission policy (seen:N) did not take them yet"),
    SAVE_BYTES("pegaflow_save_bytes_total", "bytes copied into the host pool"),
    SAVE_NANOS("pegaflow_save_transfer_nanoseconds_total", "time spent in save copies, summed over batches"),
    SAVE_FAILURES("pegaflow_save_failures_total", "save batches whose copy failed"),
    BLOCKS_SEALED("pegaflow_cache_block_insertions_total", "blocks that became visible (every slot saved)"),
    LOAD_REQUESTS("pegaflow_load_requests_total", "load calls accepted"),
    LOAD_FAULTS_INJECTED("pegaflow_load_faults_injected_total", "loads refused on purpose (testing: pegaflow-server --inject-load-failures)"),
    LOAD_BLOCKS("pegaflow_load_blocks_total", "blocks copied out of the host pool"),
    LOAD_BYTES("pegaflow_load_bytes_total", "bytes copied out of the host pool"),
    LOAD_NANOS("pegaflow_load_transfer_nanoseconds_total", "time spent in load copies, summed over batches"),
    LOAD_FAILURES("pegaflow_load_failures_total", "load batches whose copy failed"),
    LOADS_UNUSED("pegaflow_loads_unused_total", "loads a query began that no copy took: rolled back when their lease was released (a changed or finished request, no load after allocation)"),
    QUERY_REQUESTS("pegaflow_query_requests_total", "prefix queries"),
    QUERY_LOOKUP_NANOS("pegaflow_query_lookup_nanoseconds_total", "time answered queries spent finding their resident prefix in the index, under the store's lock"),
    QUERY_LEASE_NANOS("pegaflow_query_lease_nanoseconds_total", "time answered queries spent marking their prefix's blocks and issuing its lease, under the store's lock"),
    QUERY_PLAN_NANOS("pegaflow_query_plan_nanoseconds_total", "time queries that began their worker's load spent pinning its blocks and planning its copy, under the store's lock"),
    HIT_BLOCKS("pegaflow_cache_block_hits_total", "queried blocks found in the leading resident prefix"),
    MISS_BLOCKS("pegaflow_cache_block_misses_total", "queried blocks after the leading resident prefix"),
    EVICTIONS("pegaflow_cache_block_evictions_total", "blocks evicted under allocation pressure"),
    EVICTED_BYTES("pegaflow_cache_eviction_reclaimed_bytes_total", "bytes freed by eviction"),
    ADMIN_CLEARED_BLOCKS("pegaflow_admin_cleared_blocks_total", "resident blocks dropped by a clear (pegaflow-server's /admin/clear, vLLM's reset_cache)"),
    ADMIN_CLEARED_SSD_BLOCKS("pegaflow_admin_cleared_ssd_blocks_total", "SSD records forgotten by a clear (pegaflow-server's /admin/clear, vLLM's reset_cache)"),
    ADMIN_WARMED_BLOCKS("pegaflow_admin_warmed_blocks_total", "blocks whose read back from SSD an operator's warm started"),
    POOL_ALLOC_FAILURES("pegaflow_pool_alloc_failures_total", "saves refused because the pool was exhausted"),
    LEASES_CREATED("pegaflow_leases_created_total", "leases issued by queries"),
    LEASES_EXPIRED("pegaflow_leases_expired_total", "leases dropped by the TTL sweeper"),
    INFLIGHT_GC("pegaflow_inflight_gc_cleaned_total", "partially saved blocks dropped after the in-flight TTL"),
    COPIES_EXPIRED("pegaflow_copies_expired_total", "saves and loads rolled back because their copier never ended them"),
    TIER_DRAM_BLOCKS("pegaflow_cache_tier_dram_blocks_total", "blocks of answered queries served from the host pool"),
    TIER_SSD_BLOCKS("pegaflow_cache_tier_ssd_blocks_total", "blocks of answered queries served after a read back from SSD"),
    TIER_PEER_BLOCKS("pegaflow_cache_tier_peer_blocks_total", "blocks of answered queries served after a fetch from another host's pool"),
    BLOCK_CHECKSUMS_AHEAD("pegaflow_block_checksums_ahead_total", "sealed blocks summed in the background for peers' reads (blocks fetched from a peer keep the sum checked on arrival)"),
    BLOCK_CHECKSUMS_DEFERRED("pegaflow_block_checksums_deferred_total", "sealed blocks not summed ahead for peers (the background queue was full): summed when first sent"),
    PEER_FETCH_GEOMETRY_MISMATCH("pegaflow_peer_fetch_geometry_mismatch_total", "peer fetches refused: the peer's slot sizes differ from this namespace's"),
    TRANSFER_PINS_EXPIRED("pegaflow_transfer_pins_expired_total", "blocks pinned for a peer's read released by their deadline (the reader never released them)"),
    TIER_MISS_BLOCKS("pegaflow_cache_tier_miss_blocks_total", "blocks of answered queries found in no tier"),
    SSD_PENDING_ANSWERS("pegaflow_ssd_pending_answers_total", "queries answered 'not yet' while their prefix is read back from SSD or fetched from a peer"),
    SSD_PREFETCH_BLOCKS("pegaflow_ssd_prefetch_blocks_total", "blocks whose read back from SSD started"),
    SSD_PREFETCH_FAILURES("pegaflow_ssd_prefetch_failures_total", "blocks whose read back from SSD failed (served as misses)"),
    SSD_PREFETCH_NO_SPACE("pegaflow_ssd_prefetch_no_space_total", "reads back not started: the pool had no unpinned space"),
    SSD_WRITE_BLOCKS("pegaflow_ssd_write_blocks_total", "blocks written to SSD"),
    SSD_WRITE_BYTES("pegaflow_ssd_write_bytes_total", "payload bytes written to SSD"),
    SSD_WRITE_QUEUE_FULL("pegaflow_ssd_write_queue_full_total", "sealed blocks kept in DRAM only because the write queue was full"),
    SSD_WRITE_SKIPPED("pegaflow_ssd_write_skipped_total", "blocks not written: evicted before their turn, or larger than a shard"),
    SSD_WRITE_ERRORS("pegaflow_ssd_write_errors_total", "SSD writes that failed (the block stays in DRAM only)"),
    SSD_DISK_FULL("pegaflow_ssd_disk_full_total", "SSD writes refused with ENOSPC"),
    SSD_OVERWRITTEN_BLOCKS("pegaflow_ssd_overwritten_blocks_total", "blocks dropped from SSD when the ring wrapped over them"),
    SSD_READ_BLOCKS("pegaflow_ssd_read_blocks_total", "blocks read back from SSD and checked"),
    SSD_READ_BYTES("pegaflow_ssd_read_bytes_total", "payload bytes read back from SSD"),
    SSD_READ_ERRORS("pegaflow_ssd_read_errors_total", "SSD reads that failed (truncated or unreadable file): misses"),
    SSD_CHECKSUM_FAILURES("pegaflow_ssd_checksum_failures_total", "SSD records whose header or CRC32C did not match: misses"),
    SSD_READ_RETRIES("pegaflow_ssd_read_retries_total", "SSD reads whose CRC32C failed in the destination and passed when read again through staging (the destination was written during the read): served, the record kept"),
    SSD_GEOMETRY_MISMATCH("pegaflow_ssd_geometry_mismatch_total", "SSD records whose slot geometry differs from the namespace's");

    private final String metricName;
    private final String help;

    Counter(String metricName, String help) {
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
