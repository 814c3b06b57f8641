"""PegaKVConnector against the real vLLM package (any supported minor, 0.26-0.33), on CPU.

Every scenario runs vLLM's own Scheduler, Request, block hasher, KV-cache allocation and
output aggregation (``pegaflow.bench.sim``); only the model's forward is a deterministic
writer, so "loaded bytes equal computed bytes" and "outputs equal the cold run's" are exact
checks. Each test ends with vLLM drained: no request left and every GPU block free.

Why one file past 600 lines: every scenario drives the same simulated engines and checks;
the scenarios read as the connector's specification in one place.

Size: one scenario per connector rule against vLLM's real scheduler, sharing the fixtures of this file.
"""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration

# vLLM's real scheduler on any supported minor (pegaflow.bench.sim branches where their internals differ)
from pegaflow._vllm_version import SUPPORTED_MINORS, SUPPORTED_VLLM, installed_vllm, vllm_minor  # noqa: E402

_installed = installed_vllm()
if _installed is None or vllm_minor(_installed[1]) not in SUPPORTED_MINORS:
    pytest.skip(f"needs a supported vLLM ({SUPPORTED_VLLM}; make setup installs 0.33.0), found "
                f"{'none' if _installed is None else ' '.join(_installed)}", allow_module_level=True)
import pegaflow.bench.sim as sim  # noqa: E402

from pegaflow.connector import PegaConnectorMetadata, PegaKVConnector, _compat, _layout  # noqa: E402
from pegaflow.errors import InvalidArgumentError  # noqa: E402
from pegaflow._server import free_port, start_server  # noqa: E402
from bridge_helpers import wait_until  # noqa: E402

SimEngine = sim.SimEngine
EMBEDDED = {"mode": "embedded", "pool_size": "64mb"}


def prompt(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 997 + 3 for i in range(n)]



def store_stats(engine: SimEngine) -> dict:
    return engine.ranks[0].connector._link.stats()


def baseline(p: list[int], max_tokens: int, **kw) -> tuple[list[int], int]:
    """Outputs and computed tokens of the same request without any connector."""
    e = SimEngine("baseline", connector=False, **kw)
    e.add("r", p, max_tokens)
    e.run()
    return e.outputs["r"], e.stats.scheduled_tokens


# ---------------------------------------------------------------------------- embedded mode


def load_async(engine: SimEngine) -> bool:
    """The connector's load_kv_async answer for a hit: False where the load runs inside the step
    that computes the tail (setting load_in_step, default on, one KV-cache group), True where the
    request waits for it in WAITING_FOR_REMOTE_KVS."""
    return not engine.scheduler.connector._scheduler.brain.in_step


@pytest.mark.parametrize("in_step", [True, False, "at_alloc"], ids=["in_step", "async", "in_step_at_alloc"])
def test_cold_then_warm_loads_exactly_the_saved_bytes_and_lookups_have_no_side_effects(engines, in_step):
    """at_alloc: the in-step load starts where vLLM allocates the blocks (load_at_alloc; the sim's
    worker shares the scheduler's process, as vLLM's engine core with its worker in-process)."""
    at_alloc = in_step == "at_alloc"
    in_step = bool(in_step)
    extra = {**EMBEDDED, "load_in_step": in_step, "load_at_alloc": at_alloc}
    p = prompt(1, 70)
    a = engines("a", extra)
    a.add("r", p, max_tokens=3)
    a.run()
    a.assert_drained()
    assert a.stats.scheduled_tokens == 70 + 2  # all computed: a cold store

    b = engines("b", extra)
    req = b.add("r", p, max_tokens=3)
    conn = b.scheduler.connector
    assert load_async(b) == (not in_step)
    leases = store_stats(b)["pegaflow_leases_created_total"]
    answers = {conn.get_num_new_matched_tokens(req, 0) for _ in range(3)}
    assert answers == {(64, not in_step)}  # 4 full blocks; the 70th token is always computed
    held = store_stats(b)
    assert held["pegaflow_leases_created_total"] - leases == 1, "repeated lookups pin one lease, not three"
    # the sim's worker shares the scheduler's process: the lookup also began its load (the
    # lease's only share), so the blocks are pinned by that load, and no lease is left
    assert (held["pegaflow_active_leases"], held["pegaflow_pinned_blocks"]) == (0, 4)
    metas = []
    build = conn.build_connector_meta
    conn.build_connector_meta = lambda out: metas.append(build(out)) or metas[-1]
    reports = []  # the scheduler side's stats as vLLM's scheduler takes them each step
    report = conn.get_kv_connector_stats
    conn.get_kv_connector_stats = lambda: reports.append(report()) or reports[-1]
    b.run()
    b.assert_drained()
    assert b.outputs["r"] == a.outputs["r"]
    assert b.stats.loaded_requests == 1
    assert b.stats.scheduled_tokens == 70 - 64 + 2
    a_table, b_table = a.ranks[0].history["r"], b.ranks[0].history["r"]
    for i in range(4):  # loaded into b's own blocks: the bytes a computed, and what computing writes
        assert b.block_bytes(0, b_table[i]) == a.block_bytes(0, a_table[i])
        assert b.block_matches(0, b_table[i], p, i)
    stats = store_stats(b)
    assert stats["pegaflow_active_leases"] == 0
    assert stats["pegaflow_load_blocks_total"] == 4, "one load: the step took up the allocation's"
    worker = b.ranks[0].connector._worker.brain.stats()
    assert worker["in_step_at_alloc"] == (1 if at_alloc else 0)
    assert [m.loads for m in metas].count(True) == 1, "one step's plan says it loads (the worker then orders it)"
    assert worker["in_step_loads"] == (1 if in_step else 0)
    # the plan phase's parts through the C ABI: the pieces listed, the batch handed to the engine
    assert (worker["in_step_build_ns"] > 0 and worker["in_step_submit_ns"] > 0) == bool(in_step)
    assert worker["in_step_hop_ns"] + worker["in_step_store_ns"] + worker["in_step_build_ns"] \
        + worker["in_step_submit_ns"] <= worker["in_step_plan_ns"]
    # until the copy engine began the load's first copy: inside the load's time
    assert (worker["in_step_first_copy_ns"] > 0) == bool(in_step)
    assert worker["in_step_first_copy_ns"] <= worker["in_step_load_ns"]
    # each side's per-step hooks: one step per plan, and the time spent in them (vllm:pegaflow_*_hook_ns)
    conn.get_kv_connector_stats()
    sched_steps = sum(r.data["scheduler_steps"] for r in reports if r is not None)
    worker_side = b.ranks[0].connector.get_kv_connector_stats().data  # the sim leaves the worker's to the test
    assert sched_steps == worker_side["worker_steps"] == len(metas)
    assert all(r.data["scheduler_hook_ns"] > 0 for r in reports if r is not None) and worker_side["worker_hook_ns"] > 0
    assert "in_step_whole_waits" not in worker_side, "an eager forward waits layer by layer in its hooks"
    # the hit timed from vLLM's QUEUED event (the sim's scheduler keeps stats): its lookup, then
    # its allocation, on the clock the TTFT benchmark sets the load's end and first token beside
    timed = {k: sum(r.data.get(k, 0) for r in reports if r is not None)
             for k in ("hits_timed", "queued_to_lookup_ns", "queued_to_alloc_ns")}
    assert timed["hits_timed"] == 1, timed
    assert 0 < timed["queued_to_lookup_ns"] <= timed["queued_to_alloc_ns"], timed


