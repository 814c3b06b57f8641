"""PegaKVConnector: vLLM's v1 KV connector on the PegaFlow-JVM engine (imports vLLM).

Load it with::

    vllm serve MODEL --kv-transfer-config '{"kv_connector":"PegaKVConnector","kv_role":"kv_both",
        "kv_connector_module_path":"pegaflow.connector","kv_load_failure_policy":"recompute"}'

or, with the package installed, ``"kv_connector":"PegaKVConnector"`` alone (the
``vllm.general_plugins`` entry point registers the name). Settings go in
``kv_connector_extra_config`` (see ``settings.Settings``): ``mode`` (``auto`` | ``embedded`` |
``server``), ``endpoint``, ``namespace``, ``pool_size``.

This file only turns vLLM objects into plain data: the request state machine, the per-step
load and save plans and the leases live in Java (``io.pegaflow.connector``). Loads are
asynchronous (requests wait in WAITING_FOR_REMOTE_KVS and are released through
``get_finished``); saves are submitted once per step from the scheduler's plan in
``wait_for_save`` (so FULL CUDA graphs lose nothing: the per-layer hooks do nothing); a
failed load is reported per block so vLLM recomputes it; the store being unreachable is a
miss, never an exception into vLLM.
"""

from __future__ import annotations

import array
import hashlib
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.v1.kv_cache_interface import MLAAttentionSpec

from ..errors import PegaflowError
from . import _compat, _events, _groups, _layout, _private, _runtime
from ._keys import BlockKeys, has_extra_keys
from ._brain import SchedulerBrain
from . import _controls
from ._stats import PegaConnectorStats, PegaPromMetrics
from .settings import Settings
from .worker import WorkerCore

if TYPE_CHECKING:
    import torch
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger("pegaflow.connector")

TransferResults = _compat.transfer_results_class()  # vLLM's where it has one (>= 0.30)

# When a hit's destination blocks were known (update_state_after_alloc), by request: where the
# worker shares the scheduler's process (TP = 1), start_load_kv measures how long before its
# load could have started (the case for starting it there; docs/gpu.md).
_ALLOCATED_NS: dict[str, int] = {}


def _log_through_vllm() -> None:
    """The ``pegaflow`` loggers write through vLLM's handlers (its format, its level), so the
    connector's lines appear in vLLM's output; vLLM configures only the ``vllm`` logger tree."""
    ours, theirs = logging.getLogger("pegaflow"), logging.getLogger("vllm")
    if ours.handlers or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(theirs.level)
    ours.propagate = False


_log_through_vllm()


def in_step_loads(settings: Settings, gpu: bool | None = None) -> bool:
    """Whether hits load inside the step (setting ``load_in_step``; auto: on vLLM's CPU model
    runner only, never on a CUDA or ROCm GPU). ``gpu``: whether vLLM runs on one (None: ask
    vLLM's platform). After a failed in-step load vLLM rolls the request back and recomputes it;
    on the GPU neither model runner of vLLM 0.26 does that correctly (the V2 runner reads the
    recompute from the wrong offset, vLLM issue 49250; the V1 runner's gather kernel indexed out
    of bounds, a device-side assert that ends the engine), so there a failure must happen while
    the request waits (asynchronous loads), before anything read its blocks."""
    if settings.load_in_step is not None:
        return settings.load_in_step
    if gpu is None:
        from vllm.platforms import current_platform

        gpu = current_platform.is_cuda_alike()
    return not gpu


@dataclass
class PegaConnectorMetadata(KVConnectorMetadata):
    """One step's plan from the scheduler-side brain, opaque to Python (it pickles as bytes
    to the worker processes)."""

    plan: bytes


def _parallel_ranks(vllm_config) -> tuple[int, int, int, int]:
    """(tp_rank, tp_size, pp_rank, pp_size) of this worker."""
    pc = vllm_config.parallel_config
    tp, pp = int(pc.tensor_parallel_size), int(pc.pipeline_parallel_size)
    if tp * pp == 1:
        return 0, 1, 0, 1
    from vllm.distributed import parallel_state

    return parallel_state.get_tensor_model_parallel_rank(), tp, parallel_state.get_pp_group().rank_in_group, pp


