"""The connector's counters in vLLM's own stats: its periodic log line ("KV Transfer metrics:
...") and its Prometheus ``/metrics`` (``vllm:pegaflow_*_total``, one series per engine).

Both sides report: the scheduler side its lookups and hits, each worker the blocks and bytes it
loaded and saved and the blocks whose load failed; vLLM sums them over workers and steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

COUNTERS = {
    "lookups": "requests the store was asked about",
    "not_yet": "lookups answered 'not yet' while the prefix was read back from SSD (vLLM asked again)",
    "hit_requests": "requests the store offered a prefix to",
    "hit_tokens": "prompt tokens the store offered (a cache hit vLLM did not compute)",
    "loaded_blocks": "KV blocks loaded from the store into vLLM's cache",
    "loaded_bytes": "bytes loaded from the store into vLLM's cache",
    "saved_blocks": "KV blocks saved from vLLM's cache into the store",
    "saved_bytes": "bytes saved from vLLM's cache into the store",
    "load_failed_blocks": "blocks whose load failed (vLLM recomputed them)",
    "save_failures": "saves that failed (only cache is lost)",
    "lookup_ns": "nanoseconds the scheduler side spent in lookups (query and lease; a round trip in server mode)",
    "lookup_failures": "lookups the store could not answer (server down, instance not registered yet): answered 0",
    "wait_timeouts": "requests that stopped waiting for a prefix (read back, or a decode's whole prefix) and recomputed",
    "prefix_waits": "'not yet' answers of a decode instance (kv_consumer) waiting for the prefill's whole prefix",
    "hit_shrinks": "hits shrunk below the full-attention prefix to where every KV-cache group had its blocks",
    "begun_at_lookup": "lookups that also began their hit's load (the worker in the scheduler's process; PEGAFLOW_BEGIN_AT_LOOKUP)",
    "stagings": "loads whose pool side the copy engine began staging at their lookup (PEGAFLOW_PRESTAGE_MIB)",
    "staging_busy": "lookups that began a load but staged nothing: another load held the staging buffer",
    "staging_too_large": "lookups that began a load but staged nothing: the load was larger than the staging buffer",
    "staging_failed": "stagings that failed (the first is logged); their loads read the pool or, claimed, were recomputed",
    "staging_unavailable": "lookups that began a load but staged nothing: the staging buffer could not be had",
    "begin_no_worker": "hits whose load could not begin at the lookup: no worker of the instance runs in the scheduler's process",
    "begin_declined": "hits whose load the engine did not begin at the lookup (the worker's KV cache not registered with it)",
    "staging_starts": "loads staged at their lookup whose first layer group was queued on the copy engine",
    "staging_to_thread_ns": "nanoseconds from those lookups to the staging thread taking their staging up",
    "staging_layout_ns": "nanoseconds the staging thread spent making those stagings' layouts",
    "staging_to_first_ns": "nanoseconds from those lookups to their staging's first layer group queued on the copy engine",
    "staging_landed": "loads staged at their lookup whose first layer group the staging thread saw land while pacing them",
    "staging_to_landed_ns": "nanoseconds from those lookups to their staging's first layer group landed, as the staging thread saw it",
    "staging_paced_groups": "layer groups the staging thread queued while pacing, after it saw the group before them land",
    "staging_paced_gap_ns": "nanoseconds from seeing that group land to the next one queued: the host's part of the "
                            "link's idle time between paced groups",
    "in_step_loads": "loads run inside the step that used them",
    "in_step_plan_ns": "nanoseconds from an in-step load's start until its copies were submitted (plan and enqueue)",
    "in_step_load_ns": "nanoseconds from an in-step load's start until its bytes landed and it ended",
    "in_step_step_ns": "nanoseconds from an in-step load's start until its step's get_finished (the forward, as the worker sees it)",
    "in_step_wait_ns": "nanoseconds vLLM's thread waited in wait_for_layer_load for in-step loads' layers to be queued",
    "in_step_hop_ns": "nanoseconds from an in-step load's start until the plan's thread took it up (part of in_step_plan_ns)",
    "in_step_store_ns": "nanoseconds the store's plan of in-step loads took (part of in_step_plan_ns; a round trip in server mode)",
    "in_step_build_ns": "nanoseconds listing in-step loads' copy pieces after the store's plan (part of in_step_plan_ns)",
    "in_step_submit_ns": "nanoseconds handing in-step loads' copy batches to the copy engine (part of in_step_plan_ns: waiting for a free lane, "
                         "pinning pool chunks on first touch, the batch queued to the lane's thread)",
    "in_step_first_copy_ns": "nanoseconds from an in-step load's start until the copy engine queued its first copy (host copies: began it); "
                             "after the hold for a held load without a lead",
    "loads_staged": "loads (in the step or asynchronous) whose pool side the copy engine staged from their lookup on "
                    "(PEGAFLOW_PRESTAGE_MIB), read from its staging buffer",
    "in_step_at_alloc": "in-step loads started where vLLM allocated their blocks (load_at_alloc), their phases timed from there",
    "alloc_to_load_starts": "in-step loads whose allocation this process saw (the worker shares the scheduler's process)",
    "alloc_to_load_ns": "nanoseconds from those loads' allocation (update_state_after_alloc) to start_load_kv",
    "load_fences": "steps that loaded whose start_load_kv waited for the compute stream's earlier work (vLLM's zeroing, its input copies)",
    "load_fence_ns": "nanoseconds start_load_kv waited there, before the loads were handed to the engine",
    "in_step_whole_waits": "steps whose in-step loads the compute stream waited for whole in start_load_kv: a forward without "
                           "per-layer hooks (a FULL CUDA graph's replay)",
    "hits_timed": "hits allocated whose QUEUED event vLLM recorded (its stats on): timed from that event below",
    "queued_to_lookup_ns": "nanoseconds from those requests' QUEUED event (the engine core adding them) to their hit's lookup",
    "queued_to_alloc_ns": "nanoseconds from their QUEUED event to their hit's update_state_after_alloc (where a load at "
                          "allocation starts: in_step_load_ns runs from there)",
    "low_retention_blocks": "blocks of requests with retention \"low\" the store was told to evict first",
    "kv_events": "the store's block events handed to vLLM's KV-event publisher (--kv-events-config)",
    "worker_steps": "steps a worker ran the connector's per-step hooks for (start_load_kv calls)",
    "worker_hook_ns": "nanoseconds vLLM's worker thread spent in the connector's hooks (loads started and waited for, saves submitted, results, stats)",
    "scheduler_steps": "steps the scheduler side planned (build_connector_meta calls)",
    "scheduler_hook_ns": "nanoseconds vLLM's scheduler spent in the connector's hooks (lookups, allocation, plans, request ends, stats)",
    "kv_event_gaps": "reads of the store's events that found some dropped from its ring before them (routers may be stale)",
}


@dataclass
class PegaConnectorStats(KVConnectorStats):
    """Counter deltas (keys of ``COUNTERS``); aggregation sums them."""

    def reset(self):
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for key, value in (other.data or {}).items():
            self.data[key] = self.data.get(key, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {k: self.data[k] for k in COUNTERS if self.data.get(k)}
        lookups = self.data.get("lookups", 0)
        if lookups:
            out["hit_rate"] = round(self.data.get("hit_requests", 0) / lookups, 3)
        return out

    def is_empty(self) -> bool:
        return not any(self.data.values())


class PegaPromMetrics(KVConnectorPromMetrics):
    """One Prometheus counter per key of ``COUNTERS``, with vLLM's engine labels."""

    def __init__(self, vllm_config, metric_types, labelnames: list[str], per_engine_labelvalues: dict[int, list]):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._series: dict[str, dict[int, Any]] = {}
        for key, doc in COUNTERS.items():
            counter = self._counter_cls(name=f"vllm:pegaflow_{key}", documentation=f"PegaFlow: {doc}",
                                        labelnames=labelnames)
            self._series[key] = {idx: counter.labels(*values) for idx, values in per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0):
        for key, value in transfer_stats_data.items():
            series = self._series.get(key, {}).get(engine_idx)
            if series is not None and value:
                series.inc(value)