@pytest.mark.parametrize("at_alloc", [False, True], ids=["in_step", "in_step_at_alloc"])
def test_a_full_cuda_graph_step_reads_its_in_step_load_only_after_every_layer_landed(engines, at_alloc):
    """A FULL CUDA graph's replay (a decode-shaped batch: a warm request whose tail is one token)
    calls no wait_for_layer_load, and vLLM's V2 runner starts its loads outside the forward's
    context: start_load_kv then has the stream (here, the host engine: this thread) wait for
    every layer, so the blocks hold the saved bytes when the replay starts reading them. vLLM
    keeps its FULL graphs for decode (requires_piecewise_for_cudagraph false)."""
    extra = {**EMBEDDED, "load_in_step": True, "load_at_alloc": at_alloc}
    assert PegaKVConnector.requires_piecewise_for_cudagraph(extra) is False
    p = prompt(4, 1 + 16 * 24)  # a tail of one token
    a = engines("a", extra)
    a.add("r", p, max_tokens=2)
    a.run()
    b = engines("b", extra, verify=True, full_graph=True)
    b.add("r", p, max_tokens=2)
    b.run()
    b.assert_drained()
    assert b.stats.loaded_requests == 1 and b.stats.scheduled_tokens == 1 + 1
    assert b.stats.verified_blocks == 24 and b.stats.verify_failures == 0, b.mismatches
    assert b.outputs["r"] == a.outputs["r"]
    worker_side = b.ranks[0].connector.get_kv_connector_stats().data
    assert worker_side["in_step_whole_waits"] == 1


def test_decode_steps_ask_the_store_nothing_once_it_said_it_is_idle(engines):
    """Through the C ABI: worker_get_finished ends its answer with "I -" once nothing is left to
    report (no load in flight, no finished request's saves pending), and the worker's decode steps
    then make no get_finished call until vLLM finishes the request; the answer and the saves are
    the same as ever, and the scheduler side plans no empty step in the JVM either."""
    p = prompt(9, 40)
    e = engines("idle")
    worker, sched = e.ranks[0].connector._worker.brain, e.scheduler.connector._scheduler.brain
    asked, planned = [], []
    get_finished, build_plan = worker.get_finished, sched._api.call
    worker.get_finished = lambda ids: asked.append(list(ids)) or get_finished(ids)
    sched._api.call = lambda name, *a: (planned.append(name) if name == "sched_build_plan" else None) or build_plan(name, *a)
    e.add("r", p, max_tokens=24)
    e.run()
    e.assert_drained()
    assert e.outputs["r"] == baseline(p, 24)[0]
    steps = e.ranks[0].connector.get_kv_connector_stats().data["worker_steps"]
    assert worker.idle, "the last answer said nothing is left"
    assert ["r"] in asked, "the step that finished the request asked (its saves were pending)"
    assert 0 < len(asked) < steps / 2, f"{len(asked)} get_finished calls in {steps} steps"
    assert 0 < len(planned) < steps / 2, f"{len(planned)} plans built in the JVM in {steps} steps"
    # the saves landed: every full block of the prompt and the 23 tokens computed after it
    assert store_stats(e)["pegaflow_cache_resident_blocks"] == (40 + 24 - 1) // 16


def test_kv_transfer_params_turn_a_requests_saves_and_loads_off_or_cap_them(engines, caplog):
    """kv_transfer_params {"pegaflow": {...}}: save false stores nothing, save_max_tokens stores
    only the blocks before the cap, load false computes a stored prefix; bad values are logged
    naming the key and the value, and the defaults stand."""
    p = prompt(31, 70)  # 4 full blocks of 16
    a = engines("a")
    a.add("private", p, max_tokens=2, kv_transfer_params={"pegaflow": {"save": False}, "other_connector": 1})
    a.run()
    a.assert_drained()
    probe = engines("probe")
    assert probe.scheduler.connector.get_num_new_matched_tokens(probe.add("q1", p, max_tokens=1), 0) == (0, False)

    b = engines("b")
    b.add("capped", p, max_tokens=2, kv_transfer_params={"pegaflow": {"save_max_tokens": 40}})
    b.run()
    b.assert_drained()
    assert store_stats(b)["pegaflow_save_blocks_total"] == 2  # 40 tokens: two full blocks

    c = engines("c")
    req = c.add("fresh", p, max_tokens=2, kv_transfer_params={"pegaflow": {"load": False}})
    assert c.scheduler.connector.get_num_new_matched_tokens(req, 0) == (0, False)
    c.run()
    c.assert_drained()
    assert c.stats.scheduled_tokens == 70 + 1  # computed all of it though 32 tokens were stored
    assert c.outputs["fresh"] == baseline(p, 2)[0]

    d = engines("d")
    with caplog.at_level("WARNING", logger="pegaflow.connector"):
        req = d.add("odd", p, max_tokens=2, kv_transfer_params={"pegaflow": {"load": "no", "colour": "red"}})
        # all 4 blocks: c, which loaded nothing, still saved what it computed
        assert d.scheduler.connector.get_num_new_matched_tokens(req, 0) == (64, load_async(d))
    assert "kv_transfer_params['pegaflow']['load'] is 'no'; expected true or false" in caplog.text
    assert "unknown key 'colour'" in caplog.text
    d.run()
    d.assert_drained()
    assert d.outputs["odd"] == baseline(p, 2)[0]


@pytest.mark.parametrize("retention", ["low", "normal"])
def test_retention_low_makes_a_requests_blocks_go_first_under_pressure(engines, retention):
    """kv_transfer_params {"pegaflow": {"retention": "low"}}: the one-off request's blocks are
    evicted before an older prefix; with "normal" the pool's own order (LRU) takes the older one."""
    pool = {"mode": "embedded", "pool_size": "64kb"}  # 16 blocks of 4 KiB
    a = engines("a", pool)
    hot, oneoff = prompt(40, 65), prompt(41, 65)  # 4 full blocks each
    a.add("hot", hot, max_tokens=1)
    a.run()
    a.add("oneoff", oneoff, max_tokens=1, kv_transfer_params={"pegaflow": {"retention": retention}})
    a.run()
    for i in range(3):  # 12 more blocks: the pool (16) is full after two, the third evicts 4
        a.add(f"fill{i}", prompt(42 + i, 65), max_tokens=1)
        a.run()
    a.assert_drained()
    assert store_stats(a)["pegaflow_cache_block_evictions_total"] == 4
    probe = engines("probe", pool)
    conn = probe.scheduler.connector
    kept = {name: conn.get_num_new_matched_tokens(probe.add(name, p, max_tokens=1), 0)[0]
            for name, p in (("hot", hot), ("oneoff", oneoff))}
    assert kept == ({"hot": 64, "oneoff": 0} if retention == "low" else {"hot": 0, "oneoff": 64}), kept


