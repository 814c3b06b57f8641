"""Hybrid models through PegaKVConnector (SupportsHMA) with the real vLLM scheduler (any supported
minor, 0.26-0.33) on CPU.

vLLM's hybrid KV cache manager with its own KV-cache group specs (``SlidingWindowSpec`` beside
``FullAttentionSpec``; ``MambaSpec`` in align mode beside it), its block pool shared by the
groups and its null block for what a group dropped; ``pegaflow.bench.sim`` replaces only the
forward: attention layers write a digest of the token prefix, the Mamba layer reads its state
from the block vLLM's runner reads it from and samples from the state it advances, so a wrong
state loaded changes the outputs, and every block a new request did not compute is checked
byte for byte (``verify``).
"""

from __future__ import annotations

import struct

import pytest

pytestmark = pytest.mark.integration

# vLLM's real scheduler on any supported minor (pegaflow.bench.sim branches where their internals differ)
from pegaflow._vllm_version import SUPPORTED_MINORS, SUPPORTED_VLLM, installed_vllm, vllm_minor  # noqa: E402

_installed = installed_vllm()
if _installed is None or vllm_minor(_installed[1]) not in SUPPORTED_MINORS:
    pytest.skip(f"needs a supported vLLM ({SUPPORTED_VLLM}; make setup installs 0.33.0), found "
                f"{'none' if _installed is None else ' '.join(_installed)}", allow_module_level=True)
import pegaflow.bench.sim as sim  # noqa: E402

import torch  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)

from pegaflow._server import start_server  # noqa: E402
from pegaflow.connector import _groups  # noqa: E402

EMBEDDED = {"mode": "embedded", "pool_size": "64mb"}
CHUNK = 64  # max_num_batched_tokens: a 200-token prompt is computed in steps ending at 64, 128, 192, 200
PAGE = 16 * 2 * 2 * 16 * 2  # an attention block: 16 tokens, K and V, 2 heads of 16, float16
STATE = 2 * (4 * 8 + 2 * 16)  # a Mamba block: its conv and SSM states, float16 (the rest of its page is padding)


def prompt(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 997 + 3 for i in range(n)]


@pytest.fixture
def engines(engines):
    """conftest's SimEngines, computing prompts in CHUNK-token steps and checking every byte."""

    def make(name, extra=None, **kw):
        kw.setdefault("max_num_batched_tokens", CHUNK)
        kw.setdefault("verify", True)
        return engines(name, EMBEDDED if extra is None else extra, **kw)

    return make


def baseline(hybrid: str, requests: dict[str, list[int]], max_tokens: int = 6, **kw) -> dict[str, list[int]]:
    e = sim.SimEngine("baseline", connector=False, hybrid=hybrid, max_num_batched_tokens=CHUNK, **kw)
    for rid, p in requests.items():
        e.add(rid, p, max_tokens)
    e.run()
    return e.outputs


def stats(e) -> dict:
    return e.ranks[0].connector._link.stats()


def run_one(e, rid: str, p: list[int], max_tokens: int = 6) -> None:
    e.add(rid, p, max_tokens)
    e.run()
    e.assert_drained()


# ------------------------------------------------------------------ sliding window + full attention


def test_sliding_window_warm_hit_loads_the_full_prefix_and_only_the_window(engines):
    p = prompt(1, 200)
    want = baseline("swa", {"r": p})["r"]
    a = engines("a", hybrid="swa", window=40)
    run_one(a, "r", p)
    assert a.outputs["r"] == want
    saved = stats(a)["pegaflow_save_blocks_total"]
    # 12 full blocks of the prompt and the 13th completed by decoding, in both groups
    assert saved == 2 * 12, saved
    b = engines("b", hybrid="swa", window=40)
    before = stats(b)["pegaflow_load_blocks_total"]
    run_one(b, "r", p)
    assert b.outputs["r"] == want
    assert b.stats.external_tokens == 192  # 12 blocks; the 200th token is computed
    # full attention: 12 blocks; the window of the 193rd token (tokens 153..192): blocks 9, 10, 11
    assert stats(b)["pegaflow_load_blocks_total"] - before == 12 + 3
    assert b.ranks[0].connector._worker.brain.stats()["loaded_bytes"] == (12 + 3) * PAGE
    assert b.stats.verified_blocks == 15 and b.stats.verify_failures == 0, b.mismatches
    assert stats(b)["pegaflow_active_leases"] == 0


def test_sliding_window_partial_hit_and_a_window_wider_than_the_prefix(engines):
    shared = prompt(2, 180)
    q = shared + prompt(3, 50)
    want = baseline("swa", {"q": q}, window=100)["q"]
    a = engines("a", hybrid="swa", window=100)
    run_one(a, "r", shared + prompt(4, 30))
    b = engines("b", hybrid="swa", window=100)
    run_one(b, "q", q)
    assert b.outputs["q"] == want
    assert b.stats.external_tokens == 176  # the 11 full blocks both prompts share
    assert b.stats.verify_failures == 0 and b.stats.verified_blocks == 11 + 7, b.mismatches


