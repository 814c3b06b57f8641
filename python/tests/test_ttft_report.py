"""``pegaflow-bench ttft``'s report: the per-length summary and joining a second run's load."""

from __future__ import annotations

import pytest

from pegaflow.bench import ttft


def run(ttfts, cached, tokens):
    return [{"ttft_ms": t, "cached_tokens": c, "token_ids": tokens} for t, c in zip(ttfts, cached)]


def test_summary_compares_warm_answers_with_the_gpu_hits_of_the_same_run():
    results = {
        "none": {"start_s": 10.0, "lengths": {"8192": {"cold": run([200, 210], [0, 0], [1, 2]),
                                                      "gpu_hit": run([40, 50], [8176, 8176], [1, 2])}}},
        "server": {"start_s": 5.0, "lengths": {"8192": {"cold": run([205, 215], [0, 0], [1, 2]), "reset_ok": True,
                                                        "warm": run([60, 70, 80], [8176] * 3, [1, 3])}}},
    }
    s = ttft.summarize(results, [8192], 131072, 55.0)
    assert s["none"]["8k"]["gpu_hit_p50_ms"] == 40  # the lower middle of two
    assert s["none"]["8k"]["outputs_identical"] is True
    assert s["server"]["8k"]["warm_p50_ms"] == 70
    assert s["server"]["8k"]["outputs_identical"] is False  # token ids differ from the GPU hit's
    assert s["server"]["8k"]["line_floor_ms"] == pytest.approx(8192 * 131072 / 55e9 * 1e3, abs=0.01)


def test_a_load_only_run_joins_the_earlier_report_without_losing_its_figures():
    earlier = {"line_h2d_gbps": 55.0, "systems": {"server": {"start_s": 5.0, "8k": {"warm_p50_ms": 70}}},
               "raw": {"server": {"lengths": {"8192": {}}}}}
    load = {"requests": 48, "ttft_p50_ms": 90.0}
    later = {"command": "pegaflow-bench ttft --load-only", "line_h2d_gbps": 54.0, "vllm_version": "0.26.0",
             "systems": {"server": {"start_s": 0.0, "load": load}, "vllm_native": {"start_s": 0.0, "load": load}},
             "raw": {"server": {"lengths": {}, "load": load}, "vllm_native": {"lengths": {}, "load": load}}}
    merged = ttft.merge(earlier, later)
    assert merged["systems"]["server"] == {"start_s": 5.0, "8k": {"warm_p50_ms": 70}, "load": load}
    assert merged["systems"]["vllm_native"] == {"load": load}
    assert merged["raw"]["server"]["lengths"] == {"8192": {}}
    assert merged["line_h2d_gbps"] == 55.0
    assert merged["merged_runs"][0]["command"] == "pegaflow-bench ttft --load-only"
    assert "merged_runs" not in earlier
