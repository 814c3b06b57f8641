"""The worker side of the connector as plain data, without vLLM: register a worker's KV
tensors, then run each step's plan (bytes from the scheduler side's brain). PegaKVConnector's
worker role is this plus the unwrapping of vLLM objects; the GPU end-to-end test drives it
directly on a machine that has PyTorch but no vLLM."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from ..errors import InvalidArgumentError, PegaflowError
from . import _groups, _layout, _runtime
from ._brain import CountersDue, Group, WorkerBrain
from ._keys import lookup_warm_up_enabled
from .settings import Settings

log = logging.getLogger("pegaflow.connector")


def flatten_states(kv_caches: dict) -> dict:
    """vLLM hands a Mamba layer's states as a list of tensors (convolution and SSM state, each
    ``[num_blocks, ...]`` over the layer's pages): each becomes a region of its own,
    ``<layer>#<i>``; attention layers keep their one tensor."""
    out = {}
    for name, value in kv_caches.items():
        if isinstance(value, (list, tuple)):
            for i, t in enumerate(value):
                out[f"{name}#{i}"] = t
        else:
            out[name] = value
    return out


CU_STREAM_LEGACY = 1  # the CUDA driver's handle for the legacy default stream (cuda.h)


def cuda_stream_handle(torch_handle: int) -> int:
    """The driver handle of the stream PyTorch reports. PyTorch's default stream reads 0, which
    the store's calls take as "no stream: block this thread" (host copies), so every layer of an
    in-step load would block vLLM's thread until its bytes land and a save would not be ordered
    after the forward's writes at all; on CUDA the default stream is passed as CU_STREAM_LEGACY,
    which the driver orders on the GPU like any stream."""
    return torch_handle if torch_handle else CU_STREAM_LEGACY


