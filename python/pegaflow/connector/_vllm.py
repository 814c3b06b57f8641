"""PegaKVConnector: vLLM's v1 KV connector on the PegaFlow-JVM engine (imports vLLM).

Load it with::

    vllm serve MODEL --kv-transfer-config '{"kv_connector":"PegaKVConnector","kv_role":"kv_both",
        "kv_connector_module_path":"pegaflow.connector","kv_load_failure_policy":"recompute"}'

or, with the package installed, ``"kv_connector":"PegaKVConnector"`` alone (the
``vllm.general_plugins`` entry point registers the name). Settings go in
``kv_connector_extra_config`` (see ``settings.Settings``): ``mode`` (``auto`` | ``embedded`` |
``server``), ``endpoint``, ``namespace``, ``pool_size``.

This file is the facade, in the shape of vLLM's own ``OffloadingConnector``: each hook is one
call into the scheduler role (``scheduler.SchedulerCore``) or the worker role
(``worker.WorkerCore``), which turn vLLM objects into plain data for the Java brain, where the
request state machine, the per-step load and save plans and the leases live
(``io.pegaflow.connector``). Loads run inside the step that computes the request's tail, or
asynchronously (the request waits in WAITING_FOR_REMOTE_KVS until ``get_finished``); saves are
submitted once per step from the scheduler's plan in ``wait_for_save`` (so FULL CUDA graphs lose
nothing: the per-layer hooks do nothing); a failed load is reported per block so vLLM recomputes
it; the store being unreachable is a miss, never an exception into vLLM.
"""

from __future__ import annotations

import contextlib
import functools
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
from ._stats import PegaConnectorStats, PegaPromMetrics
from .scheduler import ALLOCATED_NS, SchedulerCore
from .settings import Settings
from .worker import WorkerCore

if TYPE_CHECKING:
    import torch
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger("pegaflow.connector")


PROFILE_HOOKS_ENV = "PEGAFLOW_PROFILE_HOOKS"


_profile_hooks: bool | None = None  # PROFILE_HOOKS_ENV, read at the first hook
_NO_SPAN = contextlib.nullcontext()


def _span(name: str):
    """With ``$PEGAFLOW_PROFILE_HOOKS=1``, a torch.profiler range named ``name`` (so a trace shows
    the connector's hooks on vLLM's thread beside vLLM's own steps: ``pegaflow-bench ttft``'s
    traces set it); else a context that does nothing. The variable is read at the first hook,
    not at import: vLLM may import this module before the benchmark sets it."""
    global _profile_hooks
    if _profile_hooks is None:
        _profile_hooks = os.environ.get(PROFILE_HOOKS_ENV) == "1"
    if not _profile_hooks:
        return _NO_SPAN
    import torch

    return torch.profiler.record_function(name)


def _timed(hook):
    """A per-step hook whose time is added to its connector's ``_hooks`` (steps, nanoseconds):
    what vLLM's threads spend in the connector each step (``*_hook_ns`` in the stats)."""
    name = f"pegaflow.{hook.__name__}"

    @functools.wraps(hook)
    def timed(self, *args, **kwargs):
        began = time.perf_counter_ns()
        try:
            with _span(name):
                return hook(self, *args, **kwargs)
        finally:
            self._hooks[1] += time.perf_counter_ns() - began
    return timed

TransferResults = _compat.transfer_results_class()  # vLLM's where it has one (>= 0.30)



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


def loads_at_alloc(settings: Settings, vllm_config) -> bool:
    """Whether in-step loads start where vLLM allocates their blocks (setting ``load_at_alloc``):
    never under asynchronous scheduling, where the previous step's forward may still write into a
    block vLLM hands out again (the early copy is not ordered after it; docs/connector.md)."""
    if not settings.load_at_alloc:
        return False
    if getattr(getattr(vllm_config, "scheduler_config", None), "async_scheduling", False):
        log.warning("load_at_alloc is off under vLLM's asynchronous scheduling (--no-async-scheduling turns that off): "
                    "the previous step's forward may still write into blocks allocated for the next")
        return False
    return True


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


def graph_tokens(vllm_config) -> int | None:
    """The most tokens a step's forward runs as vLLM's piecewise CUDA graphs (its largest capture
    size), None where vLLM runs without CUDA graphs (``enforce_eager``, mode NONE, a CPU runner).
    Past it a step runs eagerly, launch by launch: a warm step's share of computed tokens
    (``compute_share``) stays within it (docs/gpu.md, "Computing the end of a hit")."""
    if getattr(getattr(vllm_config, "model_config", None), "enforce_eager", False):
        return None
    cc = getattr(vllm_config, "compilation_config", None)
    mode, size = getattr(cc, "cudagraph_mode", None), getattr(cc, "max_cudagraph_capture_size", None)
    if mode is None or getattr(mode, "name", str(mode)) == "NONE" or not size:
        return None
    return int(size)