def test_prefix_extension_hits_the_stored_prefix_then_extends_it(engines):
    p = prompt(2, 40)
    a = engines("a")
    a.add("r1", p, max_tokens=2)
    a.run()
    longer = p + prompt(3, 30)
    b = engines("b")
    b.add("r2", longer, max_tokens=2)
    b.run()
    # a stored blocks 0-1 of the prompt (block 2 mixes in a's generated tokens)
    assert b.stats.scheduled_tokens == 70 - 32 + 1
    c = engines("c")
    c.add("r3", longer, max_tokens=2)
    c.run()
    assert c.stats.scheduled_tokens == 70 - 64 + 1
    assert a.outputs["r1"] == baseline(p, 2)[0]
    assert b.outputs["r2"] == c.outputs["r3"] == baseline(longer, 2)[0]
    for e in (a, b, c):
        e.assert_drained()


def test_partial_hit_loads_only_the_shared_blocks(engines):
    shared = prompt(4, 32)
    a = engines("a")
    a.add("r1", shared + prompt(5, 30), max_tokens=1)
    a.run()
    b = engines("b")
    other = shared + prompt(6, 30)
    req = b.add("r2", other, max_tokens=1)
    assert b.scheduler.connector.get_num_new_matched_tokens(req, 0) == (32, load_async(b))
    b.run()
    assert b.stats.scheduled_tokens == 62 - 32
    assert b.outputs["r2"] == baseline(other, 1)[0]
    table = b.ranks[0].history["r2"]
    assert b.block_matches(0, table[0], other, 0) and b.block_matches(0, table[1], other, 1)
    b.assert_drained()


@pytest.mark.parametrize("in_step", [True, False], ids=["in_step", "async"])
def test_compute_share_leaves_the_end_of_an_in_step_hit_to_vllm(engines, in_step):
    """compute_share: vLLM computes the last share of the blocks past its own hit instead of
    loading them (in-step loads only; an asynchronous load has no step to overlap); the blocks it
    computes are saved again, found stored and not copied, and the answer stays exact."""
    p = prompt(40, 16 * 20 + 5)  # 20 full blocks, 5 tokens after them
    extra = {**EMBEDDED, "load_in_step": in_step, "compute_share": 0.1}
    a = engines("a", extra)
    a.add("r", p, max_tokens=2)
    a.run()
    before = store_stats(a)
    b = engines("b", extra)
    req = b.add("r", p, max_tokens=2)
    hit = 18 * 16 if in_step else 20 * 16  # int(20 * 0.1) = 2 blocks computed instead
    assert b.scheduler.connector.get_num_new_matched_tokens(req, 0) == (hit, not in_step)
    b.run()
    b.assert_drained()
    assert b.outputs["r"] == a.outputs["r"] == baseline(p, 2)[0]
    assert b.stats.scheduled_tokens == len(p) - hit + 1
    stats = store_stats(b)
    assert stats["pegaflow_load_blocks_total"] - before["pegaflow_load_blocks_total"] == hit // 16
    # b's saves of what it computed: found resident, skipped, nothing stored twice
    assert stats["pegaflow_save_blocks_total"] == before["pegaflow_save_blocks_total"]
    assert stats["pegaflow_save_skipped_blocks_total"] - before["pegaflow_save_skipped_blocks_total"] == 20 - hit // 16
    assert stats["pegaflow_cache_resident_blocks"] == before["pegaflow_cache_resident_blocks"] == 20
    table = b.ranks[0].history["r"]
    assert all(b.block_matches(0, table[i], p, i) for i in range(20))


def test_preemption_waits_for_saves_and_outputs_stay_exact(engines):
    # 12 GPU blocks for three requests that each grow to 5 blocks: vLLM must preempt.
    a = engines("a", num_blocks=12, max_num_seqs=3)
    prompts = {f"r{i}": prompt(10 + i, 40) for i in range(3)}
    for rid, p in prompts.items():
        a.add(rid, p, max_tokens=30)
    a.run()
    a.assert_drained()
    assert a.stats.preemptions > 0, "the scenario must preempt"
    for rid, p in prompts.items():
        assert a.outputs[rid] == baseline(p, 30)[0], rid
    assert store_stats(a)["pegaflow_active_leases"] == 0


@pytest.mark.parametrize("in_step", [True, False], ids=["in_step", "async"])
def test_abort_while_loading_releases_everything(engines, in_step):
    """Async: aborted while it waits for its load; in-step: aborted right after the step whose
    forward loaded it (it never waits)."""
    extra = {**EMBEDDED, "load_in_step": in_step}
    p = prompt(7, 64)
    a = engines("a", extra)
    a.add("r", p, max_tokens=1)
    a.run()
    b = engines("b", extra)
    b.add("r", p, max_tokens=5)
    b.step()
    assert b.status("r").name == ("RUNNING" if in_step else "WAITING_FOR_REMOTE_KVS")
    b.abort("r")
    b.run()
    b.assert_drained()
    assert b.outputs["r"] == (a.outputs["r"][:1] if in_step else []), "in-step: the step that loaded it sampled"
    stats = store_stats(b)
    assert stats["pegaflow_active_leases"] == 0 and stats["pegaflow_pinned_blocks"] == 0


def test_pool_pressure_evicts_and_never_breaks_vllm(engines):
    # the pool holds 16 blocks (4 KiB each: 2 layers x 2 heads x 16 tokens x 32 B); 10 prompts need 40
    a = engines("a", {"mode": "embedded", "pool_size": "64kb"})
    prompts = {f"r{i}": prompt(20 + i, 65) for i in range(10)}
    for rid, p in prompts.items():
        a.add(rid, p, max_tokens=2)
        a.run()
    a.assert_drained()
    stats = store_stats(a)
    assert stats["pegaflow_cache_block_evictions_total"] > 0
    assert stats["pegaflow_pool_used_bytes"] <= 64 * 1024
    for rid, p in prompts.items():
        assert a.outputs[rid] == baseline(p, 2)[0], rid
    b = engines("b", {"mode": "embedded", "pool_size": "64kb"})
    b.add("again", prompts["r9"], max_tokens=2)  # the newest survived eviction
    b.run()
    assert b.stats.loaded_requests == 1 and b.outputs["again"] == a.outputs["r9"]


