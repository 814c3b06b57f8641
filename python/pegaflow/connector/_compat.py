"""The connector API differences between the supported vLLM minors (0.26-0.33), in one place.

Each difference is a named entry of ``DIFFERENCES``: the minors that have it (``since``, and
``until`` where a later minor dropped it) and what the connector does about it. It is checked
by ``tests/test_vllm_compat.py`` against the installed vLLM; ``make test-compat`` runs those
checks under each minor. Everything else the connector touches (the hooks of
``KVConnectorBase_V1``, ``SchedulerOutput``, ``KVConnectorOutput``, ``Request.block_hashes``,
``KVConnectorStats``) has the same shape in all of them.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

from .._vllm_version import installed_vllm, vllm_minor


@dataclass(frozen=True)
class Difference:
    since: str
    until: str | None  # the first minor without it; None: still there
    what: str


DIFFERENCES = {
    "cross_layer_registration": Difference("0.26", "0.29", (
        "vLLM asks the connector's prefer_cross_layer_blocks and, where the model's one attention backend "
        "indexes blocks by stride, allocates one tensor for all layers and hands it to "
        "register_cross_layers_kv_cache (register_kv_caches is then not called); get_required_kvcache_layout "
        "names NHD/HND only. The connector prefers the cross-layer blocks and registers the per-layer views "
        "of that tensor.")),
    "kv_cache_layouts": Difference("0.29", None, (
        "get_required_kvcache_layout may name a KVCacheLayout (BLNHC: every layer's slice of a block back "
        "to back); vLLM uses it where every attention backend of the model supports it and otherwise "
        "keeps its default with a warning.")),
    "reproducible_none_hash": Difference("0.29", None, (
        "Without PYTHONHASHSEED, the SHA-256 block hashes start from a fixed seed (vllm-none-hash), so "
        "processes agree; before 0.29 NONE_HASH is random per process (and still is for the xxhash "
        "algorithms). Where it is random the connector keys full blocks by its own chain over the token "
        "ids (vLLM's hash with the fixed seed, computed in Java), so processes share anyway.")),
    "transfer_results": Difference("0.30", None, (
        "get_transfer_results / KVConnectorTransferResults and KVConnectorOutput.failed_recving: a "
        "failed load can be reported by request. Before 0.30 vLLM calls get_finished and takes failed "
        "blocks of one KV-cache group only, so a hybrid model's failed load travels in the connector's "
        "own worker metadata and the scheduler side rewinds the request to its local prefix.")),
    "cache_hit_source": Difference("0.32", None, (
        "vLLM attributes external hits to a tier (CacheHitSource); the store is host memory, so the "
        "connector declares HOST. Before 0.32 there is no tier attribution.")),
    "loaded_group_ids": Difference("0.32", None, (
        "get_loaded_kv_cache_group_ids: the connector answers every KV-cache group (a load restores each "
        "group's blocks of the hit), so vLLM zeroes none of them; before 0.32 vLLM does not ask and zeroes "
        "nothing.")),
}

# Hooks the connector defines that only some minors call: the difference they come with.
HOOKS = {
    "get_loaded_kv_cache_group_ids": "loaded_group_ids",
    "get_transfer_results": "transfer_results",
    "register_cross_layers_kv_cache": "cross_layer_registration",
    "prefer_cross_layer_blocks": "cross_layer_registration",
}


def minor() -> tuple[int, int]:
    """The installed vLLM's (major, minor)."""
    installed = installed_vllm()
    if installed is None:
        raise ImportError("no vLLM installed")
    return vllm_minor(installed[1])


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def has(difference: str) -> bool:
    """Whether the installed vLLM has ``difference`` (a key of ``DIFFERENCES``)."""
    d = DIFFERENCES[difference]
    m = minor()
    return m >= _version(d.since) and (d.until is None or m < _version(d.until))


def cache_hit_source():
    """The connector's ``_cache_hit_source`` (vLLM >= 0.32), or None where vLLM has no tiers."""
    if not has("cache_hit_source"):
        return None
    from vllm.v1.metrics.cache_hit_source import CacheHitSource

    return CacheHitSource.HOST


@dataclass
class _TransferResults:
    """``KVConnectorTransferResults`` where vLLM (< 0.30) has none: the same fields."""

    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)


def transfer_results_class():
    """vLLM's ``KVConnectorTransferResults`` (>= 0.30), or a class with its fields."""
    if has("transfer_results"):
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults

        return KVConnectorTransferResults
    return _TransferResults


@functools.cache
def failed_loads_metadata_class():
    """The worker metadata that carries failed loads' request ids to the scheduler side where vLLM
    (< 0.30) has no ``failed_recving``: aggregated over the workers as vLLM aggregates them. One
    class per process, importable by name, so the scheduler's isinstance check matches what a
    worker sent and it pickles between vLLM's processes."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata

    @dataclass
    class PegaFailedLoads(KVConnectorWorkerMetadata):
        failed_recving: set[str] = field(default_factory=set)

        def aggregate(self, other):
            return PegaFailedLoads(self.failed_recving | set(getattr(other, "failed_recving", ()) or ()))

    PegaFailedLoads.__module__ = __name__
    PegaFailedLoads.__qualname__ = "PegaFailedLoads"
    globals()["PegaFailedLoads"] = PegaFailedLoads
    return PegaFailedLoads


def __getattr__(name: str):
    # unpickling in another process finds the class by name before anything asked for it
    if name == "PegaFailedLoads":
        return failed_loads_metadata_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def none_hash_seed() -> str:
    """The seed of the connector's own block chain: PYTHONHASHSEED where set (vLLM's hashes then
    agree across processes anyway), else vLLM's fixed SHA-256 seed."""
    return os.environ.get("PYTHONHASHSEED") or "vllm-none-hash"


def none_hash_is_reproducible(algo: str) -> bool:
    """Whether the NONE_HASH this process's vLLM drew is the one every process draws: compared with
    the hash of the seed where vLLM has initialised it (the engine core does so after building the
    scheduler, so ask at the first request), else decided by the minor's rule."""
    from vllm.v1.core import kv_cache_utils

    seed = os.environ.get("PYTHONHASHSEED")
    none_hash = getattr(kv_cache_utils, "NONE_HASH", None)
    if none_hash is not None:
        from vllm.utils.hashing import get_hash_fn_by_name

        expected = seed if seed is not None else ("vllm-none-hash" if has("reproducible_none_hash") else None)
        return expected is not None and bytes(none_hash) == bytes(get_hash_fn_by_name(algo)(expected))
    if seed is not None:
        return True
    return has("reproducible_none_hash") and algo in ("sha256", "sha256_cbor")
