"""The version adapter (``pegaflow.connector._compat``) against the installed vLLM: each named
difference is present exactly from the minor it names, and the connector follows it. Run under
every supported minor by ``make test-compat``; imports vLLM (e2e tier)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.e2e]


@pytest.fixture(scope="module")
def base():
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    return KVConnectorBase_V1


def test_the_installed_minor_is_supported():
    from pegaflow._vllm_version import SUPPORTED_MINORS
    from pegaflow.connector import _compat

    assert _compat.minor() in SUPPORTED_MINORS


def test_cache_hit_source_follows_the_installed_api(base):
    from pegaflow.connector import PegaKVConnector, _compat

    present = hasattr(base, "get_external_cache_hit_sources")
    assert _compat.has("cache_hit_source") == present
    if present:
        from vllm.v1.metrics.cache_hit_source import CacheHitSource

        assert PegaKVConnector._cache_hit_source == CacheHitSource.HOST
    else:
        assert "_cache_hit_source" not in vars(PegaKVConnector)


def test_loaded_group_ids_follows_the_installed_api(base):
    from pegaflow.connector import _compat

    assert _compat.has("loaded_group_ids") == hasattr(base, "get_loaded_kv_cache_group_ids")


def test_every_hook_the_connector_overrides_exists_in_the_installed_base(base):
    """A hook renamed or removed in some minor would silently never be called. The hooks are
    those of vLLM's classes the connector derives from (the base and SupportsHMA), less the
    ones a later minor brings (``_compat.HOOKS``)."""
    from pegaflow.connector import PegaKVConnector, _compat

    ours = {name for name, value in vars(PegaKVConnector).items() if callable(value) or isinstance(value, classmethod)}
    ours -= {"__init__", "_plan", "_schedule"}
    ours -= {hook for hook, difference in _compat.HOOKS.items() if not _compat.has(difference)}
    theirs = [c for c in PegaKVConnector.__mro__[1:] if c.__module__.startswith("vllm.")]
    assert base in theirs
    missing = sorted(name for name in ours if not any(hasattr(c, name) for c in theirs))
    assert not missing, f"hooks vLLM {__import__('vllm').__version__} does not have: {missing}"


def test_stats_hooks_build_the_connectors_classes():
    from pegaflow.connector import PegaKVConnector
    from pegaflow.connector._stats import PegaConnectorStats

    stats = PegaKVConnector.build_kv_connector_stats({"hit_tokens": 64, "lookups": 2, "hit_requests": 1})
    assert isinstance(stats, PegaConnectorStats) and not stats.is_empty()
    stats.aggregate(PegaConnectorStats(data={"hit_tokens": 32, "loaded_bytes": 10}))
    assert stats.reduce() == {"lookups": 2, "hit_requests": 1, "hit_tokens": 96, "loaded_bytes": 10, "hit_rate": 0.5}
    stats.reset()
    assert stats.is_empty()