def test_resident_hashes_are_not_stored_twice_and_producers_never_load(engines):
    """Two save-only instances (kv_role kv_producer) compute the same prompt: the second one's
    saves are all skipped by the store (the hashes are resident), and neither ever loads.
    Saves come from wait_for_save alone: the simulation never calls save_kv_layer, as FULL
    CUDA graphs do not."""
    p = prompt(8, 70)
    a = engines("a", kv_role="kv_producer")
    a.add("r", p, max_tokens=1)
    a.run()
    b = engines("b", kv_role="kv_producer")
    req = b.add("r", p, max_tokens=1)
    assert b.scheduler.connector.get_num_new_matched_tokens(req, 0) == (0, False)
    b.run()
    b.assert_drained()
    stats = store_stats(b)
    # 4 full blocks and the partial tail block (6 tokens, saved under its tail key for P/D)
    assert stats["pegaflow_cache_resident_blocks"] == 5
    assert stats["pegaflow_save_blocks_total"] == 5
    assert stats["pegaflow_save_skipped_blocks_total"] == 5
    assert stats["pegaflow_load_blocks_total"] == 0 and b.stats.scheduled_tokens == 70


def _round_trip(engines, layout, seed=30):
    p = prompt(seed, 50)
    a = engines("a", layout=layout)
    a.add("r", p, max_tokens=2)
    a.run()
    b = engines("b", layout=layout)
    b.add("r", p, max_tokens=2)
    b.run()
    b.assert_drained()
    assert b.stats.loaded_requests == 1 and b.outputs["r"] == a.outputs["r"]
    table = b.ranks[0].history["r"]
    assert all(b.block_matches(0, table[i], p, i) for i in range(3))
    return b


@pytest.mark.parametrize("layout", ["LBNHC", "LBHNC", "BLNHC", "BLHNC"])
def test_every_dense_vllm_layout_round_trips(engines, layout):
    if (why := sim.layout_available(layout)) is not None:
        pytest.skip(why)  # BLHNC before 0.29 (its HND cross-layer tensor is BHLNC: the next test)
    b = _round_trip(engines, layout)
    # 0.26-0.28: a blocks-outermost layout is vLLM's one tensor for all layers, which it hands to
    # register_cross_layers_kv_cache (the connector prefers it); 0.29+ names the layout instead
    assert b.cross_layers == (sim.CROSS_LAYER_REGISTRATION and layout.startswith("B"))


def test_an_hnd_cache_where_the_connector_prefers_cross_layer_blocks(engines):
    """vLLM 0.26-0.28 with the HND KV cache layout (VLLM_KV_CACHE_LAYOUT=HND, or FlashInfer on
    SM 10.x, which requires it) asks the connector's prefer_cross_layer_blocks; FlashAttention's
    (and FlashInfer's, Triton's) stride order with the layer dimension is then [B, H, L, N, C]
    (BHLNC: each layer's slice of a block is heads apart). Whatever the connector answers, vLLM
    must come up and the cache must round-trip. 0.29+ allocates BHLNC only where a user names it
    (VLLM_KV_CACHE_LAYOUT=BHLNC): refused with the reason."""
    if not sim.CROSS_LAYER_REGISTRATION:
        with pytest.raises(InvalidArgumentError, match=r"LHBNC and BHLNC put heads outside blocks"):
            engines("bh", layout="BHLNC")
        return
    _round_trip(engines, "BHLNC", seed=31)


def test_tensor_parallel_ranks_each_store_their_shard(engines):
    p = prompt(40, 50)
    a = engines("a", tp=2)
    a.add("r", p, max_tokens=2)
    a.run()
    b = engines("b", tp=2)
    b.add("r", p, max_tokens=2)
    b.run()
    b.assert_drained()
    assert b.outputs["r"] == a.outputs["r"] and b.stats.loaded_requests == 1
    for rank in (0, 1):
        table = b.ranks[rank].history["r"]
        assert all(b.block_matches(rank, table[i], p, i) for i in range(3)), f"rank {rank}"
    assert b.block_bytes(0, b.ranks[0].history["r"][0]) != b.block_bytes(1, b.ranks[1].history["r"][0])
    stats = store_stats(b)
    assert stats["pegaflow_cache_resident_bytes"] == 3 * 2 * 4096  # 3 blocks x 2 shards


def test_mla_is_stored_once_across_tp_ranks(engines):
    p = prompt(41, 50)
    a = engines("a", tp=2, mla=True)
    a.add("r", p, max_tokens=2)
    a.run()
    b = engines("b", tp=2, mla=True)
    b.add("r", p, max_tokens=2)
    b.run()
    b.assert_drained()
    assert b.outputs["r"] == a.outputs["r"] and b.stats.loaded_requests == 1
    for rank in (0, 1):
        table = b.ranks[rank].history["r"]
        assert all(b.block_matches(rank, table[i], p, i) for i in range(3))
    page = 16 * 64 * 2 * 2  # tokens x latent x fp16 x 2 layers
    assert store_stats(b)["pegaflow_cache_resident_bytes"] == 3 * page  # one copy, not one per rank


def test_namespaces_separate_incompatible_caches(engines):
    made = []

    def namespace(**kw):
        made.append(kw)
        e = engines(f"ns{len(made)}", **kw)
        return e.ranks[0].connector._worker.namespace

    base = namespace()
    assert namespace() == base, "stable for the same model and geometry"
    assert namespace(block_size=32) != base
    import torch

    assert namespace(dtype=torch.bfloat16) != base
    assert namespace(layout="LBHNC") != base  # other byte order inside a block
    assert namespace(layout="BLNHC") == base  # same bytes per block: caches are interchangeable
    assert namespace(tp=2) != base


def test_unsupported_layout_and_bad_settings_are_refused_clearly(engines):
    if sim.KV_CACHE_LAYOUTS:
        with pytest.raises(InvalidArgumentError, match=r"LHBNC and BHLNC put heads outside blocks"):
            engines("lh", layout="LHBNC")
    else:  # before 0.29 vLLM cannot allocate heads outside a layer's blocks (HND per layer is LBHNC)
        with pytest.raises(sim.LayoutNotInThisMinor, match=r"cannot allocate layout LHBNC: before 0.29"):
            engines("lh", layout="LHBNC")
    with pytest.raises(InvalidArgumentError, match=r"key 'pool' is unknown; expected one of: mode"):
        engines("bad", {"pool": "1gb"})
    with pytest.raises(InvalidArgumentError, match=r"mode 'shared'; expected one of \['auto', 'embedded', 'server'\]"):
        engines("bad2", {"mode": "shared"})


def test_ssd_settings_reach_the_engine_link_and_the_private_server():
    from pegaflow.connector.settings import Settings

    s = Settings.from_extra({"ssd_cache_path": ["/nvme/a", "/nvme/b"], "ssd_cache_capacity": "100gb"}, env={})
    assert s.ssd_lines() == b"ssd_cache_path=/nvme/a\nssd_cache_path=/nvme/b\nssd_cache_capacity=100gb\n"
    assert s.ssd_flags() == ["--ssd-cache-path=/nvme/a", "--ssd-cache-path=/nvme/b", "--ssd-cache-capacity=100gb"]
    env = Settings.from_extra({}, env={"PEGAFLOW_SSD_CACHE_PATH": "/x, /y"})
    assert env.ssd_cache_paths == ("/x", "/y")
    assert Settings.from_extra({}, env={}).ssd_lines() == b""
    with pytest.raises(InvalidArgumentError, match=r"ssd_cache_path 3; expected a directory or a list of directories"):
        Settings.from_extra({"ssd_cache_path": 3}, env={})