class WorkerCore:
    """One worker (TP rank) of one instance."""

    def __init__(self, settings: Settings, instance_id: str, load_enabled: bool = True,
                 save_enabled: bool = True):
        self.settings = settings
        self.instance_id = instance_id
        self.load_enabled = load_enabled
        self.save_enabled = save_enabled
        self.link = _runtime.link_for(settings)
        self.brain: WorkerBrain | None = None
        self.namespace: str | None = None
        self.layers: list[_layout.LayerGeometry] = []
        self._stream_of = None
        self.step_loads = 0  # this step's loads that run inside it (start_loads)
        # whether the store may hold failed block ids: only a step with in-step loads or a
        # get_finished that reported a failed load ("F") puts any there (WorkerSide), so a
        # decode step asks nothing (one call into the JVM less per step)
        self._errors_possible = False
        # whether a get_finished without finished ids can report anything: until the store says
        # it is idle (no load in flight, no finished request's saves pending), and again once a
        # plan starts loads; a decode step then makes no call (docs/benchmarks, "Calls into the JVM per step")
        self._pending = True
        # the store's counters are read after a plan with loads or saves or a get_finished that
        # asked (copies end on the store's threads: what they count is read then, or later)
        self._counts = CountersDue()
        self._layer_index: dict[str, int] = {}  # vLLM layer name -> its region's index (group 0)
        self._regions = 0  # group 0's registered regions (wait_all_layers)

    def register(self, kv_caches: dict, num_blocks: int, mla: bool, facts: dict, tp_rank: int = 0, tp_size: int = 1,
                 pp_rank: int = 0, pp_size: int = 1, groups: list[_groups.GroupPlan] | None = None) -> str:
        """Describes the tensors (shape, strides, storage offsets), registers them with the
        store and returns the namespace (group 0's). MLA latents are the same on every TP rank,
        so MLA workers register as replicas of one stored copy. With several KV-cache groups
        (``groups``, vLLM's hybrid manager) each group registers its own layers as its own
        instance, in a namespace of its own."""
        if groups is None:
            groups = [_groups.GroupPlan(0, Group(self.instance_id), tuple(kv_caches), "FullAttentionSpec")]
        store_tp, store_tp_rank = (1, 0) if mla else (tp_size, tp_rank)
        worker_rank = pp_rank * tp_size + tp_rank
        namespaces, described = [], []
        kv_caches = flatten_states(kv_caches)
        for g in groups:
            names = set(g.layer_names)
            caches = {n: t for n, t in kv_caches.items() if n.split("#", 1)[0] in names}
            if len(groups) > 1 and not caches:
                raise InvalidArgumentError(f"KV-cache group {g.index} ({g.spec}): none of its layers {list(g.layer_names)[:4]} "
                                           "was registered by vLLM; expected its KV tensors")
            layers = _layout.describe_kv_caches(caches if len(groups) > 1 else kv_caches, num_blocks, mla)
            group_facts = facts if len(groups) == 1 else dict(facts, group=g.index, group_spec=g.spec,
                                                               group_kind=g.group.kind, window=g.group.window)
            namespace = self.settings.namespace or _layout.derive_namespace(group_facts, layers, store_tp)
            if self.settings.namespace and len(groups) > 1:
                namespace = f"{namespace}/g{g.index}"
            namespaces.append(namespace)
            described.append(layers)
        device = described[0][0].device
        if device.startswith("cuda"):
            transfer, device_id = "cuda", int(device.split(":")[1]) if ":" in device else 0
        else:
            transfer, device_id = "host", 0
        for g, namespace, layers in zip(groups, namespaces, described):
            self.link.register_worker(g.group.instance_id, namespace, store_tp, tp_size * pp_size, worker_rank,
                                      store_tp_rank, [x.region for x in layers], transfer, device_id)
        self.brain = WorkerBrain(self.link.handle, [g.group for g in groups], worker_rank)
        self.start_warm_up(int(facts.get("block_size") or 16))
        # wait_for_layer_load names a layer; the store knows group 0's regions by index, in the
        # order registered (layers sharing one KV tensor share its region)
        first = {int(x.region.base_address): i for i, x in reversed(list(enumerate(described[0])))}
        self._layer_index = {name: first[int(t.data_ptr())] for name, t in kv_caches.items()
                             if hasattr(t, "data_ptr") and int(t.data_ptr()) in first}
        self._regions = len(described[0])
        if transfer == "cuda":
            import torch

            self._stream_of = lambda: cuda_stream_handle(torch.cuda.current_stream(device_id).cuda_stream)
        self.namespace, self.layers = namespaces[0], [x for layers in described for x in layers]
        log.info("PegaKVConnector worker %d: %d layers (%s) in %d KV-cache group(s) %s, namespace %s, mode %s", worker_rank,
                 len(self.layers), described[0][0].region.layout, len(groups), [g.spec for g in groups], namespaces[0],
                 self.link.mode)
        return namespaces[0]

    def start_warm_up(self, block_size: int) -> bool:
        """Asks the JVM for the request path's warm-up (``WorkerBrain.warm_up``) where loads are
        enabled and ``PEGAFLOW_WARM_UP`` allows it: a worker in a process of its own (vLLM's
        workers with several GPUs) would otherwise run its first in-step loads cold; beside the
        scheduler side (one GPU) it comes first (vLLM registers the caches before it makes the
        scheduler), and the JVM takes server mode from the process's links, as the scheduler's
        start would. True if this call started it; a failure only logs (an optimisation)."""
        if not (self.load_enabled and lookup_warm_up_enabled()):
            return False
        try:
            return self.brain.warm_up(block_size)
        except PegaflowError as e:
            log.debug("warm-up not started: %s", e)
            return False

    def handle_preemptions(self, plan: bytes | None) -> None:
        """Before vLLM reuses preempted requests' blocks: their saves stop reading them."""
        if self.brain is not None and plan:
            self.brain.await_preempted(plan)

    def start_loads(self, plan: bytes | None) -> None:
        self.step_loads = 0
        if self.brain is not None and plan and self.load_enabled:
            self.step_loads = self.brain.start_loads(plan)
            self._errors_possible |= self.step_loads > 0
            self._pending = True  # its asynchronous loads, if any, are reported by a later get_finished
            self._counts.mark()

    def wait_layer(self, layer_name: str) -> None:
        """Before layer ``layer_name`` reads its KV: the current CUDA stream (or this thread, for
        host copies) waits for that layer's bytes of the step's in-step loads."""
        if self.brain is None or not self.step_loads:
            return
        index = self._layer_index.get(layer_name)
        if index is not None:
            self.brain.wait_layer(index, self._stream_of() if self._stream_of else 0)

    def wait_all_layers(self) -> None:
        """Before a forward that calls no ``wait_for_layer_load`` (a FULL CUDA graph's replay):
        the current CUDA stream (or this thread, for host copies) waits for every layer of the
        step's in-step loads, so no layer of that forward reads a block before it landed."""
        if self.brain is None or not self.step_loads:
            return
        stream = self._stream_of() if self._stream_of else 0
        for index in range(self._regions):
            self.brain.wait_layer(index, stream)

    def submit_saves(self, plan: bytes | None) -> None:
        """Once per step, after the forward: ordered after the work queued on the current
        CUDA stream (the KV writes), so it never copies a half-written block."""
        if self.brain is not None and plan and self.save_enabled:
            self.brain.submit_saves(plan, self._stream_of() if self._stream_of else 0)
            self._counts.mark()

    def get_finished(self, finished_req_ids: Iterable[str]) -> tuple[set[str], set[str], set[str]]:
        """(saves done, loads done, loads of those that failed). No call into the store while it
        said it is idle and nothing came since: no finished ids, no in-step loads, no plan that
        started loads (``_pending``)."""
        if self.brain is None:
            return set(), set(), set()
        finished = list(finished_req_ids or ())
        if not finished and not self.step_loads and not self._pending:
            return set(), set(), set()
        sending, recving, failed = self.brain.get_finished(finished)
        self._pending = not self.brain.idle
        self._counts.mark()
        self._errors_possible |= bool(failed)
        return sending, recving, failed

    def wait_reported(self, kind: str, req: str, timeout_s: float = 30.0) -> None:
        """Blocks until ``get_finished`` reports ``req``'s saves (``kind`` "S") or its load ("R"),
        for drivers without vLLM (GPU tests, benchmarks). A save is reported only once the
        request was passed as finished, so "S" passes it first, as vLLM does."""
        end = time.monotonic() + timeout_s
        finished = [req] if kind == "S" else []
        while True:
            sending, recving, _ = self.get_finished(finished)
            finished = []
            if req in (sending if kind == "S" else recving):
                return
            if time.monotonic() > end:
                raise TimeoutError(f"{kind} {req} not reported in {timeout_s} s")
            time.sleep(0.0002)

    def stats(self) -> dict[str, int]:
        """The store's counters of this worker since the last read (vLLM's connector stats); {}
        without a call into the JVM while nothing since the last read could have moved them
        (``CountersDue``: a decode step that loads and saves nothing)."""
        if self.brain is None or not self._counts.take():
            return {}
        return self.brain.stats()

    def load_errors(self) -> set[int]:
        """Block ids whose load failed since the last call (vLLM recomputes them)."""
        if self.brain is None or not self._errors_possible:
            return set()
        errors = self.brain.load_errors()
        self._errors_possible = False  # after the call: a call that failed is made again next step
        return errors

    def close(self) -> None:
        if self.brain is not None:
            brain, self.brain = self.brain, None
            brain.close()
