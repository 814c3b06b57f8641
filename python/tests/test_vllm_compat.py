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
    ours -= {"__init__", "_plan"}  # our own helpers, not hooks
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


# What makes each difference present in the installed vLLM, probed on vLLM itself (not on the
# version number): every entry of _compat.DIFFERENCES has one, and it must agree with has().
def _probe_cross_layer_registration(base) -> bool:
    present = hasattr(base, "prefer_cross_layer_blocks")
    assert present == hasattr(base, "register_cross_layers_kv_cache"), "the preference comes with its registration"
    return present


def _probe_kv_cache_layouts(base) -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm.v1.kv_cache_layout") is not None


def _probe_reproducible_none_hash(base) -> bool:
    from vllm.v1.core import kv_cache_utils

    return hasattr(kv_cache_utils, "resolve_none_hash_seed") or hasattr(kv_cache_utils, "DEFAULT_NONE_HASH_SEED")


def _probe_transfer_results(base) -> bool:
    import dataclasses

    import vllm.distributed.kv_transfer.kv_connector.v1.base as base_module
    from vllm.v1.outputs import KVConnectorOutput

    present = hasattr(base, "get_transfer_results")
    assert present == hasattr(base_module, "KVConnectorTransferResults")
    assert present == ("failed_recving" in {f.name for f in dataclasses.fields(KVConnectorOutput)})
    return present


def _probe_cache_hit_source(base) -> bool:
    return hasattr(base, "get_external_cache_hit_sources")


def _probe_loaded_group_ids(base) -> bool:
    return hasattr(base, "get_loaded_kv_cache_group_ids")


PROBES = {
    "cross_layer_registration": _probe_cross_layer_registration,
    "kv_cache_layouts": _probe_kv_cache_layouts,
    "reproducible_none_hash": _probe_reproducible_none_hash,
    "transfer_results": _probe_transfer_results,
    "cache_hit_source": _probe_cache_hit_source,
    "loaded_group_ids": _probe_loaded_group_ids,
}


def test_every_difference_has_a_probe():
    from pegaflow.connector import _compat

    assert set(PROBES) == set(_compat.DIFFERENCES), "a difference without a probe here is never checked"


@pytest.mark.parametrize("difference", sorted(PROBES))
def test_each_difference_is_present_exactly_in_the_minors_it_names(base, difference):
    import vllm

    from pegaflow.connector import _compat

    d = _compat.DIFFERENCES[difference]
    assert PROBES[difference](base) == _compat.has(difference), (
        f"vLLM {vllm.__version__}: '{difference}' is {'' if _compat.has(difference) else 'not '}expected "
        f"(since {d.since}, until {d.until}) but the probe finds it {'' if PROBES[difference](base) else 'absent'}")


def test_the_connector_asks_for_cross_layer_blocks_the_way_the_installed_minor_asks():
    """0.29+: a KVCacheLayout name through get_required_kvcache_layout (none on the CPU platform,
    whose backend takes LBHNC only), and prefer_cross_layer_blocks, which vLLM no longer asks, is
    False. 0.26-0.28: no layout name (vLLM knows NHD/HND only); the preference is asked instead
    (answered in the scheduler tier, tests/test_connector.py, on vLLM's allocation)."""
    from types import SimpleNamespace

    from vllm.config import KVTransferConfig

    from pegaflow.connector import PegaKVConnector, _compat, _layout
    from pegaflow.connector.settings import Settings

    cfg = SimpleNamespace(model_config=SimpleNamespace(use_mla=False),
                          kv_transfer_config=KVTransferConfig(kv_connector="PegaKVConnector", kv_role="kv_both"))
    want = _layout.required_layout(cfg, True) if _compat.has("kv_cache_layouts") else None
    assert PegaKVConnector.get_required_kvcache_layout(cfg) == want
    if not _compat.has("cross_layer_registration"):
        me = SimpleNamespace(_vllm_config=cfg, _settings=Settings.from_extra({}))
        assert PegaKVConnector.prefer_cross_layer_blocks.fget(me) is False


def test_transfer_results_are_vllms_class_where_it_has_one():
    import vllm.distributed.kv_transfer.kv_connector.v1.base as base_module

    from pegaflow.connector import _compat, _vllm

    if _compat.has("transfer_results"):
        assert _vllm.TransferResults is base_module.KVConnectorTransferResults
    else:
        assert _vllm.TransferResults is _compat._TransferResults
    r = _vllm.TransferResults()
    assert (r.finished_sending, r.finished_recving, r.failed_recving) == (set(), set(), set())