def test_legacy_split_kv_tensor_is_two_segments():
    import torch

    t = torch.zeros(2, 10, 16, 2, 8, dtype=torch.float16)  # [2, num_blocks, tokens, heads, head]
    g = _layout.describe_layer("l0", t, 10, mla=False)
    r = g.region
    assert (r.layout, r.segment_bytes, r.block_stride, r.segment_offset) == ("split_kv", 512, 512, 5120)
    assert r.base_address == t.data_ptr() and r.region_bytes == 10240


def test_layers_are_described_in_forward_order_whatever_their_addresses():
    """vLLM 0.26 allocates each layer's tensor on its own, so their addresses may run either
    way: a layer-wise load copies regions in the described order, so layer 0 must come first
    whichever way they run (else every layer's attention waits for the whole load)."""
    import torch

    buf = torch.zeros(10, 12, 2, 16, 32, dtype=torch.float16)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(12)]
    down = {n: buf[:, 11 - i] for i, n in enumerate(names)}  # layer 0 at the highest address
    described = _layout.describe_kv_caches(down, 10, mla=False)
    assert [g.region.name for g in described] == names
    assert int(described[0].region.base_address) > int(described[-1].region.base_address)
    up = {n: buf[:, i] for i, n in enumerate(names)}  # layer 0 at the lowest address
    described = _layout.describe_kv_caches(up, 10, mla=False)
    assert [g.region.name for g in described] == names
    assert int(described[0].region.base_address) < int(described[-1].region.base_address)


def test_a_layer_sharing_another_layers_kv_cache_is_stored_once():
    import torch

    own = torch.zeros(10, 2, 16, 32, dtype=torch.float16)
    other = torch.zeros(10, 2, 16, 32, dtype=torch.float16)
    layers = _layout.describe_kv_caches({"l0": own, "l1": other, "l2": own}, 10, mla=False)
    assert sorted(g.region.name for g in layers) == ["l0", "l1"]  # l2 reuses l0's cache (vLLM KV sharing)


def _resolved_layout(monkeypatch, supported, extra=None, mla=False, cpu=False):
    """The layout vLLM's own resolver picks with this connector configured (its real factory lookup)."""
    from types import SimpleNamespace

    import vllm.v1.attention.backends.utils as u
    from vllm.config import CacheConfig, KVTransferConfig
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "is_cpu", lambda: cpu)
    monkeypatch.delenv("VLLM_KV_CACHE_LAYOUT", raising=False)
    ktc = KVTransferConfig(kv_connector="PegaKVConnector", kv_role="kv_both", kv_connector_module_path="pegaflow.connector",
                           kv_connector_extra_config=extra or {})
    cfg = SimpleNamespace(cache_config=CacheConfig(), kv_transfer_config=ktc, model_config=SimpleNamespace(use_mla=mla))
    return u.resolve_kv_cache_layout(cfg, [supported]).name


def test_the_connector_asks_vllm_for_the_cross_layer_layout_where_the_backend_takes_it(monkeypatch, engines):
    if sim.CROSS_LAYER_REGISTRATION:
        return _cross_layer_preference_before_0_29(monkeypatch, engines)
    import vllm.v1.attention.backends.utils as u

    every = [layout.name for layout in u._DEFAULT_LAYOUT_PREFERENCE]  # FlashAttention and Triton declare no preference
    assert _resolved_layout(monkeypatch, every) == "BLNHC"
    assert _resolved_layout(monkeypatch, every, extra={"cross_layer_blocks": False}) == every[0]
    assert _resolved_layout(monkeypatch, every, extra={"pegaflow.cross_layer_blocks": "off"}) == every[0]
    assert _resolved_layout(monkeypatch, every, mla=True) == every[0]
    assert _resolved_layout(monkeypatch, every, cpu=True) == every[0]
    # a backend that cannot take it (FlashInfer on Blackwell): vLLM keeps what the backend supports
    assert _resolved_layout(monkeypatch, ["LBHNC", "BLHNC"]) == "LBHNC"
    with pytest.raises(InvalidArgumentError, match="cross_layer_blocks 'maybe'; expected true or false"):
        _resolved_layout(monkeypatch, every, extra={"cross_layer_blocks": "maybe"})


def _cross_layer_preference_before_0_29(monkeypatch, engines):
    """vLLM 0.26-0.28: no layout names (the connector requests none, vLLM's default is NHD); vLLM
    asks prefer_cross_layer_blocks instead (KVConnectorModelRunnerMixin.use_uniform_kv_cache) and
    allocates one tensor for all layers where it holds, the model has one KV-cache group and the
    backend indexes blocks by stride: the same conditions as the layout request of 0.29+."""
    from types import SimpleNamespace

    from vllm.config import set_current_vllm_config
    from vllm.distributed.kv_transfer.kv_connector.utils import get_kv_connector_cache_layout
    from vllm.platforms import current_platform

    e = engines("x", layout="BLNHC")
    assert e.cross_layers and e.ranks[0].connector.prefer_cross_layer_blocks
    assert PegaKVConnector.get_required_kvcache_layout(e.vllm_config) is None
    with set_current_vllm_config(e.vllm_config):
        assert get_kv_connector_cache_layout() == "NHD"
    for i, off in enumerate(({"cross_layer_blocks": False}, {"pegaflow.cross_layer_blocks": "off"})):
        assert not engines(f"off{i}", {"mode": "embedded", "pool_size": "64mb", **off}, layout="BLNHC").cross_layers
    mla = SimpleNamespace(_vllm_config=SimpleNamespace(model_config=SimpleNamespace(use_mla=True)),
                          _settings=e.ranks[0].connector._settings)
    assert not type(e.ranks[0].connector).prefer_cross_layer_blocks.fget(mla)
    # a model vLLM does not give one tensor (several KV-cache groups): per layer, as it allocates
    assert not engines("hybrid", hybrid="swa", layout="BLNHC").cross_layers
    with pytest.raises(InvalidArgumentError, match="cross_layer_blocks 'maybe'; expected true or false"):
        engines("bad", {"mode": "embedded", "cross_layer_blocks": "maybe"}, layout="BLNHC")
    monkeypatch.setattr(current_platform, "is_cpu", lambda: True)  # the CPU backend takes per-layer tensors only
    assert not engines("cpu", layout="BLNHC").cross_layers