def _instance_id(vllm_config) -> str:
    """vLLM gives scheduler and workers the same engine_id; DP ranks are separate instances."""
    engine_id = vllm_config.kv_transfer_config.engine_id or os.environ.get("PEGAFLOW_INSTANCE_ID", "vllm")
    pc = vllm_config.parallel_config
    if int(getattr(pc, "data_parallel_size", 1)) > 1:
        engine_id = f"{engine_id}_dp{int(getattr(pc, 'data_parallel_rank', 0))}"
    return engine_id


def _is_mla(kv_cache_config) -> bool:
    return isinstance(kv_cache_config.kv_cache_groups[0].kv_cache_spec, MLAAttentionSpec)


def _check_parallelism(vllm_config) -> None:
    pc = vllm_config.parallel_config
    dcp = int(getattr(pc, "decode_context_parallel_size", 1) or 1)
    pcp = int(getattr(pc, "prefill_context_parallel_size", 1) or 1)
    if dcp > 1 or pcp > 1:
        raise ValueError(
            f"PegaKVConnector does not support context parallelism (decode_context_parallel_size={dcp}, "
            f"prefill_context_parallel_size={pcp}): vLLM's blocks then span {dcp * pcp} ranks' tokens; "
            "expected 1 for both"
        )


def tail_key(request, block_size: int, hashes=None) -> bytes | None:
    """The key of a prompt's partial last block (PegaFlow's tail-block flow; docs/cluster.md, P/D):
    derived from the last full block's hash and the tail's token ids, the same on the prefill
    and the decode side. None when there is no tail worth it (fewer than 2 tokens: vLLM computes
    the last prompt token anyway), no full block before it, the full blocks are not all hashed
    yet, or the request carries what a vLLM hash would add (LoRA, multimodal inputs, cache salt).
    ``hashes``: the store's keys of its full blocks (default vLLM's own)."""
    n = request.num_prompt_tokens
    full = n // block_size
    hashes = request.block_hashes if hashes is None else hashes
    if n - full * block_size < 2 or full == 0 or len(hashes) < full:
        return None
    if has_extra_keys(request):
        return None
    parent = bytes(hashes[full - 1])
    tokens = array.array("i", request.prompt_token_ids[full * block_size:n]).tobytes()
    return hashlib.sha256(b"pegaflow-tail\0" + parent + tokens).digest()[:len(parent)]


def _kv_role(kv_transfer_config) -> str:
    return getattr(kv_transfer_config, "kv_role", "kv_both") or "kv_both"


def _kv_role_flags(kv_transfer_config) -> tuple[bool, bool]:
    """(load, save) from kv_role: kv_both does both, kv_producer only saves, kv_consumer only loads."""
    role = _kv_role(kv_transfer_config)
    return role != "kv_producer", role != "kv_consumer"