def test_the_failed_loads_worker_metadata_crosses_a_process_and_aggregates():
    """Before 0.30 a hybrid model's failed loads reach the scheduler side in the connector's worker
    metadata (build_connector_worker_meta): vLLM pickles each worker's output to the engine core,
    KVOutputAggregator aggregates the workers' metadata, and the scheduler-side connector (another
    instance, in another process) must recognise it."""
    import pickle

    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata

    from pegaflow.connector import _compat

    if _compat.has("transfer_results"):
        minor = ".".join(map(str, _compat.minor()))
        pytest.skip(f"vLLM {minor} reports failed loads by request in failed_recving (0.30+): the connector sends no "
                    "worker metadata of its own (tests/test_hybrid.py asserts the channel)")
    cls = _compat.failed_loads_metadata_class()
    assert issubclass(cls, KVConnectorWorkerMetadata)
    assert _compat.failed_loads_metadata_class() is cls, "every connector instance must use one class"
    meta = pickle.loads(pickle.dumps(cls(failed_recving={"r1"})))
    assert isinstance(meta, cls) and meta.failed_recving == {"r1"}
    assert meta.aggregate(cls(failed_recving={"r2"})).failed_recving == {"r1", "r2"}


def test_none_hash_reproducibility_follows_the_installed_minor(monkeypatch):
    """Without PYTHONHASHSEED: 0.29+ derive NONE_HASH from a fixed seed for the SHA-256
    algorithms (processes agree), 0.26-0.28 draw it at random; with it, every minor agrees."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils

    from pegaflow.connector import _compat

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    kv_cache_utils.init_none_hash(sha256)
    first = bytes(kv_cache_utils.NONE_HASH)
    kv_cache_utils.init_none_hash(sha256)
    assert (bytes(kv_cache_utils.NONE_HASH) == first) == _compat.has("reproducible_none_hash")
    assert _compat.none_hash_is_reproducible("sha256") == _compat.has("reproducible_none_hash")
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    kv_cache_utils.init_none_hash(sha256)
    assert bytes(kv_cache_utils.NONE_HASH) == bytes(sha256("7")) and _compat.none_hash_is_reproducible("sha256")


class _EventsLink:
    """The store side of ``link_kv_events`` as text, for the feed's conversion alone (the store's
    own reads are tested in BlockStoreContract and test_e2e's publisher case)."""

    def __init__(self, pages):
        self.pages = list(pages)
        self.asked = []

    def kv_events(self, instance_id, after, max_events, size_hint):
        self.asked.append((instance_id, after))
        page = self.pages.pop(0)
        if isinstance(page, Exception):
            raise page
        return page


def test_the_event_feed_builds_this_minors_kv_events():
    """BlockStored per stored block, removals of one tier coalesced, the tier as the medium, the
    group's index where this minor's events carry one; a gap counted; a store that does not answer
    gives no events, and the next read resumes where the last one ended."""
    from vllm.distributed.kv_events import BlockRemoved, BlockStored

    from pegaflow.connector import _events
    from pegaflow.errors import ServerUnavailableError

    k = [bytes([i]) * 32 for i in range(4)]
    link = _EventsLink([f"next=4 gap=0\nS CPU {k[0].hex()}\nS SSD {k[0].hex()}\nR CPU {k[1].hex()}\nR CPU {k[2].hex()}\n",
                        ServerUnavailableError("no store bound"),
                        f"next=9 gap=1\nR SSD {k[3].hex()}\n"])
    now = [0.0]
    feed = _events.EventFeed(link, [(1, "inst-g1")], interval_s=0.1, clock=lambda: now[0])
    first = feed.take()
    assert [type(e) for e in first] == [BlockStored, BlockStored, BlockRemoved]
    assert [e.medium for e in first] == ["CPU", "SSD", "CPU"]
    assert first[2].block_hashes == [_events._hash_converter()(k[1]), _events._hash_converter()(k[2])]
    assert first[0].token_ids == [] and first[0].parent_block_hash is None
    if "group_idx" in BlockStored.__struct_fields__:
        assert {e.group_idx for e in first} == {1}
    assert feed.take() == []  # within the interval: no read
    now[0] = 0.2
    assert feed.take() == []  # the store did not answer
    now[0] = 0.4
    last = feed.take()
    assert [(type(e), e.medium) for e in last] == [(BlockRemoved, "SSD")]
    assert feed.gaps == 1 and feed.published == 4
    assert link.asked == [("inst-g1", 0), ("inst-g1", 4), ("inst-g1", 4)]