def test_sliding_window_blocks_vllm_dropped_are_never_saved(engines):
    """A request whose prefix vLLM served from its own cache holds the null block outside the
    window: its saves skip it (the store never gets the null block's bytes under a hash)."""
    p = prompt(5, 200)
    a = engines("a", hybrid="swa", window=40)
    run_one(a, "r1", p)
    saved = stats(a)["pegaflow_save_blocks_total"]
    run_one(a, "r2", p + prompt(6, 40))  # vLLM's own prefix hit, then 2 new blocks in each group
    assert a.stats.verify_failures == 0, a.mismatches
    c = engines("c", hybrid="swa", window=40)
    run_one(c, "r3", p + prompt(6, 40))
    assert c.outputs["r3"] == a.outputs["r2"] == baseline("swa", {"r": p + prompt(6, 40)}, window=40)["r"]
    assert c.stats.verify_failures == 0, c.mismatches
    assert stats(a)["pegaflow_save_blocks_total"] >= saved


def test_each_group_is_its_own_instance_on_a_shared_server(engines, tmp_path):
    """Server mode: every group of both vLLM instances is an instance of pegaflow-server (its
    own namespace and slot geometry), and the second vLLM instance's hit loads both groups."""
    server = start_server(tmp_path / "pool", pool_size="64mb")
    try:
        extra = {"mode": "server", "endpoint": server.endpoint}
        p = prompt(11, 200)
        want = baseline("swa", {"r": p})["r"]
        a = engines("a", extra, hybrid="swa", window=40)
        run_one(a, "r", p)
        b = engines("b", extra, hybrid="swa", window=40)
        run_one(b, "r", p)
        assert sorted(server.instances()) == ["a", "a/g1", "b", "b/g1"]
        assert a.outputs["r"] == b.outputs["r"] == want
        assert b.stats.external_tokens == 192 and b.stats.verify_failures == 0, b.mismatches
    finally:
        server.stop()


# ------------------------------------------------------------------ Mamba (align) + full attention


def test_recurrent_warm_hit_loads_only_the_final_state(engines):
    p = prompt(7, 200)
    want = baseline("mamba", {"r": p})["r"]
    a = engines("a", hybrid="mamba")
    run_one(a, "r", p)
    assert a.outputs["r"] == want
    b = engines("b", hybrid="mamba")
    before = stats(b)["pegaflow_load_blocks_total"]
    run_one(b, "r", p)
    assert b.outputs["r"] == want
    assert b.stats.external_tokens == 192  # the state after 192 tokens (a step ended there)
    assert stats(b)["pegaflow_load_blocks_total"] - before == 12 + 1  # 12 attention blocks, 1 state
    # each group's own slot geometry: a state block is what vLLM registers for it, its conv and SSM
    # states (0.29+: a [B, 1, 1, state] view; 0.26: the state tensors), not an attention page;
    # 0.27-0.28 register the layer as its whole padded page ([B, 1, 1, page] int8), which is stored
    mixer = b.ranks[0].caches["model.layers.1.mixer"]
    registered = sum(t[0].numel() * t.element_size() for t in (mixer if isinstance(mixer, (list, tuple)) else [mixer]))
    assert registered == (PAGE if not isinstance(mixer, (list, tuple)) and tuple(mixer.shape[1:]) == (1, 1, PAGE)
                          else STATE), f"vLLM {sim._compat.minor()}: {registered} B per state block"
    assert b.ranks[0].connector._worker.brain.stats()["loaded_bytes"] == 12 * PAGE + registered
    assert b.stats.verify_failures == 0, b.mismatches


def test_recurrent_hit_shrinks_to_the_rightmost_state_and_the_attention_prefix_is_re_leased(engines):
    """The prefixes share 11 blocks, but the states stored are those after 64, 128 and 192
    tokens: the hit is 128 tokens, the attention lease shrinks to exactly 8 blocks."""
    shared = prompt(8, 180)
    q = shared + prompt(9, 40)
    want = baseline("mamba", {"q": q})["q"]
    a = engines("a", hybrid="mamba")
    run_one(a, "r", shared + prompt(10, 20))
    b = engines("b", hybrid="mamba")
    before = stats(b)["pegaflow_load_blocks_total"]
    run_one(b, "q", q)
    assert b.outputs["q"] == want
    assert b.stats.external_tokens == 128
    assert stats(b)["pegaflow_load_blocks_total"] - before == 8 + 1
    assert stats(b)["pegaflow_active_leases"] == 0, "the longer attention lease was released"
    assert b.stats.verify_failures == 0, b.mismatches