@dataclass
class PegaConnectorMetadata(KVConnectorMetadata):
    """One step's plan from the scheduler-side brain, opaque to Python (it pickles as bytes
    to the worker processes); ``loads``: whether the step loads anything into GPU blocks."""

    plan: bytes
    loads: bool = False


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


def _check_prefix_unit(vllm_config) -> None:
    """vLLM 0.33's ``prefix_match_unit`` hashes prefixes in units other than a block: the
    connector keys and moves whole blocks by one hash each, so it refuses another unit, naming it."""
    cc = vllm_config.cache_config
    unit, block = getattr(cc, "prefix_match_unit", None), int(cc.block_size)
    if unit not in (None, block):
        raise ValueError(f"PegaKVConnector needs vLLM's prefix hashes per block: cache_config.prefix_match_unit={unit} "
                         f"with block_size={block}; expected unset or {block}")


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


LEAD_ENV = "PEGAFLOW_CUDA_LAYER_LEAD_MIB"


def _check_lead(kv_cache_config) -> None:
    """A lead (``PEGAFLOW_CUDA_LAYER_LEAD_MIB``: a held load's first layers copied at allocation,
    before the step starts) only where vLLM does not zero newly allocated blocks on its compute
    stream before the forward: that zeroing would land after the lead's bytes and wipe them."""
    lead = os.environ.get(LEAD_ENV, "").strip()
    if not lead or (lead.isdigit() and int(lead) == 0):
        return
    if getattr(kv_cache_config, "needs_kv_cache_zeroing", False):
        raise ValueError(
            f"{LEAD_ENV}={lead}: this model's KV cache needs zeroing (vLLM zeroes newly allocated blocks on its "
            "compute stream at the step's start, after a lead's copies would have landed); expected 0 or unset")


def apply_preset(settings: Settings, kv_cache_config, gpu: bool | None = None) -> dict[str, str]:
    """Sets the copy engine's environment of ``settings``' preset (``Settings.engine_env``) where
    this process has none of its own, before the engine starts (the in-process JVM reads it when
    it starts, the engine when it is made); returns what it set. ``gpu``: whether vLLM runs on a
    CUDA GPU (None: ask vLLM's platform)."""
    if settings.preset == "none":
        return {}
    if gpu is None:
        from vllm.platforms import current_platform

        gpu = current_platform.is_cuda()
    wanted = settings.engine_env(gpu, bool(getattr(kv_cache_config, "needs_kv_cache_zeroing", False)))
    own = {k: os.environ[k] for k in wanted if k in os.environ}
    applied = {k: v for k, v in wanted.items() if k not in own}
    os.environ.update(applied)
    from .. import _bridge

    if applied and _bridge.started():
        log.warning("preset %s: this process's engine had already started, so %s apply only where it reads them "
                    "again", settings.preset, ", ".join(f"{k}={v}" for k, v in applied.items()))
    log.info("preset %s: load_in_step %s, load_at_alloc %s, compute_share %s; %s%s", settings.preset,
             settings.load_in_step, settings.load_at_alloc, settings.compute_share,
             ", ".join(f"{k}={v}" for k, v in applied.items()) or "no engine variable set",
             "; the process's own " + ", ".join(f"{k}={v}" for k, v in own.items()) if own else "")
    return applied