class PegaKVConnector(KVConnectorBase_V1, SupportsHMA):
    """See the module docstring. ``SupportsHMA``: vLLM keeps its hybrid KV cache manager on, and
    each KV-cache group (full attention, sliding window, Mamba in align mode) is stored as its own
    instance (``_groups``); what is not supported is refused at startup with the reason."""

    if (_source := _compat.cache_hit_source()) is not None:
        _cache_hit_source = _source  # vLLM >= 0.32: hits come from host memory

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        if kv_cache_config is None:
            raise ValueError("PegaKVConnector needs vLLM's kv_cache_config (vLLM 0.33 passes it)")
        _check_parallelism(vllm_config)
        self._instance_id = _instance_id(vllm_config)
        self._block_size = int(vllm_config.cache_config.block_size)
        self._groups = _groups.plan(kv_cache_config, self._block_size, self._instance_id)
        self._settings = _private.resolve_settings(Settings.from_extra(vllm_config.kv_transfer_config.kv_connector_extra_config),
                                           vllm_config, self._instance_id)
        self._load_enabled, self._save_enabled = _kv_role_flags(vllm_config.kv_transfer_config)
        # P/D: the prefill side saves a prompt's partial last block too, the decode side loads it
        self._role = _kv_role(vllm_config.kv_transfer_config)
        self._tail_probes: set[str] = set()
        self._no_blocks = ((),) * len(self._groups)
        # The partial tail block is one model's KV of a part of a block: a sliding window or a
        # recurrent state there is not what a block-aligned hit loads, so hybrid models P/D
        # without it (every full block; the tail's tokens are computed on the decode side).
        self._tail_flow = len(self._groups) == 1
        self._keys = BlockKeys(str(getattr(vllm_config.cache_config, "prefix_caching_hash_algo", "sha256") or "sha256"),
                               self._block_size)
        # vLLM < 0.30 with several KV-cache groups: failed loads reach the scheduler side in our
        # worker metadata, which rewinds the request to the prefix it had before the hit
        self._failed_meta = None if _compat.has("transfer_results") or len(self._groups) == 1 \
            else _compat.failed_loads_metadata_class()
        self._failed_pending: set[str] = set()
        self._alloc_gap = [0, 0]  # in-step loads seen in start_load_kv, nanoseconds since their allocation
        self._local_computed: dict[str, int] = {}
        self._link = _runtime.link_for(self._settings)
        self._sched: SchedulerBrain | None = None
        self._worker: WorkerCore | None = None
        # scheduler side
        self._requests: dict[str, Request] = {}
        self._hashes_sent: dict[str, int] = {}
        self._request_controls: dict[str, _controls.Controls] = {}  # kv_transfer_params, by request
        self._counts = dict.fromkeys(("lookups", "not_yet", "hit_requests", "hit_tokens", "lookup_ns", "kv_events",
                                      "kv_event_gaps", "low_retention_blocks"), 0)
        self._low_retention = _controls.LowRetention(self._block_size)
        self._event_feed: _events.EventFeed | None = None
        if role == KVConnectorRole.SCHEDULER:
            if self._link.mode == "embedded" and self._link.status()["engine"] != "1":
                raise ValueError(
                    f"PegaKVConnector mode '{self._settings.mode}' resolved to 'embedded', which keeps the cache inside "
                    f"one process, but no worker of instance '{self._instance_id}' registered its KV cache in this "
                    f"process (pid {os.getpid()}; vLLM executor '{vllm_config.parallel_config.distributed_executor_backend}'). "
                    "Use mode 'auto' or 'server'"
                )
            # a P/D decode instance (kv_consumer) waits for the prefill's whole prefix (docs/cluster.md)
            self._sched = SchedulerBrain(self._link.handle, [g.group for g in self._groups], self._block_size,
                                         self._load_enabled,
                                         wait_full_prefix=_kv_role(vllm_config.kv_transfer_config) == "kv_consumer",
                                         in_step=in_step_loads(self._settings))
            if _events.enabled(vllm_config):  # vLLM publishes KV events: the store's go out with them
                self._event_feed = _events.EventFeed(self._link, [(i, g.group.instance_id) for i, g in enumerate(self._groups)])
            if getattr(vllm_config.kv_transfer_config, "kv_load_failure_policy", "fail") != "recompute":
                log.warning("kv_load_failure_policy is '%s': a KV load that fails ends its request with an error. "
                            "Set \"kv_load_failure_policy\": \"recompute\" in --kv-transfer-config so vLLM "
                            "recomputes instead", vllm_config.kv_transfer_config.kv_load_failure_policy)
        log.info("PegaKVConnector %s: instance %s, mode %s, endpoint %s", role.name, self._instance_id, self._link.mode,
                 self._settings.endpoint)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config) -> str | None:
        """vLLM >= 0.29: ``BLNHC`` (every layer's slice of a block back to back: one run per
        block to copy) unless turned off (``cross_layer_blocks``), the model is MLA, or the
        platform's only backend cannot take it (the CPU backend accepts LBHNC alone). vLLM uses
        the request only where its attention backends support it, else warns and keeps its
        default. Before 0.29 the layout names are NHD/HND only: cross-layer blocks are asked
        for through ``prefer_cross_layer_blocks`` instead."""
        if not _compat.has("kv_cache_layouts"):
            return None
        return _layout.required_layout(vllm_config, Settings.from_extra(
            vllm_config.kv_transfer_config.kv_connector_extra_config).cross_layer_blocks)

    @property
    def prefer_cross_layer_blocks(self) -> bool:
        """vLLM 0.26-0.28: one KV tensor for all layers, blocks outermost, where the model's one
        attention backend indexes blocks by stride (vLLM checks; otherwise it allocates per layer
        and calls ``register_kv_caches``). Same conditions as the layout request of 0.29+, and
        only under the NHD layout: under HND (``VLLM_KV_CACHE_LAYOUT=HND``, FlashInfer on
        Blackwell) the backend puts heads outside the layers, so a block is no dense run."""
        if not _compat.has("cross_layer_registration") or _layout.required_layout(
                self._vllm_config, self._settings.cross_layer_blocks) is None:
            return False
        try:
            from vllm.config import set_current_vllm_config
            from vllm.v1.attention.backends.utils import get_kv_cache_layout

            with set_current_vllm_config(self._vllm_config):
                return get_kv_cache_layout() == "NHD"
        except Exception as e:  # noqa: BLE001 - no answer: per-layer caches, which always work
            log.info("cross-layer KV blocks not asked for: vLLM's KV cache layout is unknown here (%s)", e)
            return False

    # ================================================================== worker side

    def register_cross_layers_kv_cache(self, kv_cache: torch.Tensor, attn_backend) -> None:
        """vLLM 0.26-0.28's cross-layer tensor: registered as the per-layer views vLLM's model
        reads (the same memory), which the layout description finds back to back per block."""
        self._cross_layer_registered = True
        self.register_kv_caches(_layout.cross_layer_views(kv_cache, attn_backend, self._kv_cache_config))

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        if self.prefer_cross_layer_blocks and not getattr(self, "_cross_layer_registered", False):
            log.info("cross-layer KV blocks were asked for, but vLLM allocated per-layer caches (its model runner or "
                     "attention backend does not offer them for this model): the per-layer layout is used")
        kcc = self._kv_cache_config
        tp_rank, tp_size, pp_rank, pp_size = _parallel_ranks(self._vllm_config)
        worker = WorkerCore(self._settings, self._instance_id, self._load_enabled, self._save_enabled)
        worker.register(kv_caches, int(kcc.num_blocks), _is_mla(kcc), _layout.namespace_facts(self._vllm_config),
                        tp_rank, tp_size, pp_rank, pp_size, groups=self._groups)
        self._worker = worker

    def _plan(self, metadata) -> bytes | None:
        return metadata.plan if isinstance(metadata, PegaConnectorMetadata) and self._worker is not None else None

    def handle_preemptions(self, kv_connector_metadata):
        plan = self._plan(kv_connector_metadata)
        if plan is not None:
            self._worker.handle_preemptions(plan)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        plan = self._plan(self._connector_metadata)
        if plan is not None:
            self._worker.start_loads(plan)
        if _ALLOCATED_NS:
            now = time.perf_counter_ns()
            for t in _ALLOCATED_NS.values():
                self._alloc_gap[0] += 1
                self._alloc_gap[1] += now - t
            _ALLOCATED_NS.clear()

    def wait_for_layer_load(self, layer_name: str) -> None:
        # In-step loads: this layer's attention waits (on the GPU) for its own layer's bytes;
        # asynchronous loads' requests are not in this forward pass.
        if self._worker is not None and self._worker.step_loads:
            self._worker.wait_layer(layer_name)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """In-step loads wait per layer in ``wait_for_layer_load``, which a FULL CUDA graph's
        replay would skip (a request whose tail is one token runs in a decode-shaped batch)."""
        # auto loads in the step only on the CPU runner, which has no CUDA graphs
        return Settings.from_extra(extra_config).load_in_step is True
    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        # Saves go out per step from the plan (wait_for_save), which FULL CUDA graphs keep.
        return

    def wait_for_save(self):
        plan = self._plan(self._connector_metadata)
        if plan is not None:
            self._worker.submit_saves(plan)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending or None, results.finished_recving or None

    def get_transfer_results(self, finished_req_ids: set[str]):
        """Finished saves and loads. A model with several KV-cache groups reports a failed load by
        request (``failed_recving``: vLLM recomputes the request), since vLLM cannot map block ids
        of several groups back to requests; one group reports the failed blocks instead
        (``get_block_ids_with_load_errors``: vLLM keeps the valid prefix). Before vLLM 0.30 the
        request ids go in the connector's worker metadata (``build_connector_worker_meta``)."""
        if self._worker is None:
            return TransferResults()
        sending, recving, failed = self._worker.get_finished(finished_req_ids)
        if len(self._groups) == 1:
            failed = set()
        elif self._failed_meta is not None:
            self._failed_pending |= failed
            failed = set()
        return TransferResults(finished_sending=sending, finished_recving=recving, failed_recving=failed)

    def build_connector_worker_meta(self):
        """vLLM < 0.30, several KV-cache groups: this step's failed loads, by request."""
        if self._failed_meta is None or not self._failed_pending:
            return None
        failed, self._failed_pending = self._failed_pending, set()
        return self._failed_meta(failed_recving=failed)

    def get_block_ids_with_load_errors(self) -> set[int]:
        if self._worker is None:
            return set()
        errors = self._worker.load_errors()
        return errors if len(self._groups) == 1 else set()  # several groups: reported by request

    # ================================================================== scheduler side

    def on_new_request(self, request: Request) -> None:
        self._requests[request.request_id] = request

    def _controls_of(self, request: Request) -> _controls.Controls:
        """The request's ``kv_transfer_params`` controls, read once (``_controls``)."""
        c = self._request_controls.get(request.request_id)
        if c is None:
            c = self._request_controls[request.request_id] = _controls.of(
                request.request_id, getattr(request, "kv_transfer_params", None))
        return c

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        n, load_async = self._matched_tokens(request, num_computed_tokens)
        if n is not None and self._controls_of(request).retention == "low":
            self._low_retention.looked_up(request.request_id, num_computed_tokens, n)
        return n, load_async

    def _matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        self._requests[request.request_id] = request
        hashes = self._keys.of(request)
        if not self._load_enabled or len(hashes) <= num_computed_tokens // self._block_size \
                or not self._controls_of(request).load:
            return 0, False
        bs = self._block_size
        t0 = time.perf_counter_ns()
        tail = tail_key(request, bs, hashes) if self._tail_flow and self._role == "kv_consumer" \
            and request.num_tokens == request.num_prompt_tokens \
            else None
        try:
            if tail is not None:
                # the tail block after the full ones: the brain sees it as one more block (its
                # window then reaches it), and a hit on it covers every prompt token but the last
                full = request.num_prompt_tokens // bs
                n = self._sched.lookup(request.request_id, list(hashes[:full]) + [tail], (full + 1) * bs + 1,
                                       num_computed_tokens)
                if n > 0 and num_computed_tokens + n > full * bs:
                    n = request.num_tokens - 1 - num_computed_tokens
                    self._tail_probes.add(request.request_id)
                else:
                    self._tail_probes.discard(request.request_id)
            else:
                n = self._sched.lookup(request.request_id, hashes, request.num_tokens, num_computed_tokens)
        except PegaflowError as e:  # bad input from vLLM's side would land here; never crash vLLM
            log.warning("lookup of request %s failed (%s): recomputing", request.request_id, e)
            return 0, False
        finally:
            self._counts["lookup_ns"] += time.perf_counter_ns() - t0
        if n < 0:
            # The prefix continues on SSD and is being read back into the pool: "not yet",
            # vLLM keeps the request waiting and asks again (the brain bounds the wait).
            self._counts["not_yet"] += 1
            return None, False
        self._counts["lookups"] += 1
        if n > 0:
            self._counts["hit_requests"] += 1
            self._counts["hit_tokens"] += n
            self._local_computed[request.request_id] = num_computed_tokens
        # in-step: vLLM schedules the tail in this step and the load runs inside it
        return n, n > 0 and not self._sched.in_step

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int):
        self._requests[request.request_id] = request
        if num_external_tokens % self._block_size and request.request_id in self._tail_probes:
            # the tail block is loaded whole (its bytes past the prompt are never read)
            num_external_tokens = -(-num_external_tokens // self._block_size) * self._block_size
        self._sched.after_alloc(request.request_id, blocks.get_block_ids(), num_external_tokens)
        if num_external_tokens > 0 and self._sched.in_step and len(_ALLOCATED_NS) < 4096:
            _ALLOCATED_NS[request.request_id] = time.perf_counter_ns()  # no worker here: emptied at request_finished

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        sched = self._sched
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
            sched.preempted(req_id)
        return PegaConnectorMetadata(plan=sched.build_plan())

    def _schedule(self, req_id: str, block_ids, resumed: bool, num_computed: int, num_scheduled: int) -> None:
        request = self._requests.get(req_id)
        if request is None:
            return
        controls = self._controls_of(request)
        if not controls.save:
            return  # the request asked for no save (kv_transfer_params)
        hashes = self._keys.of(request)
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
                self._sched.schedule(req_id, window, sent, block_ids, resumed, num_computed,
                                     (full + 1) * self._block_size - num_computed)
                self._hashes_sent[req_id] = full + 1
                return
        if full <= sent and not any(block_ids) and not resumed:
            return  # a decode step inside a block: nothing for the brain (no upcall per token)
        window = hashes[sent:full] if full > sent else []
        self._sched.schedule(req_id, window, sent, block_ids, resumed, num_computed, num_scheduled)
        if full > sent:
            self._hashes_sent[req_id] = full

    def update_connector_output(self, connector_output: KVConnectorOutput):
        self._sched.failed_blocks(connector_output.invalid_block_ids or ())
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
        self._sched.finished(connector_output.finished_sending, connector_output.finished_recving, failed)
        self._demote(self._low_retention.saves_done(connector_output.finished_sending))

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        low = self._request_controls.get(request.request_id, _controls.DEFAULT).retention == "low"
        keys = self._keys.of(request) if low else ()
        saved = self._hashes_sent.get(request.request_id, 0)
        self._requests.pop(request.request_id, None)
        self._request_controls.pop(request.request_id, None)
        self._hashes_sent.pop(request.request_id, None)
        self._keys.forget(request.request_id)
        self._local_computed.pop(request.request_id, None)
        _ALLOCATED_NS.pop(request.request_id, None)
        self._tail_probes.discard(request.request_id)
        held = self._sched.request_finished(request.request_id)
        if low:
            self._demote(self._low_retention.finished(request.request_id, keys, saved, held))
        return held, None

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

    def request_finished_all_groups(self, request: Request,
                                    block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        """``SupportsHMA``: the one call for a request of a hybrid model (every group's blocks)."""
        return self.request_finished(request, block_ids[0] if block_ids else [])

    def reset_cache(self) -> bool | None:
        """vLLM's ``reset_prefix_cache(reset_connector=True)`` (scheduler side): clears this instance's
        namespace in the store, every KV-cache group's, pool and SSD (other instances of the namespace
        lose those blocks too). False when the store did not do it (vLLM then reports the reset failed)."""
        if self._sched is None:
            return None
        try:
            counts = [self._link.reset_cache(g.group.instance_id) for g in self._groups]
        except PegaflowError as e:
            log.warning("reset_cache: the store kept instance %s's cache: %s", self._instance_id, e)
            return False
        log.info("reset_cache: instance %s's namespace cleared: %d blocks from the pool, %d SSD records",
                 self._instance_id, sum(c[0] for c in counts), sum(c[1] for c in counts))
        return True

    def take_events(self):
        """vLLM's KV events from the connector (scheduler side, every step): the store's block events
        of this instance's namespaces while vLLM publishes events (``_events``)."""
        feed = self._event_feed
        if feed is None:
            return ()
        gaps = feed.gaps
        events = feed.take()
        self._counts["kv_events"] += len(events)
        self._counts["kv_event_gaps"] += feed.gaps - gaps
        return events

    def get_loaded_kv_cache_group_ids(self, request: Request) -> tuple[int, ...]:
        """vLLM >= 0.32: a load restores every group (each group's hit blocks), so none is zeroed."""
        return tuple(range(len(self._groups)))

    # ================================================================== stats (both sides)

    def get_kv_connector_stats(self) -> PegaConnectorStats | None:
        """Counters since the last call: the scheduler side's lookups and hits, a worker's copies."""
        if self._worker is not None and self._worker.brain is not None:
            data = self._worker.brain.stats()
            if self._alloc_gap[0]:
                data["alloc_to_load_starts"], data["alloc_to_load_ns"] = self._alloc_gap
                self._alloc_gap = [0, 0]
        elif self._sched is not None:
            data, self._counts = self._counts, dict.fromkeys(self._counts, 0)
        else:
            return None
        return PegaConnectorStats(data=data) if any(data.values()) else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> PegaConnectorStats:
        return PegaConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues) -> PegaPromMetrics:
        return PegaPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # ================================================================== both

    def shutdown(self):
        for part in (self._sched, self._worker):
            if part is not None:
                try:
                    part.close()
                except PegaflowError as e:
                    log.debug("closing the connector: %s", e)
        self._sched = self._worker = None
