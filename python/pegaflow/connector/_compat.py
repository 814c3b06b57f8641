"""The connector API differences between the supported vLLM minors (0.30-0.33), in one place.

Each difference is a named entry of ``DIFFERENCES`` (the minor it appeared in and what the
connector does about it) and is checked by ``tests/test_vllm_compat.py`` against the installed
vLLM; ``make test-compat`` runs those checks under each minor. Everything else the connector
touches (the hooks of ``KVConnectorBase_V1``, ``SchedulerOutput``, ``KVConnectorOutput``,
``Request.block_hashes``, ``KVConnectorStats``) has the same shape in all four.
"""

from __future__ import annotations

from .._vllm_version import installed_vllm, vllm_minor

DIFFERENCES = {
    "cache_hit_source": ("0.32", "vLLM attributes external hits to a tier (CacheHitSource); the store is host memory, "
                                 "so the connector declares HOST. Before 0.32 there is no tier attribution."),
    "loaded_group_ids": ("0.32", "get_loaded_kv_cache_group_ids: the connector answers every KV-cache group (a load "
                                 "restores each group's blocks of the hit), so vLLM zeroes none of them; before 0.32 "
                                 "vLLM does not ask and zeroes nothing."),
}

# Hooks the connector defines that only some minors call: the difference they come with.
HOOKS = {"get_loaded_kv_cache_group_ids": "loaded_group_ids"}


def minor() -> tuple[int, int]:
    """The installed vLLM's (major, minor)."""
    installed = installed_vllm()
    if installed is None:
        raise ImportError("no vLLM installed")
    return vllm_minor(installed[1])


def has(difference: str) -> bool:
    """Whether the installed vLLM has ``difference`` (a key of ``DIFFERENCES``)."""
    since = DIFFERENCES[difference][0]
    return minor() >= tuple(int(p) for p in since.split("."))


def cache_hit_source():
    """The connector's ``_cache_hit_source`` (vLLM >= 0.32), or None where vLLM has no tiers."""
    if not has("cache_hit_source"):
        return None
    from vllm.v1.metrics.cache_hit_source import CacheHitSource

    return CacheHitSource.HOST