def test_cross_layer_views_are_described_as_one_run_per_block_in_memory_order():
    """vLLM's own BLNHC views (Llama-3.1-8B's page, 3 layers): regions in memory order, each
    block's layers back to back, so the pool slots of a block follow its device bytes and the
    copy engine merges a block into one piece."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    blocks, layers, page = 4, 3, spec.page_size_bytes
    names = ["model.layers.9.attn", "model.layers.10.attn", "model.layers.11.attn"]  # by name, 10 and 11 sort before 9
    if sim.KV_CACHE_LAYOUTS:
        from vllm.v1.kv_cache_interface import KVCacheTensor, compute_layout_strides, create_kv_cache_views
        from vllm.v1.kv_cache_layout import KVCacheLayout

        strides = compute_layout_strides(spec, blocks, layers, KVCacheLayout.BLNHC,
                                         fixed_strides=(None, layers * page, None, None, None))
        t = KVCacheTensor(size=layers * page * blocks, layers=names, layer_stride=strides[0], block_stride=strides[1])
        buf = torch.zeros(t.size, dtype=torch.int8)
        kv = dict(zip(names, create_kv_cache_views(buf, spec, blocks, KVCacheLayout.BLNHC, t)))
    else:
        # 0.26-0.28: vLLM's one tensor for all layers (KVConnectorModelRunnerMixin.allocate_uniform_kv_caches,
        # FlashAttention, NHD) and the views register_cross_layers_kv_cache registers
        from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
        from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin
        from vllm.v1.worker.utils import AttentionGroup

        with sim._legacy_kv_cache_layout("BLNHC"):
            spec = sim._legacy_spec(spec)
            kcc = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[KVCacheTensor(size=page * blocks, shared_by=[n])
                                                                     for n in names],
                                kv_cache_groups=[KVCacheGroupSpec(names, spec)])
            groups = [[AttentionGroup(sim._legacy_backend(spec), names, spec, 0)]]
            model_views, buf, backend = KVConnectorModelRunnerMixin.allocate_uniform_kv_caches(
                kcc, groups, "auto", torch.device("cpu"), [16])
            kv = _layout.cross_layer_views(buf, backend, kcc)
        for n in names:  # the very views vLLM's model reads
            assert (kv[n].data_ptr(), kv[n].shape, kv[n].stride()) == \
                (model_views[n].data_ptr(), model_views[n].shape, model_views[n].stride())
    described = _layout.describe_kv_caches(kv, blocks, mla=False)
    assert [g.region.name for g in described] == names  # forward order (numbers as numbers) is memory order here
    for i, g in enumerate(described):
        r = g.region
        assert (r.layout, r.segment_bytes, r.block_stride) == ("combined", page, layers * page)
        assert r.base_address == buf.data_ptr() + i * page  # layer i of block b at b * 3 pages + i pages


def test_context_parallelism_is_refused():
    from types import SimpleNamespace

    from vllm.config import ParallelConfig

    from pegaflow.connector._vllm import _check_parallelism

    _check_parallelism(SimpleNamespace(parallel_config=ParallelConfig(tensor_parallel_size=2)))
    dcp = SimpleNamespace(parallel_config=ParallelConfig(tensor_parallel_size=2, decode_context_parallel_size=2))
    with pytest.raises(ValueError, match=r"decode_context_parallel_size=2.*expected 1 for both"):
        _check_parallelism(dcp)


def test_a_prefix_match_unit_other_than_the_block_is_refused():
    """vLLM 0.33's prefix_match_unit hashes prefixes in other units than a block; the connector
    keys and moves whole blocks by one hash each, so another unit is refused at start, naming it."""
    from types import SimpleNamespace

    from pegaflow.connector._vllm import _check_prefix_unit

    for unit in (None, 16):
        _check_prefix_unit(SimpleNamespace(cache_config=SimpleNamespace(block_size=16, prefix_match_unit=unit)))
    _check_prefix_unit(SimpleNamespace(cache_config=SimpleNamespace(block_size=16)))  # before vLLM had it
    with pytest.raises(ValueError, match=r"prefix_match_unit=8 with block_size=16; expected unset or 16"):
        _check_prefix_unit(SimpleNamespace(cache_config=SimpleNamespace(block_size=16, prefix_match_unit=8)))


def test_a_lead_is_refused_where_vllm_zeroes_new_blocks(monkeypatch):
    """PEGAFLOW_CUDA_LAYER_LEAD_MIB copies a held load's first layers before the step starts;
    where vLLM zeroes newly allocated blocks at the step's start (Mamba layers, mixed precision)
    that zeroing would wipe them, so the setting is refused there, naming it."""
    from types import SimpleNamespace

    from pegaflow.connector._vllm import _check_lead

    zeroing, uniform = SimpleNamespace(needs_kv_cache_zeroing=True), SimpleNamespace(needs_kv_cache_zeroing=False)
    monkeypatch.setenv("PEGAFLOW_CUDA_LAYER_LEAD_MIB", "128")
    _check_lead(uniform)
    _check_lead(SimpleNamespace())  # a vLLM without the property zeroes nothing
    with pytest.raises(ValueError, match=r"PEGAFLOW_CUDA_LAYER_LEAD_MIB=128: .*needs zeroing.*expected 0 or unset"):
        _check_lead(zeroing)
    for off in ("0", "00", ""):
        monkeypatch.setenv("PEGAFLOW_CUDA_LAYER_LEAD_MIB", off)
        _check_lead(zeroing)


def test_metadata_pickles_for_worker_processes():
    m = PegaConnectorMetadata(plan=b"\x00\x00\x00\x02" + b"\x00" * 12)
    assert pickle.loads(pickle.dumps(m)) == m


def test_plugin_entry_point_registers_the_connector_name():
    from importlib.metadata import entry_points

    assert any(ep.value == "pegaflow._vllm_plugin:register" for ep in entry_points(group="vllm.general_plugins"))
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    cls = KVConnectorFactory.get_connector_class(KVTransferConfig(kv_connector="PegaKVConnector", kv_role="kv_both"))
    from pegaflow.connector import PegaKVConnector

    assert cls is PegaKVConnector


# ---------------------------------------------------------------------------- server mode


def server_extra(endpoint: str) -> dict:
    return {"mode": "server", "endpoint": endpoint, "health_interval_s": 0.2, "deadline_ms": 1000}


def run_until(engine: SimEngine, cond, timeout_s: float = 20.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError("condition not reached")
        engine.step()
        time.sleep(0.05)


def test_server_killed_mid_run_degrades_to_recompute_then_recovers(engines, tmp_path):
    server = start_server(tmp_path / "pool", pool_size="64mb")
    port = server.grpc_port
    try:
        # checked every 5 s, not 0.2: a check that found the server dead between the kill below and
        # the step's load would detach the link first, and a detached link's loads fail fast (recompute)
        a = engines("a", {**server_extra(server.endpoint), "health_interval_s": 5.0})
        p = prompt(50, 70)
        a.add("r1", p, max_tokens=2)
        a.run()
        assert a.scheduler.reset_prefix_cache()  # what vLLM cached locally is gone: the store must serve
        # a hit: its lookup also began its load (the worker shares the scheduler's process), then
        # the server dies before the step; the copy reads the pool this process maps, its blocks
        # pinned under the plan's hold, and lands (its end, beside it, fails and is logged)
        a.add("r2", p, max_tokens=2)
        a.at_first_load(lambda so: server.stop(kill=True))
        a.run()
        assert (a.stats.loaded_requests, a.stats.invalid_blocks) == (1, 0), "served from the pool it mapped"
        assert a.outputs["r2"] == a.outputs["r1"]
        a.add("r3", prompt(51, 40), max_tokens=2)  # while the server is down: a miss, no crash
        a.run()
        assert a.outputs["r3"] == baseline(prompt(51, 40), 2)[0]

        server2 = start_server(tmp_path / "pool", grpc_port=port, pool_size="64mb")
        try:
            link = a.ranks[0].connector._link
            run_until(a, lambda: link.status()["engine"] == "1" and server2.instances() == ["a"])
            a.add("r4", p, max_tokens=2)
            a.run()
            assert a.scheduler.reset_prefix_cache()
            a.add("r5", p, max_tokens=2)
            before = a.stats.loaded_requests
            a.run()
            assert a.stats.loaded_requests == before + 1, "saves and hits work on the restarted server"
            assert a.outputs["r5"] == a.outputs["r1"]
            a.assert_drained()
        finally:
            server2.stop()
    finally:
        server.stop()


def rpc_calls(server) -> dict[str, float]:
    """The server's calls by method, gRPC and local socket together (pegaflow_rpc_requests_total)."""
    out: dict[str, float] = {}
    for line in server.http("/metrics")[1].splitlines():
        m = re.match(r'pegaflow_rpc_requests_total\{.*method="(\w+)".*\} (\S+)$', line)
        if m:
            out[m[1]] = out.get(m[1], 0) + float(m[2])
    return out


