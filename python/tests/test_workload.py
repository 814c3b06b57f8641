"""The main job through the console script: the real engine jar on a scaled-down trace."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

# Small geometry and trace so the tier stays fast; the full Llama-3.1-8B run is `make run-engine`.
SMALL = [
    "--conversations", "24", "--turns", "4", "--system-prompts", "3", "--concurrency", "4",
    "--prefix-tokens", "256-512", "--turn-tokens", "64-192", "--reply-tokens", "16-64",
    "--layers", "4", "--kv-heads", "2", "--head-dim", "64", "--verify", "full", "--no-prefault",
]


def run_workload(tmp_path, pool: str) -> dict:
    report = tmp_path / f"report-{pool}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pegaflow.cli", "workload", "--pool", pool, "--json", str(report), *SMALL],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "hit rate" in proc.stdout
    return json.loads(report.read_text())


def test_small_pool_evicts_and_still_hits(engine_jar, tmp_path):
    r = run_workload(tmp_path, "2mb")
    assert r["mode"] == "embedded"
    assert r["evictions"] > 0
    assert 0 < r["hit_rate"] < r["ideal_hit_rate"]
    assert r["verify_failures"] == 0 and r["verified_blocks"] == r["blocks_loaded"] > 0
    for key in ("blocks_saved", "blocks_loaded", "load_gbps", "save_gbps", "query_p50_us", "query_p99_us"):
        assert r[key] > 0, key


def test_large_pool_reaches_the_ideal_hit_rate(engine_jar, tmp_path):
    r = run_workload(tmp_path, "256mb")
    assert r["evictions"] == 0
    assert r["ideal_hit_rate"] > 0.5
    assert r["hit_rate"] >= r["ideal_hit_rate"] - 0.05


def test_bad_option_is_one_clear_line(engine_jar):
    proc = subprocess.run(
        [sys.executable, "-m", "pegaflow.cli", "workload", "--pool", "12 parsecs"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode != 0
    assert "size '12 parsecs' is not a size" in proc.stderr
    assert "\tat " not in proc.stderr, "a Java stack trace leaked to the user"


def test_make_run_job_goes_through_vllm_and_the_connector_against_a_server(engine_jar, tmp_path):
    """`make run`'s job, scaled down: two vLLM schedulers share one pegaflow-server; a small
    pool forces evictions; every block vLLM did not compute is checked."""
    report = tmp_path / "run.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pegaflow.cli", "vllm-workload", "--conversations", "10", "--turns", "3",
         "--pool", "512kb", "--gpu-blocks", "96", "--json", str(report)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(report.read_text())
    assert r["mode"] == "server" and r["instances"] == 2 and r["requests"] == 30
    assert r["verify_failures"] == 0 and r["verified_blocks"] > 0
    assert r["tokens_loaded_from_store"] > 0 and r["blocks_saved"] > 0 and r["evictions"] > 0
    assert 0 < r["hit_rate"] <= r["ideal_hit_rate"] + 0.02
    assert r["tokens_computed"] < r["prompt_tokens"]