@pytest.mark.parametrize("hybrid", ["swa", "mamba"])
def test_preemption_keeps_hybrid_outputs_exact(engines, hybrid):
    # 20 GPU blocks for three requests that each grow to 100 tokens: 7 full-attention blocks
    # and the window's or the states' blocks each, so vLLM must preempt
    reqs = {f"r{i}": prompt(20 + i, 70) for i in range(3)}
    want = baseline(hybrid, reqs, max_tokens=30, num_blocks=20, max_num_seqs=3)
    a = engines("a", hybrid=hybrid, num_blocks=20, max_num_seqs=3)
    for rid, p in reqs.items():
        a.add(rid, p, 30)
    a.run()
    a.assert_drained()
    assert a.stats.preemptions > 0, "the pool is small enough to preempt"
    assert a.outputs == want
    b = engines("b", hybrid=hybrid, num_blocks=20, max_num_seqs=3)
    for rid, p in reqs.items():
        b.add(rid, p, 30)
    b.run()
    b.assert_drained()
    assert b.outputs == want
    assert b.stats.external_tokens > 0 and b.stats.verify_failures == 0, b.mismatches


def _zero_group_lease(plan: bytes, group: int) -> bytes:
    """The plan with the lease of its first load of ``group`` zeroed (a lease no store issued)."""
    version, n_loads, _, _ = struct.unpack_from(">iiii", plan, 0)
    at = 16
    for _ in range(n_loads):
        (n,) = struct.unpack_from(">H", plan, at)
        at += 2 + n
        (g,) = struct.unpack_from(">i", plan, at)
        at += 4 + (1 if version >= 4 else 0)  # StepPlan v4: the load's in-step flag after its group
        if g == group:
            return plan[:at] + bytes(16) + plan[at + 16:]
        at += 16
        (ids,) = struct.unpack_from(">i", plan, at)
        at += 4 + 8 * ids
    raise AssertionError(f"no load of group {group} in the plan")


@pytest.mark.parametrize("hybrid", ["swa", "mamba"])
def test_a_failed_load_of_one_group_is_recomputed_not_a_crash(engines, hybrid):
    p = prompt(30, 200)
    a = engines("a", hybrid=hybrid)
    run_one(a, "r1", p)
    assert a.scheduler.reset_prefix_cache()
    a.add("r2", p, 6)

    def break_group_1(so):
        so.kv_connector_metadata.plan = _zero_group_lease(so.kv_connector_metadata.plan, 1)

    a.at_first_load(break_group_1)
    a.run()
    a.assert_drained()
    # by request: vLLM cannot map block ids of several groups back to requests (it raises on them);
    # 0.30+ in failed_recving, before in the connector's worker metadata (build_connector_worker_meta)
    assert a.stats.failed_loads == 1 and a.stats.invalid_blocks == 0
    assert (a.ranks[0].connector._failed_meta is None) == sim.TRANSFER_RESULTS
    assert a.outputs["r2"] == a.outputs["r1"], "recomputed to the same result"
    assert a.stats.verify_failures == 0, a.mismatches
    assert a.scheduler.reset_prefix_cache()
    loaded = a.stats.loaded_requests
    a.add("r3", p, 6)  # the failed request is gone; a new one loads again
    a.run()
    assert a.outputs["r3"] == a.outputs["r1"] and a.stats.loaded_requests == loaded + 1
    assert a.stats.verify_failures == 0, a.mismatches


# ------------------------------------------------------------------ what is refused, with the reason


def _config(*specs):
    e = sim.SimEngine("cfg", connector=False)
    groups = [KVCacheGroupSpec([f"model.layers.{i}.x"], s) for i, s in enumerate(specs)]
    return sim.get_kv_cache_config_from_groups(e.vllm_config, groups, available_memory=64 * specs[0].page_size_bytes)


def test_group_plan_names_each_group_and_refuses_what_is_not_supported_with_the_reason():
    full = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=16, dtype=torch.float16)
    swa = SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=16, dtype=torch.float16, sliding_window=40)
    plan = _groups.plan(_config(full, swa), 16, "vllm")
    assert [(p.group.instance_id, p.group.kind, p.group.window) for p in plan] == [
        ("vllm", _groups.FULL, 0), ("vllm/g1", _groups.SLIDING, 40)]

    def mamba(mode):
        return MambaSpec(block_size=16, shapes=((4, 8),), dtypes=(torch.float16,), mamba_cache_mode=mode,
                         page_size_padded=full.page_size_bytes)

    assert _groups.plan(_config(full, mamba("align")), 16, "vllm")[1].group.kind == _groups.RECURRENT
    with pytest.raises(ValueError, match="mamba_cache_mode 'none'.*expected mamba_cache_mode 'align'"):
        _groups.plan(_config(full, mamba("none")), 16, "vllm")
    chunked = ChunkedLocalAttentionSpec(block_size=16, num_kv_heads=2, head_size=16, dtype=torch.float16,
                                        attention_chunk_size=64)
    with pytest.raises(ValueError, match="ChunkedLocalAttentionSpec is not supported"):
        _groups.plan(_config(full, chunked), 16, "vllm")
    with pytest.raises(ValueError, match="block size 16 where the scheduler hashes blocks of 32"):
        _groups.plan(_config(full, swa), 32, "vllm")