@pytest.mark.parametrize("in_step, begin", [(True, True), (False, True), (True, False)],
                         ids=["in_step", "async", "plan_at_load"])
def test_a_warm_request_asks_the_server_once_before_its_copy(engines, tmp_path, in_step, begin):
    """Server mode, the worker in the scheduler's process (vLLM's engine core with its worker
    in-process, the default for one GPU): the lookup's Query also begins the load, so no
    BeginLoad or LoadRest follows; the load's end goes beside the copy, off the request's path.
    With begin_at_lookup false the load asks for its plan itself: one BeginLoad more."""
    server = start_server(tmp_path / "pool", pool_size="64mb")
    try:
        # the link's health check is an empty Query each interval: none inside the counted window
        a = engines("a", {**server_extra(server.endpoint), "health_interval_s": 60, "load_in_step": in_step,
                          "begin_at_lookup": begin})
        p = prompt(52, 70)
        a.add("r1", p, max_tokens=2)
        a.run()
        assert a.scheduler.reset_prefix_cache()
        before = rpc_calls(server)
        a.add("r2", p, max_tokens=2)
        a.run()
        a.assert_drained()

        def window() -> dict[str, float]:
            return {k: v - before.get(k, 0) for k, v in rpc_calls(server).items() if v != before.get(k, 0)}

        # the load's end goes beside its copy, on an end thread (CopyEnds' BESIDE rule): the
        # request may have its answer before the server counted that call
        wait_until(lambda: window().get("EndCopy", 0) >= 1, "the load's EndCopy counted by the server", timeout=5.0)
        calls = window()
        assert a.stats.loaded_requests == 1 and a.outputs["r2"] == a.outputs["r1"]
        assert calls.get("Query") == 1, calls
        assert calls.get("BeginLoad", 0) == (0 if begin else 1) and "LoadRest" not in calls, calls
    finally:
        server.stop()


def test_a_server_that_stalls_then_resumes_is_reattached_without_losing_the_cache(engines, tmp_path):
    """SIGSTOP makes the server miss its deadlines (the link detaches: misses, no waits);
    SIGCONT brings the same process back (same server id): the kept client is re-attached,
    its registration still valid, and hits resume."""
    import signal

    server = start_server(tmp_path / "pool", pool_size="64mb")
    try:
        a = engines("a", {**server_extra(server.endpoint), "deadline_ms": 1000})
        p = prompt(52, 50)
        a.add("r1", p, max_tokens=2)
        a.run()
        link = a.ranks[0].connector._link
        first = link.status()
        server.proc.send_signal(signal.SIGSTOP)
        try:
            run_until(a, lambda: link.status()["detached"] == "1", timeout_s=10)
            assert a.scheduler.reset_prefix_cache()
            a.add("r2", p, max_tokens=2)  # while stalled: a miss, computed, no crash
            a.run()
            assert a.outputs["r2"] == a.outputs["r1"]
        finally:
            server.proc.send_signal(signal.SIGCONT)
        run_until(a, lambda: link.status()["detached"] == "0", timeout_s=10)
        again = link.status()
        assert (again["generation"], again["server_id"]) == (first["generation"], first["server_id"]), \
            "the same server: the same client (same generation), nothing re-registered"
        assert a.scheduler.reset_prefix_cache()
        before = a.stats.loaded_requests
        a.add("r3", p, max_tokens=2)
        a.run()
        assert a.stats.loaded_requests == before + 1 and a.outputs["r3"] == a.outputs["r1"]
        a.assert_drained()
    finally:
        server.stop()


def test_server_unreachable_at_start_is_a_miss_until_it_answers(engines, tmp_path):
    port = free_port()
    a = engines("a", server_extra(f"127.0.0.1:{port}"))
    p = prompt(60, 50)
    a.add("r1", p, max_tokens=2)
    a.run()
    assert a.outputs["r1"] == baseline(p, 2)[0]
    server = start_server(tmp_path / "pool", grpc_port=port, pool_size="64mb")
    try:
        link = a.ranks[0].connector._link
        run_until(a, lambda: link.status()["engine"] == "1" and server.instances() == ["a"])
        assert a.scheduler.reset_prefix_cache()
        a.add("r2", p, max_tokens=2)
        a.run()
        assert a.scheduler.reset_prefix_cache()
        a.add("r3", p, max_tokens=2)
        a.run()
        assert a.stats.loaded_requests == 1 and a.outputs["r3"] == a.outputs["r1"]
        a.assert_drained()
    finally:
        server.stop()


SECOND_INSTANCE = r"""
import json, sys
from pegaflow.bench.sim import SimEngine
endpoint, prompt = sys.argv[1], json.loads(sys.argv[2])
b = SimEngine("b", {"mode": "server", "endpoint": endpoint})
b.add("r", prompt, max_tokens=3)
b.run()
b.assert_drained()
print("RESULT " + json.dumps({"outputs": b.outputs["r"], "computed": b.stats.scheduled_tokens,
                              "loaded": b.stats.loaded_requests}))
b.close()
"""