def forward_runs_layer_hooks(forward_context) -> bool:
    """Whether the forward that follows ``start_load_kv`` calls ``wait_for_layer_load`` layer by
    layer. Eager and PIECEWISE forwards run attention, and its hooks, as Python; a FULL CUDA
    graph's replay runs none of it. vLLM's V1 runner says which in the forward's context
    (``cudagraph_runtime_mode``); its V2 runner starts a FULL step's loads outside that context,
    where ``attn_metadata`` is None, as it is for a step without a forward. Unknown: False (the
    whole load is waited for, never a layer read before it landed)."""
    if forward_context is None or getattr(forward_context, "attn_metadata", None) is None:
        return False
    mode = getattr(forward_context, "cudagraph_runtime_mode", None)
    return getattr(mode, "name", "NONE") in ("NONE", "PIECEWISE")


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
        _check_prefix_unit(vllm_config)
        self._instance_id = _instance_id(vllm_config)
        self._block_size = int(vllm_config.cache_config.block_size)
        self._groups = _groups.plan(kv_cache_config, self._block_size, self._instance_id)
        self._settings = _private.resolve_settings(Settings.from_extra(vllm_config.kv_transfer_config.kv_connector_extra_config),
                                           vllm_config, self._instance_id)
        self._load_enabled, self._save_enabled = _kv_role_flags(vllm_config.kv_transfer_config)
        # vLLM < 0.30 with several KV-cache groups: failed loads reach the scheduler side in our
        # worker metadata, which rewinds the request to the prefix it had before the hit
        self._failed_meta = None if _compat.has("transfer_results") or len(self._groups) == 1 \
            else _compat.failed_loads_metadata_class()
        self._failed_pending: set[str] = set()
        self._alloc_gap = [0, 0]  # in-step loads seen in start_load_kv, nanoseconds since their allocation
        self._fence = [0, 0]  # steps that loaded, nanoseconds start_load_kv waited for the compute stream's earlier work
        self._whole_waits = 0  # steps whose in-step loads were waited for whole in start_load_kv (no per-layer hooks)
        self._hooks = [0, 0]  # steps (start_load_kv / build_connector_meta) and nanoseconds in this side's per-step hooks
        apply_preset(self._settings, kv_cache_config)  # before the engine starts: it reads them then
        self._link = _runtime.link_for(self._settings)
        self._scheduler: SchedulerCore | None = None
        self._worker: WorkerCore | None = None
        if role == KVConnectorRole.SCHEDULER:
            if self._link.mode == "embedded" and self._link.status()["engine"] != "1":
                raise ValueError(
                    f"PegaKVConnector mode '{self._settings.mode}' resolved to 'embedded', which keeps the cache inside "
                    f"one process, but no worker of instance '{self._instance_id}' registered its KV cache in this "
                    f"process (pid {os.getpid()}; vLLM executor '{vllm_config.parallel_config.distributed_executor_backend}'). "
                    "Use mode 'auto' or 'server'"
                )
            self._scheduler = SchedulerCore(
                self._link, self._groups, self._block_size,
                str(getattr(vllm_config.cache_config, "prefix_caching_hash_algo", "sha256") or "sha256"),
                _kv_role(vllm_config.kv_transfer_config), self._load_enabled, self._save_enabled,
                in_step_loads(self._settings), self._failed_meta, _events.enabled(vllm_config),
                at_alloc=loads_at_alloc(self._settings, vllm_config), begin_at_lookup=self._settings.begin_at_lookup,
                compute_share=self._settings.compute_share, graph_tokens=graph_tokens(vllm_config))
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
        _check_lead(self._kv_cache_config)
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

    _load_fence = None  # an event on the compute stream, recorded where a step that loads is bound

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        """In a step that loads, on a GPU: an event on the compute stream, which ``start_load_kv``
        waits for before the loads start. vLLM (0.33) zeroes blocks on that stream, in an earlier
        step for a block it then hands to a load (under asynchronous scheduling that step can
        still run when the next step's loads start) and in the same step for an in-step load's
        blocks where the KV cache needs zeroing (Mamba-align hybrids), and the engine's copy
        streams are not ordered after either (vLLM's own offloading connector orders its loads
        after the compute stream for this reason). Recorded here: after vLLM's zeroing, before
        the forward. Until the stream is passed to the engine, the worker's thread waits."""
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None and getattr(connector_metadata, "loads", False):
            import torch

            if torch.cuda.is_available():
                self._load_fence = torch.cuda.Event()
                self._load_fence.record()  # the current stream: vLLM's compute stream, after its zeroing

    @_timed
    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        self._hooks[0] += 1  # every step vLLM runs the connector for, with a forward or without
        plan = self._plan(self._connector_metadata)
        if plan is not None:
            fence, self._load_fence = self._load_fence, None
            if fence is not None:
                t = time.perf_counter_ns()
                fence.synchronize()  # the compute stream's work before this step's forward (zeroing) is done
                self._fence[0] += 1
                self._fence[1] += time.perf_counter_ns() - t
            self._worker.start_loads(plan)
            if self._worker.step_loads and not forward_runs_layer_hooks(forward_context):
                self._worker.wait_all_layers()
                self._whole_waits += 1
        if ALLOCATED_NS:
            now = time.perf_counter_ns()
            for t in ALLOCATED_NS.values():
                self._alloc_gap[0] += 1
                self._alloc_gap[1] += now - t
            ALLOCATED_NS.clear()

    def wait_for_layer_load(self, layer_name: str) -> None:
        # In-step loads: this layer's attention waits (on the GPU) for its own layer's bytes;
        # asynchronous loads' requests are not in this forward pass.
        if self._worker is not None and self._worker.step_loads:
            t = time.perf_counter_ns()
            with _span("pegaflow.wait_for_layer_load"):
                self._worker.wait_layer(layer_name)
            self._hooks[1] += time.perf_counter_ns() - t

    # requires_piecewise_for_cudagraph stays vLLM's (False): vLLM keeps its FULL CUDA graphs for
    # decode batches. A step whose in-step loads meet a FULL graph's replay, which calls no
    # wait_for_layer_load (a request whose tail is one token runs in a decode-shaped batch), has the
    # compute stream wait for every layer in start_load_kv instead (forward_runs_layer_hooks).

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        # Saves go out per step from the plan (wait_for_save), which FULL CUDA graphs keep.
        return

    @_timed
    def wait_for_save(self):
        plan = self._plan(self._connector_metadata)
        if plan is not None:
            self._worker.submit_saves(plan)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending or None, results.finished_recving or None

    @_timed
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
    # Each hook is one call into SchedulerCore (scheduler.py), which reads vLLM's objects and
    # calls the Java brain.

    def on_new_request(self, request: Request) -> None:
        self._scheduler.on_new_request(request)

    @_timed
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self._scheduler.matched_tokens(request, num_computed_tokens)

    @_timed
    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int):
        self._scheduler.after_alloc(request, blocks.get_block_ids(), num_external_tokens)

    @_timed
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        self._hooks[0] += 1
        loads = self._scheduler.take_loads()
        return PegaConnectorMetadata(plan=self._scheduler.build_plan(scheduler_output), loads=loads)

    @_timed
    def update_connector_output(self, connector_output: KVConnectorOutput):
        self._scheduler.update_connector_output(connector_output)

    @_timed
    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self._scheduler.request_finished(request), None

    def request_finished_all_groups(self, request: Request,
                                    block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        """``SupportsHMA``: the one call for a request of a hybrid model (every group's blocks)."""
        return self.request_finished(request, block_ids[0] if block_ids else [])

    def reset_cache(self) -> bool | None:
        """vLLM's ``reset_prefix_cache(reset_connector=True)`` (scheduler side; ``SchedulerCore.reset_cache``)."""
        return None if self._scheduler is None else self._scheduler.reset_cache(self._instance_id)

    def take_events(self):
        """vLLM's KV events from the connector (scheduler side, every step; ``_events``)."""
        return () if self._scheduler is None else self._scheduler.take_events()

    def get_loaded_kv_cache_group_ids(self, request: Request) -> tuple[int, ...]:
        """vLLM >= 0.32: a load restores every group (each group's hit blocks), so none is zeroed."""
        return tuple(range(len(self._groups)))

    # ================================================================== stats (both sides)

    def get_kv_connector_stats(self) -> PegaConnectorStats | None:
        """Counters since the last call: the scheduler side's lookups and hits, a worker's copies,
        and this side's time in its hooks (this call's own until here included)."""
        began = time.perf_counter_ns()
        if self._worker is not None and self._worker.brain is not None:
            data = self._worker.stats()
            if self._alloc_gap[0]:
                data["alloc_to_load_starts"], data["alloc_to_load_ns"] = self._alloc_gap
                self._alloc_gap = [0, 0]
            if self._fence[0]:
                data["load_fences"], data["load_fence_ns"] = self._fence
                self._fence = [0, 0]
            if self._whole_waits:
                data["in_step_whole_waits"], self._whole_waits = self._whole_waits, 0
            side = "worker"
        elif self._scheduler is not None:
            data = self._scheduler.take_counts()
            side = "scheduler"
        else:
            return None
        self._hooks[1] += time.perf_counter_ns() - began
        data[f"{side}_steps"], data[f"{side}_hook_ns"] = self._hooks
        self._hooks = [0, 0]
        return PegaConnectorStats(data=data) if any(data.values()) else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> PegaConnectorStats:
        return PegaConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues) -> PegaPromMetrics:
        return PegaPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # ================================================================== both

    def shutdown(self):
        for part in (self._scheduler, self._worker):
            if part is not None:
                try:
                    part.close()
                except PegaflowError as e:
                    log.debug("closing the connector: %s", e)
        self._scheduler = self._worker = None
