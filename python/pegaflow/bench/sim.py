"""A vLLM engine on CPU for driving PegaKVConnector with vLLM's real objects.

Everything vLLM-side is the installed vLLM's own code: ``VllmConfig`` with a local tiny model
config (no weights, no tokenizer, no hub), the KV-cache plan and allocation
(``get_kv_cache_config_from_groups``, ``allocate_kv_cache`` with the chosen ``KVCacheLayout``),
the connector built by ``KVConnectorFactory`` for both roles, the real ``Scheduler``,
``Request`` with vLLM's block hasher, and ``KVOutputAggregator`` across TP ranks. Only the
model's forward is replaced, by a deterministic writer: the K/V bytes of token ``p`` are a
digest of tokens ``0..p`` (and the layer, and the TP rank unless MLA), and the sampled token
is derived from the same digest. So a cache hit that loads bytes must yield exactly the
bytes, and the outputs, that computing would have.

Why one file past 600 lines: it stands in for one vLLM engine (config, KV-cache plan, scheduler
loop, TP ranks, the writer) whose parts only make sense together.

The worker loop mirrors vLLM 0.33's ``vllm/v1/worker/gpu/kv_connector.py`` (``pre_forward``
l.75-98: ``handle_preemptions``, ``bind_connector_metadata``, async loads started after the
forward; ``post_forward`` l.136-160: ``wait_for_save``, ``get_transfer_results``,
``get_block_ids_with_load_errors``, ``build_connector_worker_meta``,
``clear_connector_metadata``) and the block-table bookkeeping of
``vllm/v1/worker/gpu_model_runner.py`` ``_update_states`` (l.1338-1454: new requests bring
their table, resumed ones replace it, others append ``new_block_ids``).

One file for every supported minor (0.26-0.33): where the installed vLLM's internals differ,
a named branch below does what that minor's worker does (``_compat.DIFFERENCES`` names the
difference; each branch cites the file and function it mirrors):

- planning: ``get_kv_cache_config_from_groups`` is in ``vllm.v1.core.kv_cache_planning``
  from 0.33, in ``vllm.v1.core.kv_cache_utils`` before;
- allocation (``kv_cache_layouts``, 0.29+): ``allocate_kv_cache`` with a ``KVCacheLayout``;
  before (``cross_layer_registration``, 0.26-0.28) ``GPUModelRunner.initialize_kv_cache_tensors``:
  per-layer tensors in the attention backend's shape and stride order, or, where the connector's
  ``prefer_cross_layer_blocks`` holds, one tensor for all layers
  (``allocate_uniform_kv_caches``) handed to ``register_cross_layers_kv_cache``. A layout name
  maps to that minor's means (``LEGACY_LAYOUTS``); one it cannot allocate is refused
  (:class:`LayoutNotInThisMinor`);
- the worker loop (``transfer_results``, 0.30+): ``get_transfer_results``; before,
  ``get_finished`` (a hybrid model's failed loads then travel in the connector's worker
  metadata, aggregated by ``KVOutputAggregator``).

Size: a whole vLLM engine loop on CPU (config, allocation, scheduler steps, a forward that writes known bytes, the connector's both roles) kept in one module so every test drives the same loop.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import time
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    CUDAGraphMode,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    AttentionSpec,
    FullAttentionSpec,
    KVCacheGroupSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from pegaflow.connector import _compat  # noqa: E402
from pegaflow.connector import _vllm as _connector  # noqa: E402

# The differences of the installed minor this file branches on (pegaflow.connector._compat).
CROSS_LAYER_REGISTRATION = _compat.has("cross_layer_registration")  # 0.26-0.28
KV_CACHE_LAYOUTS = _compat.has("kv_cache_layouts")  # 0.29+
TRANSFER_RESULTS = _compat.has("transfer_results")  # 0.30+
# 0.29+ (vllm/v1/worker/gpu/kv_connector.py ActiveKVConnector.pre_forward): async loads start
# after the forward; 0.26-0.28 start them before it (the same file's pre_forward, and
# KVConnectorModelRunnerMixin._get_kv_connector_output).
LOADS_AFTER_FORWARD = _compat.minor() >= (0, 29)
# what an eager forward's start_load_kv is handed: vLLM's forward context, with the step's attention
# metadata and no CUDA graph (the connector's per-layer hooks run in it)
EAGER_FORWARD = SimpleNamespace(attn_metadata={}, cudagraph_runtime_mode=CUDAGraphMode.NONE)

if importlib.util.find_spec("vllm.v1.core.kv_cache_planning") is not None:  # 0.33
    from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups  # noqa: E402
else:  # 0.26-0.32
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups  # noqa: E402
if KV_CACHE_LAYOUTS:
    from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402
    from vllm.v1.worker.utils import allocate_kv_cache  # noqa: E402

# vLLM 0.26-0.28 (no KVCacheLayout): what each layout name is there, as (the KV cache layout
# of get_kv_cache_layout, NHD or HND; whether the layers share one tensor with blocks
# outermost, cross-layer blocks). FlashAttention's stride orders
# (vllm/v1/attention/backends/flash_attn.py get_kv_cache_stride_order): NHD per layer is
# [B, N, H, C] (LBNHC), HND per layer [B, H, N, C] (LBHNC); with the layer dimension NHD is
# [B, L, N, H, C] (BLNHC) and HND [B, H, L, N, C] (BHLNC). BLHNC and LHBNC have no equivalent.
LEGACY_LAYOUTS = {"LBNHC": ("NHD", False), "LBHNC": ("HND", False), "BLNHC": ("NHD", True), "BHLNC": ("HND", True)}


class LayoutNotInThisMinor(ValueError):
    """A layout name the installed vLLM cannot allocate (see ``LEGACY_LAYOUTS``)."""


def layout_available(layout: str) -> str | None:
    """None where the installed vLLM can allocate ``layout``, else the reason it cannot."""
    if KV_CACHE_LAYOUTS:
        return None if layout in KVCacheLayout.__members__ else \
            f"vLLM {_minor_text()} has no KV cache layout {layout} (KVCacheLayout: {sorted(KVCacheLayout.__members__)})"
    if layout in LEGACY_LAYOUTS:
        return None
    return (f"vLLM {_minor_text()} cannot allocate layout {layout}: before 0.29 a KV cache layout is NHD or HND, per "
            f"layer or as cross-layer blocks ({', '.join(LEGACY_LAYOUTS)}); HND with cross-layer blocks is BHLNC")


def _minor_text() -> str:
    return ".".join(map(str, _compat.minor()))

TINY_MODEL = Path(__file__).with_name("tiny_llama")
LAYERS = 2
VOCAB = 1000


@dataclass
class Stats:
    steps: int = 0
    scheduled_tokens: int = 0  # tokens the "model" computed
    prompt_tokens: int = 0
    # loads vLLM committed that ran: async ones as finished_recving reports them, in-step ones when scheduled
    loaded_requests: int = 0
    invalid_blocks: int = 0
    failed_loads: int = 0  # requests reported in failed_recving (a model with several KV-cache groups)
    preemptions: int = 0
    external_tokens: int = 0  # tokens the connector loaded (committed by vLLM)
    local_hit_tokens: int = 0  # tokens vLLM's own prefix cache served
    verified_blocks: int = 0
    verify_failures: int = 0
    lookup_ns: list[int] = field(default_factory=list)
    ttft_steps: dict[str, int] = field(default_factory=dict)


class _Rank:
    """One worker (TP rank): its KV tensors and its worker-side connector."""

    def __init__(self, rank: int, connector, caches: dict[str, torch.Tensor]):
        self.rank = rank
        self.connector = connector
        self.caches = caches
        self.names = sorted(caches)
        # the model's order ("model.layers.<i>...")
        self.layer_order = sorted(caches, key=lambda n: int(n.split(".")[2]))
        self.tables: dict[str, list[list[int]]] = {}  # every KV-cache group's block table
        self.history: dict[str, list[int]] = {}  # last block table (group 0) of every request (for checks)
        self.group_history: dict[str, list[list[int]]] = {}  # every group's


class SimEngine:
    """One "vLLM instance": a scheduler and ``tp`` workers in this process."""

    def __init__(
        self,
        name: str,
        extra: dict | None = None,
        *,
        num_blocks: int = 64,
        block_size: int = 16,
        tp: int = 1,
        layout: str = "LBNHC",
        mla: bool = False,
        dtype: torch.dtype = torch.float16,
        max_num_batched_tokens: int = 256,
        max_num_seqs: int = 16,
        failure_policy: str = "recompute",
        kv_role: str = "kv_both",
        connector: bool = True,
        verify: bool = False,
        hybrid: str | None = None,
        window: int = 40,
        max_model_len: int = 4096,
        full_graph: bool = False,
    ):
        """``hybrid``: None (one full-attention group, ``LAYERS`` layers), ``"swa"`` (vLLM's hybrid
        manager with a full-attention layer and a sliding-window layer of ``window`` tokens) or
        ``"mamba"`` (a full-attention layer and a Mamba layer whose states vLLM keeps per block,
        ``mamba_cache_mode='align'``). The Mamba "model" reads its state from the block vLLM's
        runner reads it from and writes the next one where the runner writes it, and samples
        from it: a wrong state loaded changes the outputs."""
        self.name = name
        self.verify = verify
        # every forward a FULL CUDA graph's replay: loads start outside the forward's context (vLLM's V2
        # runner) and no attention hook runs in it; with verify, the loaded blocks are checked as the
        # replay reads them, at the forward's start
        self.full_graph = full_graph
        self.block_size = block_size
        self.tp = tp
        self.mla = mla
        self.hybrid = hybrid
        self.stats = Stats()
        self.outputs: dict[str, list[int]] = {}
        self.finish_status: dict[str, RequestStatus] = {}
        model_config = ModelConfig(model=str(TINY_MODEL), skip_tokenizer_init=True, dtype="float16",
                                   max_model_len=max_model_len, seed=0)
        if (why := layout_available(layout)) is not None:
            raise LayoutNotInThisMinor(why)
        self.layout = layout
        self.cross_layers = False  # whether vLLM allocated one tensor for all layers (0.26-0.28)
        cache_config = CacheConfig(block_size=block_size, enable_prefix_caching=True)
        if KV_CACHE_LAYOUTS:
            cache_config.kv_cache_layout = layout  # as resolve_kv_cache_layout leaves it (0.29+)
        if hybrid == "mamba":
            cache_config.mamba_cache_mode = "align"
        kv_transfer = None
        if connector:
            kv_transfer = KVTransferConfig(
                kv_connector="PegaKVConnector", kv_connector_module_path="pegaflow.connector", kv_role=kv_role,
                kv_connector_extra_config=dict(extra or {}), kv_load_failure_policy=failure_policy, engine_id=name,
            )
        self.vllm_config = VllmConfig(
            model_config=model_config,
            scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                             max_model_len=max_model_len, enable_chunked_prefill=True,
                                             is_encoder_decoder=False,
                                             # this loop schedules, runs and takes each step's output in turn
                                             async_scheduling=False),
            cache_config=cache_config, kv_transfer_config=kv_transfer, device_config=DeviceConfig("cpu"),
        )
        if mla:
            spec = MLAAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=64, dtype=dtype)
        else:
            spec = FullAttentionSpec(block_size=block_size, num_kv_heads=2, head_size=16, dtype=dtype)
        names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
        groups = [KVCacheGroupSpec(names, spec)]
        memory = num_blocks * LAYERS * spec.page_size_bytes
        if hybrid is not None:
            # one layer per group; the groups overlay one backing, each block id in one group at a time
            if hybrid == "swa":
                other = SlidingWindowSpec(block_size=block_size, num_kv_heads=2, head_size=16, dtype=dtype,
                                          sliding_window=window)
                other_name = "model.layers.1.self_attn.attn"
            elif hybrid == "mamba":
                other = MambaSpec(block_size=block_size, shapes=((4, 8), (2, 16)), dtypes=(dtype, dtype),
                                  mamba_cache_mode="align", page_size_padded=spec.page_size_bytes)
                other_name = "model.layers.1.mixer"
            else:
                raise ValueError(f"hybrid '{hybrid}'; expected None, 'swa' or 'mamba'")
            groups = [KVCacheGroupSpec(names[:1], spec), KVCacheGroupSpec([other_name], other)]
            memory = num_blocks * spec.page_size_bytes
        self.group_of = {n: i for i, g in enumerate(groups) for n in g.layer_names}
        with _legacy_kv_cache_layout(layout):
            if CROSS_LAYER_REGISTRATION:
                groups = [KVCacheGroupSpec(list(g.layer_names), _legacy_spec(g.kv_cache_spec)) for g in groups]
            self.kv_cache_config = get_kv_cache_config_from_groups(self.vllm_config, groups, available_memory=memory)
            self.vllm_config.cache_config.num_gpu_blocks = self.kv_cache_config.num_blocks
            self.num_blocks = self.kv_cache_config.num_blocks
            # Workers first, as EngineCore does (KV caches are registered before the scheduler exists).
            self.ranks: list[_Rank] = []
            for r in range(tp):
                worker = None
                if connector:
                    worker = KVConnectorFactory.create_connector(self.vllm_config, KVConnectorRole.WORKER,
                                                                 self.kv_cache_config)
                with as_tp_rank(r, tp):
                    caches = self._allocate_and_register(worker)
                self.ranks.append(_Rank(r, worker, caches))
        self.scheduler = Scheduler(
            vllm_config=self.vllm_config, kv_cache_config=self.kv_cache_config,
            structured_output_manager=StructuredOutputManager(self.vllm_config), block_size=block_size,
            hash_block_size=block_size, log_stats=True,
        )
        init_none_hash(sha256)  # as EngineCore does (vllm/v1/engine/core.py:219-230)
        self._hasher = get_request_block_hasher(block_size, sha256)
        self._aggregator = KVOutputAggregator(tp)
        self._digests: dict[tuple[int, ...], bytes] = {}
        self._external: dict[str, int] = {}
        self._async_load: dict[str, bool] = {}  # the connector's last load_kv_async answer per request
        self._counted: set[str] = set()
        self.mismatches: list[tuple] = []  # (request, rank, group, block index, block id, computed tokens, step)
        if self.scheduler.connector is not None:
            self._instrument(self.scheduler.connector)

    # ------------------------------------------------------------------ KV-cache allocation

    def _allocate_and_register(self, worker) -> dict:
        """One worker's KV caches (the per-layer views the model reads), registered with its
        connector as that minor's worker registers them."""
        if KV_CACHE_LAYOUTS:
            # 0.29+: vllm/v1/worker/utils.py allocate_kv_cache in the resolved KVCacheLayout, then
            # GPUModelRunner.initialize_kv_cache (and gpu/kv_connector.py ActiveKVConnector.__init__):
            # register_kv_caches
            caches = allocate_kv_cache(self.kv_cache_config, torch.device("cpu"), KVCacheLayout[self.layout])
            if worker is not None:
                worker.register_kv_caches(caches)
            return caches
        return self._legacy_allocate_and_register(worker)

    def _legacy_allocate_and_register(self, worker) -> dict:
        """vLLM 0.26-0.28 (``cross_layer_registration``): vllm/v1/worker/gpu_model_runner.py
        ``GPUModelRunner.initialize_kv_cache_tensors``: where
        ``KVConnectorModelRunnerMixin.use_uniform_kv_cache`` holds (the connector's
        ``prefer_cross_layer_blocks``, one KV-cache group, a backend that indexes blocks by stride)
        one tensor for all layers (``allocate_uniform_kv_caches``), else per-layer tensors in the
        backend's shape and stride order (``_allocate_kv_cache_tensors``,
        ``_reshape_kv_cache_tensors``); then ``GPUModelRunner.initialize_kv_cache`` registers the
        cross-layer tensor (``register_cross_layers_kv_cache``) or the per-layer ones
        (``register_kv_caches``). A per-layer layout name (L...) takes the per-layer path whatever
        the connector prefers: what the V2 model runner (vllm/v1/worker/gpu/attn_utils.py
        ``init_kv_cache``, which has no cross-layer tensor; the default for dense models where
        Triton runs) allocates and registers."""
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
        from vllm.v1.worker.utils import AttentionGroup, prepare_kernel_block_sizes

        kcc = self.kv_cache_config
        runner = object.__new__(GPUModelRunner)  # its KV-cache methods, without a model or a device
        runner.vllm_config, runner.cache_config = self.vllm_config, self.vllm_config.cache_config
        runner.device, runner.kv_cache_config, runner.runner_only_attn_layers = torch.device("cpu"), kcc, set()
        runner.attn_groups = [
            [AttentionGroup(_legacy_backend(g.kv_cache_spec), list(g.layer_names), g.kv_cache_spec, i)]
            for i, g in enumerate(kcc.kv_cache_groups)]
        kernel_block_sizes = prepare_kernel_block_sizes(kcc, runner.attn_groups)
        with _kv_transfer_agent(worker):
            uniform = LEGACY_LAYOUTS[self.layout][1] and runner.use_uniform_kv_cache(runner.attn_groups)
        if uniform:
            caches, cross_layers, backend = runner.allocate_uniform_kv_caches(
                kcc, runner.attn_groups, runner.cache_config.cache_dtype, runner.device, kernel_block_sizes)
            worker.register_cross_layers_kv_cache(cross_layers, backend)
        else:
            caches = runner._reshape_kv_cache_tensors(runner._allocate_kv_cache_tensors(kcc), kernel_block_sizes)
            if worker is not None:
                worker.register_kv_caches(caches)
        self.cross_layers = bool(uniform)
        return caches

    def _instrument(self, conn) -> None:
        """Times the scheduler's lookups and notes what vLLM committed to load."""
        lookup, after_alloc = conn.get_num_new_matched_tokens, conn.update_state_after_alloc

        def timed_lookup(request, num_computed_tokens):
            t0 = time.perf_counter_ns()
            try:
                answer = lookup(request, num_computed_tokens)
                self._async_load[request.request_id] = bool(answer[1])
                return answer
            finally:
                self.stats.lookup_ns.append(time.perf_counter_ns() - t0)

        def noted_after_alloc(request, blocks, num_external_tokens):
            if num_external_tokens > 0:
                self._external[request.request_id] = num_external_tokens
            return after_alloc(request, blocks, num_external_tokens)

        conn.get_num_new_matched_tokens = timed_lookup
        conn.update_state_after_alloc = noted_after_alloc

    # ------------------------------------------------------------------ requests

    def add(self, req_id: str, prompt: list[int], max_tokens: int = 4, kv_transfer_params: dict | None = None) -> Request:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                                extra_args=None if kv_transfer_params is None else {"kv_transfer_params": kv_transfer_params})
        req = Request(req_id, list(prompt), params, None, block_hasher=self._hasher)
        self.scheduler.add_request(req)
        self.stats.prompt_tokens += len(prompt)
        self.outputs[req_id] = []
        return req

    def abort(self, req_id: str) -> None:
        self.scheduler.finish_requests(req_id, RequestStatus.FINISHED_ABORTED)

    def status(self, req_id: str) -> RequestStatus | None:
        r = self.scheduler.requests.get(req_id)
        return None if r is None else r.status

    # ------------------------------------------------------------------ the "model"

    def _prefix_digest(self, tokens: list[int], upto: int) -> bytes:
        """Digest of tokens[0:upto] (chained, memoized per prefix)."""
        key = tuple(tokens[:upto])
        d = self._digests.get(key)
        if d is None:
            parent = self._prefix_digest(tokens, upto - 1) if upto > 0 else b"pegaflow-sim"
            d = hashlib.sha256(parent + (tokens[upto - 1] if upto > 0 else 0).to_bytes(4, "little")).digest()
            self._digests[key] = d
        return d

    def token_kv(self, tokens: list[int], pos: int, layer: str, rank: int, nbytes: int) -> bytes:
        """The K/V bytes "the model" writes for token ``pos`` in one layer of one rank."""
        tag = layer.encode() + (b"" if self.mla else rank.to_bytes(2, "little"))
        seed = hashlib.sha256(self._prefix_digest(tokens, pos + 1) + tag).digest()
        return (seed * (nbytes // 32 + 1))[:nbytes]

    def _is_state(self, name: str) -> bool:
        return self.hybrid == "mamba" and self.group_of[name] == 1

    def _write_token(self, rank: _Rank, name: str, tokens: list[int], pos: int, tables: list[list[int]]) -> None:
        """Attention layer ``name`` writes token ``pos`` (a recurrent layer writes its state once
        per step instead: ``_advance_state``)."""
        off = pos % self.block_size
        cell = _token_cell(rank.caches[name], tables[self.group_of[name]][pos // self.block_size], off)
        raw = cell.view(torch.uint8)
        data = self.token_kv(tokens, pos, name, rank.rank, raw.numel())
        raw.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8).view(raw.shape))

    def _advance_state(self, rank: _Rank, tokens: list[int], start: int, end: int, table: list[int]) -> bytes:
        """The recurrent layer's step, as vLLM's align-mode runner does it: the state is read from
        the block of the last computed token (none at 0), advanced over tokens [start, end) and
        written into the block of token end - 1. Its digest after p tokens is the prefix digest
        of p tokens, however the prompt was split into steps. Returns the new state."""
        bs = self.block_size
        name = next(n for n in rank.names if self._is_state(n))
        if start == 0:
            state = self._prefix_digest(tokens, 0)
        else:
            state = _read_block(rank.caches[name], table[(start + bs - 1) // bs - 1])[:32]
        for tok in tokens[start:end]:
            state = hashlib.sha256(state + tok.to_bytes(4, "little")).digest()
        _write_block(rank.caches[name], table[(end + bs - 1) // bs - 1], state)
        return state

    def block_matches(self, rank: int, block: int, tokens: list[int], block_index: int, group: int | None = None) -> bool:
        """Whether GPU block ``block`` of ``rank`` holds exactly what computing block
        ``block_index`` of ``tokens`` writes (every layer of ``group``, default all; a
        recurrent layer: the state after the block's last token)."""
        r = self.ranks[rank]
        for name in r.names:
            if group is not None and self.group_of[name] != group:
                continue
            if self._is_state(name):
                want = self._prefix_digest(tokens, (block_index + 1) * self.block_size)
                if _read_block(r.caches[name], block)[:32] != want:
                    return False
                continue
            for off in range(self.block_size):
                pos = block_index * self.block_size + off
                raw = _token_cell(r.caches[name], block, off).view(torch.uint8)
                if bytes(raw.contiguous().flatten().tolist()) != self.token_kv(tokens, pos, name, rank, raw.numel()):
                    return False
        return True

    def block_bytes(self, rank: int, block: int) -> bytes:
        r = self.ranks[rank]
        return b"".join(_read_block(r.caches[n], block) for n in r.names)

    def _sample(self, tokens: list[int]) -> int:
        return 3 + int.from_bytes(self._prefix_digest(tokens, len(tokens))[:4], "little") % (VOCAB - 3)

    # ------------------------------------------------------------------ one engine step

    def _verify_new(self, rank, so) -> None:
        """Every block vLLM did not compute for a new request (its own cache hits and loaded
        ones) must hold exactly what computing writes."""
        for nr in so.scheduled_new_reqs:
            tokens = self.scheduler.requests[nr.req_id].all_token_ids
            computed = nr.num_computed_tokens // self.block_size
            for g, table in enumerate(rank.tables[nr.req_id]):
                # a hybrid group holds only what it still needs (vLLM's null block, 0,
                # elsewhere); a recurrent one, the state where computing resumes
                indices = range(computed) if self.hybrid is None or g == 0 else \
                    [i for i in range(computed) if table[i] != 0] if self.hybrid == "swa" else \
                    [computed - 1] if computed and nr.num_computed_tokens % self.block_size == 0 else []
                for i in indices:
                    self.stats.verified_blocks += 1
                    if not self.block_matches(rank.rank, table[i], tokens, i,
                                              None if self.hybrid is None else g):
                        self.stats.verify_failures += 1
                        self.mismatches.append((nr.req_id, rank.rank, g, i, table[i],
                                                nr.num_computed_tokens, self.stats.steps))

    def step(self, on_scheduled=None) -> dict[str, list[int]]:
        """One engine step; ``on_scheduled(scheduler_output)`` runs between the scheduler and
        the workers (where a test injects a fault)."""
        so = self.scheduler.schedule()
        self.stats.steps += 1
        self.stats.preemptions += len(so.preempted_req_ids or ())
        if on_scheduled is not None:
            on_scheduled(so)
        meta = so.kv_connector_metadata
        req_ids = list(so.num_scheduled_tokens)
        sampled: dict[str, list[int]] = {}
        # which requests compute what this step (from the scheduler's output only)
        work = [(nr.req_id, nr.num_computed_tokens) for nr in so.scheduled_new_reqs]
        cached = so.scheduled_cached_reqs
        work += [(rid, cached.num_computed_tokens[i]) for i, rid in enumerate(cached.req_ids)]
        outputs = []
        for rank in self.ranks:
            c = rank.connector
            if c is not None:
                c.handle_preemptions(meta)
                c.bind_connector_metadata(meta)
                if not LOADS_AFTER_FORWARD or getattr(so, "has_sync_kv_loads", False):
                    # 0.26-0.28: always before the forward (see LOADS_AFTER_FORWARD); 0.29+ where a
                    # load must land in this step (kv_connector.py pre_forward: has_sync_kv_loads)
                    c.start_load_kv(None if self.full_graph else EAGER_FORWARD)
                    started = True
                else:
                    started = False
            for rid in so.finished_req_ids:
                rank.tables.pop(rid, None)
            for rid in so.preempted_req_ids or ():
                rank.tables.pop(rid, None)
            for nr in so.scheduled_new_reqs:
                rank.tables[nr.req_id] = [list(g) for g in nr.block_ids]
            for i, rid in enumerate(cached.req_ids):
                new_ids = cached.new_block_ids[i]
                if rid in cached.resumed_req_ids:
                    rank.tables[rid] = [list(g) for g in new_ids]
                elif new_ids is not None:
                    for table, ids in zip(rank.tables[rid], new_ids):
                        table.extend(ids)
            for rid in list(so.num_scheduled_tokens):
                rank.history[rid] = list(rank.tables[rid][0])
                rank.group_history[rid] = [list(t) for t in rank.tables[rid]]
            for nr in so.scheduled_new_reqs:
                if rank.rank == 0:
                    external = self._external.pop(nr.req_id, 0)
                    if external and not self._async_load.get(nr.req_id, True):
                        self.stats.loaded_requests += 1  # an in-step load: it runs in this step's forward
                    if nr.req_id not in self._counted:  # a resumed request's hits are not new hits
                        self._counted.add(nr.req_id)
                        self.stats.external_tokens += external
                        self.stats.local_hit_tokens += max(0, nr.num_computed_tokens - external)
            # the forward pass, layer by layer over the batch; each attention layer first waits
            # for its own loads and saves after (vllm/model_executor/layers/attention/
            # kv_transfer_utils.py maybe_transfer_kv_layer, every minor; not where nothing is
            # scheduled: vLLM then runs no forward), a recurrent layer does neither
            states: dict[str, bytes] = {}
            hooks = c is not None and work and c.has_connector_metadata() and not self.full_graph
            if self.verify and self.full_graph:
                self._verify_new(rank, so)
            for name in rank.layer_order:
                attention = not self._is_state(name)
                if hooks and attention:
                    c.wait_for_layer_load(name)
                for rid, start in work:
                    tokens = self.scheduler.requests[rid].all_token_ids
                    n, tables = so.num_scheduled_tokens[rid], rank.tables[rid]
                    if attention:
                        for pos in range(start, start + n):
                            self._write_token(rank, name, tokens, pos, tables)
                    else:
                        states[rid] = self._advance_state(rank, tokens, start, start + n, tables[1])
                if hooks and attention:
                    c.save_kv_layer(name, rank.caches[name], None)
            for rid, start in work:
                req = self.scheduler.requests[rid]
                tokens = req.all_token_ids
                n = so.num_scheduled_tokens[rid]
                state = states.get(rid)
                if rank.rank == 0:
                    self.stats.scheduled_tokens += n
                    # vLLM samples only when the scheduled tokens reach the end of the known ones; a
                    # recurrent model samples from the state it just computed (from the one it read)
                    token = self._sample(tokens[: start + n]) if state is None else \
                        3 + int.from_bytes(state[:4], "little") % (VOCAB - 3)
                    sampled[rid] = [token] if start + n >= req.num_tokens else []
            if self.verify and not self.full_graph:
                # After the forward (a block another request computes in this same step may be
                # a prefix hit, as in vLLM's batched forward)
                self._verify_new(rank, so)
            kvo = None
            if c is not None:
                if not started:
                    c.start_load_kv(None)  # async loads start after the forward (kv_connector.py:92-98, 143)
                c.wait_for_save()
                if TRANSFER_RESULTS:
                    # 0.30+: vllm/v1/worker/gpu/kv_connector.py ActiveKVConnector.post_forward
                    results = c.get_transfer_results(so.finished_req_ids)
                    finished = dict(finished_sending=results.finished_sending or None,
                                    finished_recving=results.finished_recving or None,
                                    failed_recving=results.failed_recving)
                else:
                    # 0.26-0.29: the same function there (and KVConnectorModelRunnerMixin.
                    # _get_kv_connector_output) asks get_finished; KVConnectorOutput has no failed_recving
                    sending, recving = c.get_finished(so.finished_req_ids)
                    finished = dict(finished_sending=sending, finished_recving=recving)
                # the connector's stats (get_kv_connector_stats) are left for the tests to read
                kvo = KVConnectorOutput(**finished, invalid_block_ids=c.get_block_ids_with_load_errors(),
                                        kv_connector_worker_meta=c.build_connector_worker_meta())
                c.clear_connector_metadata()
            outputs.append(ModelRunnerOutput(
                req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                sampled_token_ids=[sampled.get(r, []) for r in req_ids], kv_connector_output=kvo,
            ))
        merged = self._aggregator.aggregate(outputs) if self.ranks[0].connector is not None else outputs[0]
        if (kvo := merged.kv_connector_output) is not None:
            self.stats.invalid_blocks += len(kvo.invalid_block_ids)
            # by request: failed_recving (0.30+), or before it the connector's own worker
            # metadata (PegaKVConnector.build_connector_worker_meta), the channel vLLM < 0.30 has
            self.stats.failed_loads += len(set(getattr(kvo, "failed_recving", None) or ())
                                           | set(getattr(kvo.kv_connector_worker_meta, "failed_recving", None) or ()))
            self.stats.loaded_requests += len(kvo.finished_recving or ())
        engine_outputs = self.scheduler.update_from_output(so, merged)
        produced: dict[str, list[int]] = {}
        for eco in engine_outputs.values():
            for o in eco.outputs:
                if o.new_token_ids:
                    self.outputs.setdefault(o.request_id, []).extend(o.new_token_ids)
                    produced.setdefault(o.request_id, []).extend(o.new_token_ids)
                    self.stats.ttft_steps.setdefault(o.request_id, self.stats.steps)
                if o.finish_reason is not None:
                    self.finish_status[o.request_id] = o.finish_reason
        return produced

    def at_first_load(self, act, max_steps: int = 50) -> None:
        """Steps until a step's plan starts a load, running ``act(scheduler_output)`` on that
        step between the scheduler and the workers (where a test injects a fault)."""
        done: list[bool] = []

        def hook(so):
            # the plan's header: version, then the counts of loads, saves, preempted (int32 BE)
            if not done and so.kv_connector_metadata.plan[4:8] != b"\x00" * 4:
                act(so)
                done.append(True)

        for _ in range(max_steps):
            self.step(on_scheduled=hook)
            if done:
                return
        raise AssertionError(f"{self.name}: no load planned in {max_steps} steps")

    def run(self, max_steps: int = 2000, idle_sleep_s: float = 0.001) -> None:
        """Steps until every request has finished and every held block is back."""
        for _ in range(max_steps):
            if not self.scheduler.requests and not self.scheduler.has_unfinished_requests():
                return
            before = self.stats.scheduled_tokens
            self.step()
            if self.stats.scheduled_tokens == before:
                time.sleep(idle_sleep_s)  # waiting on transfers: let the copy threads run
        raise TimeoutError(f"{self.name}: requests {sorted(self.scheduler.requests)} still unfinished after "
                           f"{max_steps} steps")

    def free_blocks(self) -> int:
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def assert_drained(self) -> None:
        """Nothing left behind: no request, every GPU block free (block 0 is vLLM's null block)."""
        assert not self.scheduler.requests, f"requests left: {sorted(self.scheduler.requests)}"
        assert self.free_blocks() == self.num_blocks - 1, f"{self.free_blocks()} of {self.num_blocks - 1} blocks free"

    def close(self) -> None:
        for r in self.ranks:
            if r.connector is not None:
                r.connector.shutdown()
        if self.scheduler.connector is not None:
            self.scheduler.connector.shutdown()


def _token_cell(t: torch.Tensor, block: int, off: int) -> torch.Tensor:
    """Token ``off`` of block ``block`` in one layer's view: vLLM's logical ``[B, H, N, C]``
    (every minor's attention layers), or ``[B, N, C]`` (an MLA backend's shape before 0.29)."""
    return t[block, :, off, :] if t.dim() == 4 else t[block, off]


def _block_parts(cache, block: int) -> list[torch.Tensor]:
    """One block of one layer: its tensor, or each state tensor's block where vLLM 0.26 hands a
    Mamba layer as its list of state tensors (``_reshape_kv_cache_tensors``; 0.27+: one page view)."""
    return [t[block] for t in cache] if isinstance(cache, (list, tuple)) else [cache[block]]


def _read_block(cache, block: int) -> bytes:
    return b"".join(bytes(t.contiguous().view(torch.uint8).flatten().tolist()) for t in _block_parts(cache, block))


def _write_block(cache, block: int, pattern: bytes) -> None:
    """Fills one block (every part, in order) with ``pattern`` repeated."""
    parts = [t.view(torch.uint8) for t in _block_parts(cache, block)]
    total = sum(t.numel() for t in parts)
    data, at = (pattern * (total // len(pattern) + 1))[:total], 0
    for raw in parts:
        raw.copy_(torch.frombuffer(bytearray(data[at:at + raw.numel()]), dtype=torch.uint8).view(raw.shape))
        at += raw.numel()


@contextlib.contextmanager
def _legacy_kv_cache_layout(layout: str):
    """vLLM 0.26-0.28: the KV cache layout (NHD/HND) the attention backends read while the KV cache
    is planned and allocated, set as an attention backend's required layout sets it
    (vllm/v1/attention/selector.py ``_cached_get_attn_backend``: ``set_kv_cache_layout``)."""
    if not CROSS_LAYER_REGISTRATION:
        yield
        return
    from vllm.v1.attention.backends.utils import set_kv_cache_layout

    set_kv_cache_layout(LEGACY_LAYOUTS[layout][0])
    try:
        yield
    finally:
        set_kv_cache_layout(None)


def _legacy_backend(spec):
    """vLLM 0.26-0.28: the attention backend whose KV-cache shape and stride order a layer of
    ``spec`` gets on a CUDA GPU: FlashAttention (full and sliding-window attention), Triton MLA
    (MLA: FlashMLA's kernels need 64-token blocks), Mamba2 (states, no attention shape)."""
    if isinstance(spec, MLAAttentionSpec):
        from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend

        return TritonMLABackend
    if isinstance(spec, AttentionSpec):
        from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

        return FlashAttentionBackend
    from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionBackend

    return Mamba2AttentionBackend


def _legacy_spec(spec):
    """vLLM 0.26-0.28: a layer's spec as the worker reports it
    (vllm/v1/worker/gpu_model_runner.py ``GPUModelRunner.get_kv_cache_spec``): an attention spec
    says whether its backend indexes KV by block stride (what ``use_uniform_kv_cache`` checks)."""
    if not isinstance(spec, AttentionSpec):
        return spec
    return replace(spec, indexes_kv_by_block_stride=_legacy_backend(spec).indexes_kv_by_block_stride())


@contextlib.contextmanager
def _kv_transfer_agent(worker):
    """What vLLM's ``get_kv_transfer_group()`` answers in this rank's worker process."""
    from vllm.distributed.kv_transfer import kv_transfer_state

    saved = kv_transfer_state._KV_CONNECTOR_AGENT
    kv_transfer_state._KV_CONNECTOR_AGENT = worker
    try:
        yield
    finally:
        kv_transfer_state._KV_CONNECTOR_AGENT = saved


@contextlib.contextmanager
def as_tp_rank(rank: int, tp: int):
    """What vLLM's parallel_state answers in TP rank ``rank``'s worker process."""
    saved = _connector._parallel_ranks
    _connector._parallel_ranks = lambda vllm_config: (rank, tp, 0, 1)
    try:
        yield
    finally:
        _connector._parallel_ranks = saved