def test_two_vllm_instances_in_two_processes_share_one_server(engines, tmp_path):
    server = start_server(tmp_path / "pool", pool_size="64mb")
    try:
        a = engines("a", {"mode": "server", "endpoint": server.endpoint})
        p = prompt(70, 70)
        a.add("r", p, max_tokens=3)
        a.run()
        out = subprocess.run([sys.executable, "-c", SECOND_INSTANCE, server.endpoint, json.dumps(p)],
                             capture_output=True, text=True, timeout=300)
        lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
        assert lines, out.stdout[-3000:] + out.stderr[-3000:]
        result = json.loads(lines[0][len("RESULT "):])
        assert result == {"outputs": a.outputs["r"], "computed": 70 - 64 + 2, "loaded": 1}
    finally:
        server.stop()


def test_a_second_process_with_its_own_none_hash_hits_the_first_ones_saves(engines, monkeypatch):
    """Two vLLM processes share one store and each draws NONE_HASH when it starts
    (``init_none_hash``, EngineCore). Without PYTHONHASHSEED, 0.26-0.28 draw it at random, so their
    hashes never meet: the connector keys full blocks by its own chain over the token ids. 0.29+
    draw it from a fixed seed: vLLM's own hashes are the keys. The second process is simulated by
    drawing NONE_HASH again between the two engines, as its start would."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils

    from pegaflow.engine import vllm_block_hashes

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    reproducible = _compat.has("reproducible_none_hash")
    p = prompt(80, 70)
    a = engines("a")
    first = bytes(kv_cache_utils.NONE_HASH)
    ra = a.add("r", p, max_tokens=3)
    a_hashes = [bytes(h) for h in ra.block_hashes]
    a.run()
    kv_cache_utils.init_none_hash(sha256)  # the second process starts
    second = bytes(kv_cache_utils.NONE_HASH)
    assert (first == second) == reproducible, f"vLLM {_compat.minor()}: NONE_HASH per process"
    b = engines("b")
    req = b.add("r", p, max_tokens=3)
    conn = b.scheduler.connector
    assert conn.get_num_new_matched_tokens(req, 0) == (64, load_async(b)), "the first process's saves"
    keys = [bytes(k) for k in conn._scheduler.keys.of(req)]
    b_hashes = [bytes(h) for h in req.block_hashes]
    own = vllm_block_hashes(p, 16, "sha256", "vllm-none-hash")
    assert conn._scheduler.keys.own_chain == (not reproducible)
    assert keys == own
    if reproducible:
        assert keys == b_hashes == a_hashes, "vLLM's hashes agree across processes: they are the keys"
    else:
        assert b_hashes != a_hashes and keys != b_hashes, "vLLM's hashes differ per process: the own chain keys"
    b.run()
    b.assert_drained()
    assert b.outputs["r"] == a.outputs["r"] and b.stats.loaded_requests == 1
    assert b.stats.scheduled_tokens == 70 - 64 + 2


# vLLM 0.33.0's SHA-256 block hashes (default seed, block size 16) of prompt(90, 70)'s 4 full blocks
VLLM_033_SHA256 = [
    "737152aaedea2651c5ff344de26f89ff305054fd320c7b64a7dfd7aa2125df5a",
    "24c7dabd68330f8c05a44367c7af94fb7e24d2f765d2ce717c6644d1a8383a07",
    "95a28869705c9b751f20b3dba5dde205e6eb54b7896aaed43d74d1e7ebb330c9",
    "b8f8649f9f1263496825feecd01aa57f3844dff5c2e240bff6be3bf5433b3d15",
]


def test_the_connectors_own_chain_is_vllm_033s_sha256_chain_for_the_same_tokens(engines, monkeypatch):
    """The keys of the connector's own chain (BlockKeys, where NONE_HASH is random per process)
    are exactly vLLM 0.33's SHA-256 hashes with its default seed, so processes of every supported
    minor share blocks with each other; under 0.29+ vLLM's own hashes are those values too."""
    from vllm.v1.core import kv_cache_utils

    from pegaflow.connector._keys import BlockKeys

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    p = prompt(90, 70)
    e = engines("a")
    req = e.add("r", p, max_tokens=1)
    keys = BlockKeys("sha256", 16)
    keys._own = True  # what it decides where NONE_HASH is random (0.26-0.28 without PYTHONHASHSEED)
    assert [bytes(k).hex() for k in keys.of(req)] == VLLM_033_SHA256
    if _compat.has("reproducible_none_hash"):
        assert [bytes(h).hex() for h in req.block_hashes] == VLLM_033_SHA256
    else:  # the installed vLLM's own hash function, from the seed 0.29+ fix NONE_HASH with
        from vllm.utils.hashing import sha256

        monkeypatch.setattr(kv_cache_utils, "NONE_HASH", kv_cache_utils.BlockHash(sha256("vllm-none-hash")))
        parent, chain = None, []
        for i in range(4):
            parent = kv_cache_utils.hash_block_tokens(sha256, parent, p[i * 16:(i + 1) * 16])
            chain.append(bytes(parent).hex())
        assert chain == VLLM_033_SHA256
    e.run()
    e.assert_drained()


def test_the_tail_key_is_the_same_on_both_sides_and_only_where_a_tail_is_worth_loading():
    """PegaFlow's tail-block flow (docs/cluster.md, P/D): the prefill and the decode side derive
    a prompt's partial last block's key from the same inputs, and none where it would not pay."""
    from types import SimpleNamespace

    from pegaflow.connector.scheduler import tail_key

    def request(tokens, hashes, **extra):
        return SimpleNamespace(num_prompt_tokens=len(tokens), prompt_token_ids=tokens, block_hashes=hashes, **extra)

    hashes = [bytes([i]) * 32 for i in range(3)]
    prompt = list(range(100))  # 3 blocks of 32, then 4 tokens
    key = tail_key(request(prompt, hashes), 32)
    assert key is not None and len(key) == 32 and key not in hashes
    assert tail_key(request(list(prompt), list(hashes)), 32) == key, "the other side computes the same key"
    assert tail_key(request(prompt[:99] + [7], hashes), 32) != key, "other tail tokens, another key"
    assert tail_key(request(prompt, [hashes[0], hashes[1], b"\x09" * 32]), 32) != key, "another prefix, another key"
    assert tail_key(request(prompt[:97], hashes), 32) is None, "1 tail token: vLLM computes the last one anyway"
    assert tail_key(request(prompt[:96], hashes), 32) is None, "no partial block"
    assert tail_key(request(prompt[:20], []), 32) is None, "no full block before it"
    assert tail_key(request(prompt, hashes[:2]), 32) is None, "full blocks not all hashed yet"
    assert tail_key(request(prompt, hashes, lora_request=object()), 32) is None
    assert tail_key(request(prompt, hashes, cache_salt="s"), 32) is None
    assert len(tail_key(request(prompt, [h[:16] for h in hashes]), 32)) == 16, "as long as vLLM's own hashes"
    # the derivation (Java's VllmBlockHasher.tailKey) is the one both sides' earlier releases used
    import array
    import hashlib

    spec = hashlib.sha256(b"pegaflow-tail\0" + hashes[2] + array.array("i", prompt[96:]).tobytes()).digest()
    assert key == spec
