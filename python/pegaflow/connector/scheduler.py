"""The scheduler side of the connector: what PegaKVConnector's scheduler-role hooks do, one
method per hook, beside ``worker.WorkerCore`` for the worker role.

The request state machine, the leases and the per-step load and save plans are the Java
brain's (``_brain.SchedulerBrain``, ``io.pegaflow.connector.SchedulerSide``). What stays here
reads vLLM's objects: the store's keys of a request's blocks (``_keys``), its per-request
controls (``_controls``), the window of hashes each step sends for saving, the partial tail
block of P/D (``tail_key``), the store's block events for vLLM's publisher (``_events``), and
the counters vLLM's stats report.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from ..errors import PegaflowError
from . import _controls, _events
from ._brain import SchedulerBrain
from ._keys import BlockKeys, has_extra_keys, lookup_warm_up_enabled

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger("pegaflow.connector")

# When a hit's destination blocks were known (after_alloc), by request: where the worker shares
# the scheduler's process (TP = 1), the worker's start_load_kv measures how long before its load
# could have started (the case for starting it there; docs/gpu.md).
ALLOCATED_NS: dict[str, int] = {}

# what this side counts itself (the brain counts its lookups: SchedulerBrain.STATS)
COUNTS = ("kv_events", "kv_event_gaps", "low_retention_blocks", "hits_timed", "queued_to_lookup_ns", "queued_to_alloc_ns")


def since_queued_ns(request, now_ns: int) -> int | None:
    """Nanoseconds from ``request``'s QUEUED event (vLLM's engine core adding it, with stats on)
    to ``now_ns`` (``time.perf_counter_ns``: on Linux the same monotonic clock as vLLM's event
    timestamps and the JVM's ``System.nanoTime``); None where vLLM recorded none (stats off)."""
    for e in getattr(request, "events", None) or ():
        if getattr(getattr(e, "type", None), "name", None) == "QUEUED":
            return now_ns - int(e.timestamp * 1e9)
    return None


def tail_tokens(request, block_size: int, hashes=None) -> list[int] | None:
    """The token ids of a prompt's partial last block (PegaFlow's tail-block flow; docs/cluster.md,
    P/D), whose key the brain derives from the last full block's (``VllmBlockHasher.tailKey``).
    None when there is no tail worth it (fewer than 2 tokens: vLLM computes the last prompt token
    anyway), no full block before it, the full blocks are not all hashed yet, or the request
    carries what a vLLM hash would add (LoRA, multimodal inputs, cache salt, prompt embeddings). ``hashes``: the
    store's keys of its full blocks (default vLLM's own)."""
    n = request.num_prompt_tokens
    full = n // block_size
    hashes = request.block_hashes if hashes is None else hashes
    if n - full * block_size < 2 or full == 0 or len(hashes) < full:
        return None
    if has_extra_keys(request):
        return None
    return list(request.prompt_token_ids[full * block_size:n])


def tail_key(request, block_size: int, hashes=None) -> bytes | None:
    """The store's key of the prompt's partial last block (``tail_tokens``), derived in Java."""
    tokens = tail_tokens(request, block_size, hashes)
    if tokens is None:
        return None
    hashes = request.block_hashes if hashes is None else hashes
    from ..engine import tail_key as derive

    return derive(bytes(hashes[request.num_prompt_tokens // block_size - 1]), tokens)


class SchedulerCore:
    """One instance's scheduler side. ``groups``: its KV-cache groups (``_groups.plan``), each
    its own store instance; ``role``: vLLM's kv_role; ``failed_meta``: vLLM < 0.30's worker
    metadata class for failed loads of several groups (None where vLLM reports them itself)."""

    def __init__(self, link, groups, block_size: int, hash_algo: str, role: str, load_enabled: bool,
                 save_enabled: bool, in_step: bool, failed_meta, events_enabled: bool, at_alloc: bool = False,
                 begin_at_lookup: bool = True, compute_share: float = 0.0, graph_tokens: int | None = None):
        self._link = link
        self._groups = groups
        self._block_size = block_size
        self._role = role
        self._load_enabled = load_enabled
        self._save_enabled = save_enabled
        self._failed_meta = failed_meta
        # The partial tail block is one model's KV of a part of a block: a sliding window or a
        # recurrent state there is not what a block-aligned hit loads, so hybrid models P/D
        # without it (every full block; the tail's tokens are computed on the decode side).
        self._tail_flow = len(groups) == 1
        self._no_blocks = ((),) * len(groups)
        self.keys = BlockKeys(hash_algo, block_size)
        self.keys.warm_up()
        # a P/D decode instance (kv_consumer) waits for the prefill's whole prefix (docs/cluster.md)
        self.brain = SchedulerBrain(link.handle, [g.group for g in groups], block_size, load_enabled,
                                    wait_full_prefix=role == "kv_consumer", in_step=in_step, at_alloc=at_alloc,
                                    warm_up=load_enabled and lookup_warm_up_enabled(),
                                    begin_at_lookup=begin_at_lookup)
        # in-step loads: the share of a hit's blocks, at its end, vLLM computes instead (never a
        # P/D decode instance's, which waits for the prefill's whole prefix)
        self._compute_share = compute_share if self.brain.in_step and role != "kv_consumer" else 0.0
        self._graph_tokens = graph_tokens  # vLLM's largest CUDA graph (None: none); the share stays within it
        self._requests: dict[str, Request] = {}
        self._loads = False  # a load committed since the last plan (take_loads)
        self._hashes_sent: dict[str, int] = {}
        self._request_controls: dict[str, _controls.Controls] = {}  # kv_transfer_params, by request
        self._local_computed: dict[str, int] = {}
        self._counts = dict.fromkeys(COUNTS, 0)
        self._lookup_began: dict[str, int] = {}  # a hit's lookup start, ns after its QUEUED event, until its allocation
        self._low_retention = _controls.LowRetention(block_size)
        # vLLM publishes KV events: the store's go out with them
        self._event_feed = _events.EventFeed(link, [(i, g.group.instance_id) for i, g in enumerate(groups)]) \
            if events_enabled else None

    # ---------------------------------------------------------------- hooks

    def on_new_request(self, request: Request) -> None:
        self._requests[request.request_id] = request

    def controls_of(self, request: Request) -> _controls.Controls:
        """The request's ``kv_transfer_params`` controls, read once (``_controls``)."""
        c = self._request_controls.get(request.request_id)
        if c is None:
            c = self._request_controls[request.request_id] = _controls.of(
                request.request_id, getattr(request, "kv_transfer_params", None))
        return c

    def matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        """``get_num_new_matched_tokens``."""
        began = since_queued_ns(request, time.perf_counter_ns())
        n, load_async = self._lookup(request, num_computed_tokens)
        if n and began is not None and len(self._lookup_began) < 4096:
            self._lookup_began[request.request_id] = began  # the hit's allocation counts it (after_alloc)
        if n is not None and self.controls_of(request).retention == "low":
            self._low_retention.looked_up(request.request_id, num_computed_tokens, n)
        return n, load_async

    def _lookup(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        self._requests[request.request_id] = request
        hashes = self.keys.of(request)
        if not self._load_enabled or len(hashes) <= num_computed_tokens // self._block_size \
                or not self.controls_of(request).load:
            return 0, False
        bs = self._block_size
        tail = tail_tokens(request, bs, hashes) if self._tail_flow and self._role == "kv_consumer" \
            and request.num_tokens == request.num_prompt_tokens \
            else None
        try:
            if tail is not None:
                # the tail block after the full ones: the brain derives its key and looks it up
                # as one more block; a hit on it covers every prompt token but the last
                n = self.brain.lookup(request.request_id, list(hashes[:request.num_prompt_tokens // bs]),
                                      request.num_tokens, num_computed_tokens, tail)
            else:
                n = self.brain.lookup(request.request_id, hashes,
                                      request.num_tokens - self._computed_instead(len(hashes), request.num_tokens,
                                                                                  num_computed_tokens),
                                      num_computed_tokens)
        except PegaflowError as e:  # bad input from vLLM's side would land here; never crash vLLM
            log.warning("lookup of request %s failed (%s): recomputing", request.request_id, e)
            return 0, False
        if n < 0:
            # The prefix continues on SSD and is being read back into the pool: "not yet",
            # vLLM keeps the request waiting and asks again (the brain bounds the wait).
            return None, False
        if n > 0:
            self._local_computed[request.request_id] = num_computed_tokens
        # in-step: vLLM schedules the tail in this step and the load runs inside it
        return n, n > 0 and not self.brain.in_step

    def _computed_instead(self, num_hashes: int, num_tokens: int, num_computed: int) -> int:
        """Tokens at the end of what the store could serve that vLLM computes instead of loading
        them (setting ``compute_share``): whole blocks, the share of the blocks past vLLM's own
        hit that a lookup may serve, and where vLLM runs CUDA graphs no more than keeps the
        step's tokens within its largest one (past it the forward runs eagerly and each layer's
        compute outlasts a layer's copy). The lookup is asked as if the prompt ended that much
        sooner, so the hit, its lease and its load stop there; vLLM computes the rest in the same
        step, each layer's share while the next layer's bytes cross (docs/gpu.md, "Computing the
        end of a hit"). Those blocks are saved again as vLLM computes them, found stored, not copied."""
        if self._compute_share <= 0.0:
            return 0
        bs = self._block_size
        base = num_computed // bs
        servable = min(num_hashes, (num_tokens - 1) // bs) - base
        if servable <= 0:
            return 0
        blocks = int(servable * self._compute_share)
        if self._graph_tokens is not None:  # the tokens vLLM computes anyway: those after the servable blocks
            blocks = min(blocks, max(0, self._graph_tokens - (num_tokens - (base + servable) * bs)) // bs)
        return blocks * bs

    def after_alloc(self, request: Request, block_ids, num_external_tokens: int) -> None:
        """``update_state_after_alloc`` (``block_ids``: vLLM's block ids per group)."""
        self._requests[request.request_id] = request
        self.brain.after_alloc(request.request_id, block_ids, num_external_tokens)
        self._loads |= num_external_tokens > 0
        if num_external_tokens > 0 and self.brain.in_step and len(ALLOCATED_NS) < 4096:
            ALLOCATED_NS[request.request_id] = time.perf_counter_ns()  # emptied at request_finished
        looked = self._lookup_began.pop(request.request_id, None)
        if num_external_tokens > 0 and looked is not None:
            # where a warm request's time goes before its load, from vLLM's own clock on (the TTFT
            # benchmark sets the load's end and the first token beside these)
            allocated = since_queued_ns(request, time.perf_counter_ns())
            if allocated is not None:
                self._counts["hits_timed"] += 1
                self._counts["queued_to_lookup_ns"] += looked
                self._counts["queued_to_alloc_ns"] += allocated

    def take_loads(self) -> bool:
        """Whether a load was committed since the last call (the next plan loads into GPU blocks)."""
        loads, self._loads = self._loads, False
        return loads

    def build_plan(self, scheduler_output: SchedulerOutput) -> bytes:
        """``build_connector_meta``: this step's plan, bytes for the workers."""
        counts = scheduler_output.num_scheduled_tokens
        if self._save_enabled:
            for nr in scheduler_output.scheduled_new_reqs:
                # new, or (V2 model runner) resumed after preemption: the whole block table
                self._schedule(nr.req_id, nr.block_ids, True, nr.num_computed_tokens, counts.get(nr.req_id, 0))
            cached = scheduler_output.scheduled_cached_reqs
            resumed = cached.resumed_req_ids
            for i, req_id in enumerate(cached.req_ids):
                new_ids = cached.new_block_ids[i]
                self._schedule(req_id, new_ids if new_ids is not None else self._no_blocks, req_id in resumed,
                               cached.num_computed_tokens[i], counts.get(req_id, 0))
        for req_id in scheduler_output.preempted_req_ids or ():
            self.brain.preempted(req_id)
        return self.brain.build_plan()

    def _schedule(self, req_id: str, block_ids, resumed: bool, num_computed: int, num_scheduled: int) -> None:
        request = self._requests.get(req_id)
        if request is None:
            return
        controls = self.controls_of(request)
        if not controls.save:
            return  # the request asked for no save (kv_transfer_params)
        hashes = self.keys.of(request)
        full = min(len(hashes), (num_computed + num_scheduled) // self._block_size)
        if controls.save_max_tokens is not None:
            full = min(full, controls.save_max_tokens // self._block_size)
        sent = self._hashes_sent.get(req_id, 0)
        if (self._tail_flow and self._role == "kv_producer" and num_computed + num_scheduled >= request.num_prompt_tokens
                and full == request.num_prompt_tokens // self._block_size and sent <= full):
            tail = tail_key(request, self._block_size, hashes)
            if tail is not None:
                # the prompt is complete this step: its partial last block is saved under its
                # tail key as one more block (the brain counts it complete at the block's end)
                window = list(hashes[sent:full]) + [tail]
                self.brain.schedule(req_id, window, sent, block_ids, resumed, num_computed,
                                    (full + 1) * self._block_size - num_computed)
                self._hashes_sent[req_id] = full + 1
                return
        if full <= sent and not any(block_ids) and not resumed:
            return  # a decode step inside a block: nothing for the brain (no upcall per token)
        window = hashes[sent:full] if full > sent else []
        self.brain.schedule(req_id, window, sent, block_ids, resumed, num_computed, num_scheduled)
        if full > sent:
            self._hashes_sent[req_id] = full

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self.brain.failed_blocks(connector_output.invalid_block_ids or ())
        failed = getattr(connector_output, "failed_recving", None)
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        if self._failed_meta is not None and isinstance(meta, self._failed_meta) and meta.failed_recving:
            # vLLM < 0.30: the request restarts from its prefix before the hit (vLLM caches the
            # blocks up to num_computed_tokens when the load's finish arrives, and computes the rest)
            failed = set(failed or ()) | meta.failed_recving
            for req_id in meta.failed_recving:
                request = self._requests.get(req_id)
                if request is not None and req_id in self._local_computed:
                    log.warning("load of request %s failed in some KV-cache group: recomputing it from token %d",
                                req_id, self._local_computed[req_id])
                    request.num_computed_tokens = self._local_computed[req_id]
        self.brain.finished(connector_output.finished_sending, connector_output.finished_recving, failed)
        self._demote(self._low_retention.saves_done(connector_output.finished_sending))

    def request_finished(self, request: Request) -> bool:
        """Whether vLLM must hold the request's blocks until its saves are reported finished."""
        low = self._request_controls.get(request.request_id, _controls.DEFAULT).retention == "low"
        keys = self.keys.of(request) if low else ()
        saved = self._hashes_sent.get(request.request_id, 0)
        self._requests.pop(request.request_id, None)
        self._request_controls.pop(request.request_id, None)
        self._hashes_sent.pop(request.request_id, None)
        self.keys.forget(request.request_id)
        self._local_computed.pop(request.request_id, None)
        ALLOCATED_NS.pop(request.request_id, None)
        self._lookup_began.pop(request.request_id, None)
        held = self.brain.request_finished(request.request_id)
        if low:
            self._demote(self._low_retention.finished(request.request_id, keys, saved, held))
        return held

    def _demote(self, keys: list[bytes]) -> None:
        """A retention hint "low": these blocks go first in every group's store (a hint: a store
        that cannot take it leaves the pool's order alone)."""
        if not keys:
            return
        for g in self._groups:
            try:
                self._counts["low_retention_blocks"] += self._link.demote(g.group.instance_id, keys)
            except PegaflowError as e:
                log.debug("retention hint for %d blocks of instance %s not taken: %s", len(keys), g.group.instance_id, e)

    def reset_cache(self, instance_id: str) -> bool:
        """vLLM's ``reset_prefix_cache(reset_connector=True)``: clears the instance's namespace in the
        store, every KV-cache group's, pool and SSD (other instances of the namespace lose those
        blocks too). False when the store did not do it (vLLM then reports the reset failed)."""
        try:
            counts = [self._link.reset_cache(g.group.instance_id) for g in self._groups]
        except PegaflowError as e:
            log.warning("reset_cache: the store kept instance %s's cache: %s", instance_id, e)
            return False
        log.info("reset_cache: instance %s's namespace cleared: %d blocks from the pool, %d SSD records",
                 instance_id, sum(c[0] for c in counts), sum(c[1] for c in counts))
        return True

    def take_events(self) -> list[Any]:
        """The store's block events of this instance's namespaces while vLLM publishes events."""
        feed = self._event_feed
        if feed is None:
            return []
        gaps = feed.gaps
        events = feed.take()
        self._counts["kv_events"] += len(events)
        self._counts["kv_event_gaps"] += feed.gaps - gaps
        return events

    def take_counts(self) -> dict[str, int]:
        """The counters since the last call (vLLM's connector stats)."""
        data, self._counts = self._counts, dict.fromkeys(COUNTS, 0)
        data.update(self.brain.stats())
        return data

    def close(self) -> None:
        self.brain.close()
