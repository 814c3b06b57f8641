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


def test_summary_reads_the_target_against_the_processs_own_gpu_hit():
    """Each system's warm answers beside its own GPU hit a second later (ttft_worker's
    own_gpu_hit): the 1.2x target's ratio uses the larger of that and the line floor, within one
    process; the token ids of both phases are compared; --rounds keeps both per round."""
    results = {
        "none": {"start_s": 10.0, "lengths": {"8192": {"cold": run([200, 210], [0, 0], [1, 2]),
                                                      "gpu_hit": run([40, 50], [8176, 8176], [1, 2])}}},
        "server": {"start_s": 5.0, "lengths": {"8192": {"cold": run([205, 215], [0, 0], [1, 2]), "reset_ok": True,
                                                        "warm": run([24, 26, 30], [8176] * 3, [1, 2]),
                                                        "own_gpu_hit": run([15, 16, 17], [8176] * 3, [1, 2])}}},
        "embedded": {"start_s": 5.0, "lengths": {"8192": {"cold": run([205], [0], [1, 2]), "reset_ok": True,
                                                          "warm": run([40], [8176], [1, 2]),
                                                          "own_gpu_hit": run([32], [8176], [1, 2])}}},
        # no ratio where it would mislead: other answers, blocks loaded meanwhile, no reset
        "server_instep": {"start_s": 5.0, "lengths": {"8192": {"cold": run([205], [0], [1, 2]), "reset_ok": True,
                                                               "warm": run([40], [8176], [1, 2]),
                                                               "own_gpu_hit": run([32], [8176], [1, 3])}}},
        "server_async": {"start_s": 5.0, "lengths": {"8192": {"cold": run([205], [0], [1, 2]), "reset_ok": True,
                                                              "warm": run([40], [8176], [1, 2]),
                                                              "own_gpu_hit": run([32], [8176], [1, 2]),
                                                              "own_gpu_hit_counters": {"vllm:pegaflow_loaded_blocks": 3.0}}}},
        "embedded_instep": {"start_s": 5.0, "lengths": {"8192": {"cold": run([205], [0], [1, 2]), "reset_ok": False,
                                                                 "warm": run([20], [8176], [1, 2]),
                                                                 "own_gpu_hit": run([32], [8176], [1, 2])}}},
    }
    s = ttft.summarize(results, [8192], 131072, 55.0)
    floor = s["server"]["8k"]["line_floor_ms"]  # 19.52 ms, above the server process's GPU hit
    assert s["server"]["8k"]["own_gpu_hit_p50_ms"] == 16
    assert s["server"]["8k"]["warm_vs_own_bound"] == pytest.approx(26 / floor, abs=1e-3)
    assert s["server"]["8k"]["own_gpu_hit_identical"] is True
    assert s["embedded"]["8k"]["warm_vs_own_bound"] == pytest.approx(40 / 32, abs=1e-3)  # its GPU hit above the floor
    assert s["server_instep"]["8k"]["own_gpu_hit_identical"] is False
    assert s["server_instep"]["8k"]["warm_vs_own_bound"] is None
    assert s["server_async"]["8k"]["own_gpu_hit_loaded_blocks"] == 3
    assert s["server_async"]["8k"]["warm_vs_own_bound"] is None
    assert s["embedded_instep"]["8k"]["warm_vs_own_bound"] is None
    assert "own_gpu_hit_p50_ms" not in s["none"]["8k"]
    medians = ttft.rounds_summary(s, [8192])
    assert medians["server"]["8k"]["warm_vs_own_bound_median"] == pytest.approx(26 / floor, abs=1e-3)
    assert medians["server"]["8k"]["own_gpu_hit_p50_median"] == 16

def test_summary_splits_each_answer_at_vllms_queued_event(tmp_path, capsys):
    """Each answer's TTFT split at QUEUED (vLLM's own time before it, then QUEUED to the first
    token), p50s per phase; the 1.2x ratio read from QUEUED on against the larger of the
    process's own GPU hit taken the same way and the line floor; an earlier report summarized
    again from its raw records (--summarize), a report without them refused by name."""
    import json

    def timed(ttfts, before, queued):
        return [{"ttft_ms": t, "cached_tokens": 8176, "token_ids": [1, 2], "queued_ms": queued,
                 "scheduled_to_first_ms": t - b - queued} for t, b in zip(ttfts, before)]

    raw = {
        "none": {"start_s": 1.0, "lengths": {"8192": {"cold": run([200], [0], [1, 2]),
                                                      "gpu_hit": timed([14, 15, 16], [2.0, 3.0, 2.5], 0.02)}}},
        "server": {"start_s": 1.0, "lengths": {"8192": {"cold": run([205], [0], [1, 2]), "reset_ok": True,
                                                        "warm": timed([23.0, 24.0, 25.0], [1.0, 2.5, 3.0], 0.01),
                                                        "own_gpu_hit": timed([13, 14, 15], [2, 2, 2], 0.01)}}},
    }
    s = ttft.summarize(raw, [8192], 131072, 55.0)
    hit, warm = s["none"]["8k"], s["server"]["8k"]
    assert (hit["gpu_hit_before_queued_p50_ms"], hit["gpu_hit_from_queued_p50_ms"]) == (2.5, 12.0)
    # per answer: 22.0, 21.5, 22.0 from QUEUED; 1.0, 2.5, 3.0 before it
    assert (warm["warm_before_queued_p50_ms"], warm["warm_from_queued_p50_ms"]) == (2.5, 22.0)
    assert (warm["warm_queued_p50_ms"], warm["warm_scheduled_to_first_p50_ms"]) == (0.01, 21.99)
    assert (hit["gpu_hit_queued_p50_ms"], hit["gpu_hit_scheduled_to_first_p50_ms"]) == (0.02, 11.98)
    floor = warm["line_floor_ms"]  # above the process's own GPU hit from QUEUED (12 ms)
    assert warm["warm_from_queued_vs_own_bound"] == pytest.approx(22.0 / floor, abs=1e-3)
    assert warm["warm_vs_own_bound"] == pytest.approx(24.0 / floor, abs=1e-3)
    # answers without vLLM's request times: nothing split, no ratio from QUEUED
    untimed = {"server": {"start_s": 1.0, "lengths": {"8192": {"cold": run([205], [0], [1, 2]), "reset_ok": True,
                                                               "warm": run([24], [8176], [1, 2]),
                                                               "own_gpu_hit": run([14], [8176], [1, 2])}}}}
    row = ttft.summarize(untimed, [8192], 131072, 55.0)["server"]["8k"]
    assert not [k for k in row if "queued" in k and ("before" in k or "from" in k)]
    # an earlier report, summarized again from its raw records
    report = tmp_path / "earlier.json"
    report.write_text(json.dumps({"raw": raw, "kv_bytes_per_token": 131072, "line_h2d_gbps": 55.0}))
    assert ttft.main(["--summarize", str(report)]) == 0
    again = json.loads(capsys.readouterr().out)["systems"]
    assert again["server"]["8k"]["warm_from_queued_p50_ms"] == 22.0
    bad = tmp_path / "load-only.json"
    bad.write_text(json.dumps({"systems": {}, "line_h2d_gbps": 55.0}))
    with pytest.raises(SystemExit, match="'raw'.*this one has line_h2d_gbps, systems"):
        ttft.main(["--summarize", str(bad)])
    with pytest.raises(SystemExit, match="missing.json"):
        ttft.main(["--summarize", str(tmp_path / "missing.json")])
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"raw": {"server": {"lengths": {"8k": {}}}}, "kv_bytes_per_token": 131072}))
    with pytest.raises(SystemExit, match="raw length '8k'; expected prompt lengths in tokens"):
        ttft.main(["--summarize", str(odd)])


def test_profile_summary_parts_a_saves_copies_from_the_decode_steps(tmp_path):
    """A cold request's trace: the save's device-to-host copies (8 MiB slots, another stream) run
    beside the first decode steps. They are not steps; each step's token copy waited behind them
    (launched at the step's end, started after the save's copy), and decode_steps_first says so."""
    import gzip
    import json

    from pegaflow.bench.profile_summary import summarize

    ev = [{"ts": 0.0, "cat": "cpu_op", "name": "start", "dur": 1}]
    ev.append({"ts": 1000.0, "dur": 100, "cat": "kernel", "name": "flash_fwd_kernel", "args": {"stream": 7}, "tid": 7})
    token_at = [2000.0, 14000.0, 26000.0, 37000.0]  # the first token, then three decode steps
    for i, t in enumerate(token_at):
        ev.append({"ts": t, "dur": 2, "cat": "gpu_memcpy", "tid": 7, "name": "Memcpy DtoH (Device -> Pinned)",
                   "args": {"bytes": 8, "correlation": 100 + i}})
        launched = t - (1500 if i in (1, 2) else 10)  # the first two decode steps' copies waited 1.5 ms
        ev.append({"ts": launched, "dur": 3, "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "tid": 1,
                   "args": {"correlation": 100 + i}})
    for k in range(40):  # the save: 8 MiB copies on stream 21 from 2.1 ms to 22.1 ms, gathers beside them
        ev.append({"ts": 2100.0 + 500 * k, "dur": 500, "cat": "gpu_memcpy", "tid": 21,
                   "name": "Memcpy DtoH (Device -> Pinned)", "args": {"bytes": 8 << 20}})
        ev.append({"ts": 2100.0 + 500 * k, "dur": 10, "cat": "kernel", "name": "pega_copy", "args": {"stream": 22}})
    for step in range(3):
        ev.append({"ts": 3000.0 + 12000 * step, "dur": 6000, "cat": "kernel", "name": "gemv", "args": {"stream": 7}, "tid": 7})
        # the step's input copy to the device: the first step's waited 0.8 ms behind the save's copies
        ev.append({"ts": 2900.0 + 12000 * step, "dur": 5, "cat": "gpu_memcpy", "tid": 7, "name": "Memcpy HtoD (Pinned -> Device)",
                   "args": {"bytes": 64, "correlation": 200 + step}})
        ev.append({"ts": 2900.0 + 12000 * step - (800 if step == 0 else 20), "dur": 3, "cat": "cuda_runtime",
                   "name": "cudaMemcpyAsync", "tid": 1, "args": {"correlation": 200 + step}})
    path = tmp_path / "cold-8192.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)
    s = summarize(str(path), layers=1)
    assert s["decode_steps"]["count"] == 3  # 40 save copies, none a step
    first = s["decode_steps_first"]
    assert [r["interval_ms"] for r in first] == [12.0, 12.0, 11.0]
    assert [r["token_copy_wait_ms"] for r in first] == [1.5, 1.5, 0.01]
    assert [r["save_dtoh_ms"] for r in first] == [11.9, 8.1, 0.0]  # the save ends at 22.1 ms
    assert [r["gpu_busy_ms"] for r in first] == [6.0, 6.0, 6.0]
    assert [r["input_copy_wait_ms"] for r in first] == [0.8, 0.02, 0.02]
    assert first[0]["copy_kernel_ms"] == 0.24


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


def test_profile_summary_reads_a_trace(tmp_path):
    """The profile summary finds each layer's attention start, the first token's copy to the host
    and the load's copy kernels per stream (with their first launch) in a chrome trace."""
    import gzip
    import json

    from pegaflow.bench.profile_summary import main, summarize

    ev = [{"ts": 1000.0, "cat": "cpu_op", "name": "start", "dur": 1}]
    for i in range(3):  # three layers, 2 ms apart from 5 ms on
        ev.append({"ts": 1000.0 + 5000 + 2000 * i, "dur": 100, "cat": "kernel",
                   "name": "void cutlass::device_kernel<flash::enable_sm90_or_later<x>>", "args": {"stream": 7}})
    for i, (stream, start) in enumerate([(9, 3000), (9, 4000), (11, 3500)]):
        ev.append({"ts": 1000.0 + start, "dur": 500, "cat": "kernel", "name": "pega_copy",
                   "args": {"stream": stream, "grid": [64 * (i + 1), 1, 1], "correlation": 50 + i}})
        ev.append({"ts": 1000.0 + start - 200, "dur": 5, "cat": "cuda_driver", "name": "cuLaunchKernel",
                   "args": {"correlation": 50 + i}})
    ev.append({"ts": 1000.0 + 10500, "dur": 2, "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)"})
    for i in range(4):  # the copy engine's copies on stream 13; one on the attention's stream is the step's own input
        ev.append({"ts": 1000.0 + 2000 + 1000 * i, "dur": 250, "cat": "gpu_memcpy", "tid": 13,
                   "name": "Memcpy HtoD (Pinned -> Device)", "args": {"bytes": 1_625_000}})
    ev.append({"ts": 1000.0 + 1000, "dur": 10, "cat": "gpu_memcpy", "tid": 7, "name": "Memcpy HtoD (Pinned -> Device)",
               "args": {"correlation": 80}})
    ev.append({"ts": 1000.0 + 400, "dur": 3, "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "tid": 1,
               "args": {"correlation": 80}})  # launched 0.6 ms before it ran: held behind other copies
    ev[1]["tid"] = ev[2]["tid"] = ev[3]["tid"] = 7
    for i, d in enumerate([5, 6, 90, 7]):  # the forward's thread (most cpu_ops) launches; one slow
        ev.append({"ts": 1000.0 + 4000 + 100 * i, "dur": d, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 1})
        ev.append({"ts": 1000.0 + 4000 + 100 * i, "dur": 20, "cat": "cpu_op", "name": "aten::mul_", "tid": 1})
    ev.append({"ts": 1000.0 + 4500, "dur": 900, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 2})
    ev.append({"ts": 1000.0 + 11000, "dur": 900, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 1})
    for step in range(2):  # two decode steps after the first token: 20 ms each, 1.5 ms of kernels on stream 7
        ev.append({"ts": 1000.0 + 30500 + 20000 * step, "dur": 2, "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)"})
        for k in range(3):
            ev.append({"ts": 1000.0 + 12000 + 20000 * step + 1000 * k, "dur": 500, "cat": "kernel", "name": "gemv",
                       "args": {"stream": 7}})
    path = tmp_path / "warm-16384.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)
    s = summarize(str(path), layers=3)
    assert s["decode_steps"] == {"count": 2, "interval_ms_p50": 20.0, "gpu_busy_ms_p50": 1.5, "kernels_p50": 3}
    assert s["first_forward_attention_kernel_starts_by_layer"] == [5.0, 7.0, 9.0]
    assert s["first_token_to_host_copy"] == 10.5
    c = s["load_copy_kernels"]
    assert (c["count"], c["first_launch"], c["first_start"], c["last_end"], c["busy_ms"]) == (3, 2.8, 3.0, 4.5, 1.5)
    assert c["streams"]["9"] == {"count": 2, "first_start": 3.0, "last_end": 4.5, "grids": [64, 128]}
    assert s["load_memcpys"] == {"count": 4, "first_start": 2.0, "last_end": 5.25, "busy_ms": 1.0,
                                 "idle_gaps": [[2.25, 0.75], [3.25, 0.75], [4.25, 0.75]],
                                 "idle_ms": 2.25, "short_gaps": 0, "short_gaps_ms": 0.0,
                                 "bytes": 6_500_000, "gbps_over_span": 2.0}  # 6.5 MB over 3.25 ms
    assert s["step_input_copies"] == {"count": 1, "max_wait_ms": 0.6, "worst_launched": 0.4, "total_wait_ms": 0.6}
    # the forward's thread only, before the first token's copy: 5, 6, 7, 90 us
    assert s["forward_launch_us"] == {"count": 4, "median": 7, "mean": 27.0}
    assert main([]) == 2


def test_profile_summary_says_when_the_profiler_held_the_loads_first_copy(tmp_path):
    """CUPTI's own stops ("overhead" records) before the first token's copy are listed, and one
    that ended just before the load's first copy is said to have held it (the first byte seen
    late in a trace is then the profiler's); a stop long before the copy holds nothing."""
    import gzip
    import json

    from pegaflow.bench.profile_summary import summarize

    attn = "void cutlass::device_kernel<flash::enable_sm90_or_later<x>>"

    def trace(stop_end_us):
        ev = [{"ts": 0.0, "cat": "cpu_op", "name": "start", "dur": 1},
              {"ts": 9000.0, "dur": 100, "cat": "kernel", "name": attn, "tid": 7, "args": {"stream": 7}},
              {"ts": 9500.0, "dur": 2, "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)"},
              {"ts": stop_end_us - 1400.0, "dur": 1400, "cat": "overhead", "name": "Activity Buffer Request", "tid": 0},
              {"ts": 20000.0, "dur": 50, "cat": "overhead", "name": "Activity Buffer Request", "tid": 0}]  # after the token
        for i in range(2):  # the load's copies from 5 ms on, on their own stream
            ev.append({"ts": 5000.0 + 600 * i, "dur": 500, "cat": "gpu_memcpy", "tid": 13,
                       "name": "Memcpy HtoD (Pinned -> Device)", "args": {"bytes": 1 << 20}})
        path = tmp_path / f"warm-{stop_end_us}.json.gz"
        with gzip.open(path, "wt") as f:
            json.dump({"traceEvents": ev}, f)
        return summarize(str(path), layers=1)["profiler_stalls"]

    assert trace(4910) == {"stops": [[3.51, 1.4]], "ms": 1.4, "held_first_load_copy": True}
    assert trace(3000)["held_first_load_copy"] is False  # ended 2 ms before the copy
    assert trace(5100)["held_first_load_copy"] is False  # still running when the copy began


def test_profile_summary_says_what_set_each_layers_attention_going(tmp_path):
    """Layer 0's attention starts as vLLM's thread launches it (the host sets the pace), layer 1's
    as the GEMM before it on the stream ends, long after its launch (the GPU's compute), layer 2's
    after both (a wait on the stream, such as a layer's load)."""
    import gzip
    import json

    from pegaflow.bench.profile_summary import summarize

    ev = [{"ts": 0.0, "cat": "cpu_op", "name": "start", "dur": 1}]

    def kernel(ts, dur, name, corr):
        ev.append({"ts": ts, "dur": dur, "cat": "kernel", "name": name, "tid": 7, "args": {"stream": 7, "correlation": corr}})

    def launch(ts, corr):
        ev.append({"ts": ts, "dur": 4, "cat": "cuda_runtime", "name": "cudaLaunchKernelExC", "tid": 1,
                   "args": {"correlation": corr}})

    attn = "void cutlass::device_kernel<flash::enable_sm90_or_later<x>>"
    kernel(1000.0, 100, "gemm", 1), launch(990.0, 1)
    kernel(1500.0, 100, attn, 2), launch(1490.0, 2)  # 0.4 ms after the GEMM: waited for its launch
    kernel(1700.0, 800, "gemm", 3), launch(1650.0, 3)
    kernel(2500.0, 100, attn, 4), launch(1800.0, 4)  # launched 0.7 ms before; started as the GEMM ended
    kernel(2700.0, 100, "gemm", 5), launch(2650.0, 5)
    kernel(3400.0, 100, attn, 6), launch(2900.0, 6)  # after its launch and the GEMM's end: a stream wait
    path = tmp_path / "warm-8192.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)
    paced = summarize(str(path), layers=3)["first_forward_layer_pacing"]
    assert paced == {"launch_to_start_ms": [0.01, 0.7, 0.5], "after_previous_ms": [0.4, 0.0, 0.6],
                     "set_by": {"host": 1, "gpu": 1, "other": 1}}


def test_a_failed_api_servers_excerpt_keeps_the_root_cause_above_its_end():
    """vLLM's engine core prints the root cause, then the API server's own long traceback ends the
    log ("See root cause above"): the excerpt keeps the first traceback's start and the end."""
    from pegaflow.bench.openai_http import log_excerpt

    cause = ("(EngineCore pid=7) Traceback (most recent call last):\n"
             "(EngineCore pid=7) pegaflow.errors.InvalidArgumentError: the root cause\n")
    api = "".join(f"(APIServer pid=6)   File \"x.py\", line {i}, in f\n" for i in range(200))
    text = "INFO starting\n" + cause + "(APIServer pid=6) Traceback (most recent call last):\n" + api + \
        "(APIServer pid=6) RuntimeError: Engine core initialization failed. See root cause above.\n"
    out = log_excerpt(text)
    assert out.startswith("(EngineCore pid=7) Traceback") and "the root cause" in out
    assert out.endswith("See root cause above.\n")
    short = "INFO\n" + cause
    assert log_excerpt(short) == short  # all of it is the tail already: nothing twice


def test_profile_summary_lists_where_the_loads_copy_engine_stood_idle():
    """Gaps of 0.1 ms or more between the load's copies (overlapping copies merged), where they
    began and how long: a paced lead's turn between layers, or its thread not queuing."""
    from pegaflow.bench.profile_summary import idle_gaps

    copies = [{"ts": 0.0, "dur": 150}, {"ts": 100.0, "dur": 100},  # overlapping: one stretch to 200 us
              {"ts": 250.0, "dur": 100},  # 50 us later: too short to list
              {"ts": 2750.0, "dur": 150}]  # 2.4 ms idle
    assert idle_gaps(copies, lambda us: round(us / 1e3, 2)) == [[0.35, 2.4]]
    assert idle_gaps([], lambda us: us) == []
    from pegaflow.bench.profile_summary import idle_total
    assert idle_total(copies) == {"idle_ms": 2.45, "short_gaps": 1, "short_gaps_ms": 0.05}
    assert idle_total([]) == {"idle_ms": 0.0, "short_gaps": 0, "short_gaps_ms": 0.0}


def test_profile_summary_times_the_first_tokens_copy_beside_a_save(tmp_path):
    """In a cold trace the first token's copy to the host (on the attention's stream) may wait
    behind the save's device-to-host copies on other streams: its wait from launch to start and
    the other copies that ran meanwhile."""
    import gzip
    import json

    from pegaflow.bench.profile_summary import summarize

    ev = [{"ts": 0.0, "cat": "cpu_op", "name": "start", "dur": 1, "tid": 1}]
    ev.append({"ts": 2000.0, "dur": 100, "cat": "kernel", "tid": 7,
               "name": "void cutlass::device_kernel<flash::enable_sm90_or_later<x>>", "args": {"stream": 7}})
    for i in range(3):  # the save: 4 ms of 8 MiB copies to the host on stream 13 from 2.5 ms on
        ev.append({"ts": 2500.0 + 1500 * i, "dur": 1300, "cat": "gpu_memcpy", "tid": 13,
                   "name": "Memcpy DtoH (Device -> Pinned)", "args": {"bytes": 8 << 20}})
    ev.append({"ts": 3000.0, "dur": 3, "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "tid": 1,
               "args": {"correlation": 90}})
    # the token ids, on vLLM's output-copy stream (the V2 model runner's), not the attention's
    ev.append({"ts": 7000.0, "dur": 2, "cat": "gpu_memcpy", "tid": 15, "name": "Memcpy DtoH (Device -> Pinned)",
               "args": {"correlation": 90, "bytes": 8}})
    path = tmp_path / "cold-16384.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)
    s = summarize(str(path), layers=1)
    assert s["first_token_copy"] == {"launched": 3.0, "wait_ms": 4.0, "other_dtoh_copies_meanwhile": 3,
                                     "other_dtoh_busy_ms": 3.9}
    assert s["first_token_to_host_copy"] == 7.0  # the token's copy, not the save's first


def test_profile_summary_places_the_hooks_in_vllms_step(tmp_path):
    """The named ranges (the ttft worker's ``vllm.*`` around the engine step's parts, the
    connector's ``pegaflow.*`` hooks) up to the end of the step whose token was copied first:
    counted, first start, last end and time in them; the next step's are left out."""
    import gzip
    import json

    from pegaflow.bench.profile_summary import step_ranges, summarize

    def rng(name, start, dur):
        return {"ts": start, "dur": dur, "cat": "user_annotation", "name": name, "tid": 1}

    ev = [{"ts": 0.0, "cat": "cpu_op", "name": "start", "dur": 1, "tid": 1},
          rng("vllm.schedule", 100.0, 900), rng("pegaflow.get_num_new_matched_tokens", 200.0, 300),
          rng("vllm.execute_model", 1100.0, 2000), rng("pegaflow.start_load_kv", 1500.0, 100),
          rng("pegaflow.wait_for_layer_load", 1700.0, 50), rng("pegaflow.wait_for_layer_load", 1800.0, 70),
          rng("vllm.sample_tokens", 3200.0, 400), rng("vllm.update_from_output", 3700.0, 200),
          rng("vllm.schedule", 4000.0, 100), rng("vllm.update_from_output", 4200.0, 100),
          {"ts": 2000.0, "dur": 100, "cat": "kernel", "tid": 7, "args": {"stream": 7},
           "name": "void cutlass::device_kernel<flash::enable_sm90_or_later<x>>"},
          {"ts": 3500.0, "dur": 2, "cat": "gpu_memcpy", "tid": 15, "name": "Memcpy DtoH (Device -> Pinned)",
           "args": {"bytes": 8}}]
    path = tmp_path / "warm-8192.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)
    r = summarize(str(path), layers=1)["step_ranges"]
    assert r["vllm.schedule"] == {"count": 1, "first_start": 0.1, "last_end": 1.0, "total_ms": 0.9, "longest_ms": 0.9}
    assert r["pegaflow.wait_for_layer_load"] == {"count": 2, "first_start": 1.7, "last_end": 1.87, "total_ms": 0.12,
                                                 "longest_ms": 0.07}
    assert r["vllm.update_from_output"]["last_end"] == 3.9
    assert step_ranges(ev, None)["vllm.schedule"]["count"] == 1  # no token copy: the first update ends it
    assert step_ranges([e for e in ev if e["name"] != "vllm.update_from_output"], 3500.0) == {}


def test_profile_summary_says_what_the_forwards_thread_did_on_the_host():
    """Inside the first vllm.execute_model range, the same thread's outermost operators by name
    (their children and other threads' operators are not counted again) and the time between them."""
    from pegaflow.bench.profile_summary import execute_model_host_ops

    def op(name, start, dur, tid=1):
        return {"ts": start, "dur": dur, "cat": "cpu_op", "name": name, "tid": tid, "pid": 9}

    ev = [{"ts": 1000.0, "dur": 1000, "cat": "user_annotation", "name": "vllm.execute_model", "tid": 1, "pid": 9},
          op("aten::linear", 1100.0, 100), op("aten::mm", 1110.0, 50),  # mm inside linear
          op("aten::linear", 1300.0, 100), op("vllm::unified_attention_with_output", 1500.0, 300),
          {"ts": 1600.0, "dur": 50, "cat": "user_annotation", "name": "pegaflow.wait_for_layer_load", "tid": 1, "pid": 9},
          op("aten::linear", 1200.0, 500, tid=2),  # another thread
          op("aten::linear", 2500.0, 100)]  # after the range
    r = execute_model_host_ops(ev)
    assert r == {"execute_model_ms": 1.0, "gaps_ms": 0.5,
                 "ops": {"vllm::unified_attention_with_output": {"count": 1, "ms": 0.3},
                         "aten::linear": {"count": 2, "ms": 0.2}}}
    assert execute_model_host_ops([op("aten::linear", 0.0, 1)]) == {}


def test_instepa_systems_need_async_scheduling_off():
    """load_at_alloc stays off under vLLM's asynchronous scheduling, so a *_instepa system run
    without --async-scheduling off would be *_instep under another name: refused, naming the flag."""
    import pytest

    from pegaflow.bench.ttft import main

    with pytest.raises(SystemExit, match="<system>_instepa, _instepl, _instepk, _instepz, _instepp, _instepx, _instepx2, _instepxh, _instepxk, _instepxs, _instepxp, _instepxq, _instepxu, _instepxb, _instepxc, _instepxr3, _instepxr5, _instepxr7, _instepxr8, _instepxbr5, _instepaw and _instepab need --async-scheduling off.*got --async-scheduling auto"):
        main(["--lengths", "256", "--systems", "none,embedded_instepa"])


def test_instepy_stages_loads_without_loads_at_allocation(tmp_path):
    """_instepy: loads staged at their lookup (PEGAFLOW_PRESTAGE_MIB) but started in the step, so
    it runs under vLLM's asynchronous scheduling (no --async-scheduling off needed); _asyncx: the
    same staging for asynchronous loads."""
    from types import SimpleNamespace

    from pegaflow.bench.ttft import Systems

    systems = Systems(SimpleNamespace(pool_size="1gb", pegaflow_site="", vllm_site="", pool_dir=str(tmp_path)), tmp_path)
    assert systems.env("server_instepy")["PEGAFLOW_PRESTAGE_MIB"] == (ttft.os.environ.get("PEGAFLOW_PRESTAGE_MIB") or "4096")
    kv, stop = systems.start("embedded_instepy")
    stop()
    extra = kv["kv_connector_extra_config"]
    assert extra["load_in_step"] is True and "load_at_alloc" not in extra
    assert systems.env("embedded_asyncx")["PEGAFLOW_PRESTAGE_MIB"] == systems.env("server_instepy")["PEGAFLOW_PRESTAGE_MIB"]
    kv, stop = systems.start("embedded_asyncx")
    stop()
    assert kv["kv_connector_extra_config"]["load_in_step"] is False  # asynchronous loads, staged


def test_without_a_gpu_the_staged_variants_take_a_small_host_buffer(tmp_path, monkeypatch):
    """Without a GPU the host engine's staging buffer is host memory beside vLLM's CPU KV cache:
    the staged variants take CPU_STAGED_MIB there, not the GPU's 4 GiB, unless the caller set
    PEGAFLOW_PRESTAGE_MIB; other variants' environments are untouched."""
    from types import SimpleNamespace

    from pegaflow.bench.ttft import CPU_STAGED_MIB, Systems

    args = SimpleNamespace(pool_size="1gb", pegaflow_site="", vllm_site="", pool_dir=str(tmp_path))
    monkeypatch.delenv("PEGAFLOW_PRESTAGE_MIB", raising=False)
    cpu = Systems(args, tmp_path, gpu=False)
    assert cpu.env("server_asyncx")["PEGAFLOW_PRESTAGE_MIB"] == cpu.env("embedded_instepx")["PEGAFLOW_PRESTAGE_MIB"] == CPU_STAGED_MIB
    assert "PEGAFLOW_PRESTAGE_MIB" not in cpu.env("server_instepp")
    assert Systems(args, tmp_path).env("server_asyncx")["PEGAFLOW_PRESTAGE_MIB"] == ttft.VARIANT_ENV["asyncx"]["PEGAFLOW_PRESTAGE_MIB"]
    monkeypatch.setenv("PEGAFLOW_PRESTAGE_MIB", "64")
    assert cpu.env("server_asyncx")["PEGAFLOW_PRESTAGE_MIB"] == "64"  # the caller's own value


def test_the_lowttft_variants_set_the_preset_and_nothing_else(tmp_path):
    """_lowttft: the connector's preset low_ttft as a user asks for it (PEGAFLOW_PRESET), no
    setting of the bench's own, so the preset's defaults are what runs."""
    from types import SimpleNamespace

    from pegaflow.bench.ttft import Systems

    systems = Systems(SimpleNamespace(pool_size="1gb", pegaflow_site="", vllm_site="", pool_dir=str(tmp_path)), tmp_path)
    assert systems.env("server_lowttft")["PEGAFLOW_PRESET"] == "low_ttft"
    assert systems.env("embedded_lowttft").get("PEGAFLOW_PRESTAGE_MIB") == ttft.os.environ.get("PEGAFLOW_PRESTAGE_MIB")
    kv, stop = systems.start("embedded_lowttft")
    stop()
    assert kv["kv_connector_extra_config"] == {"mode": "embedded", "pool_size": "1gb", "cross_layer_blocks": True}


@pytest.mark.parametrize("system, env, value", [("instepaw", "PEGAFLOW_WARM_UP", "0"),
                                                 ("instepab", "PEGAFLOW_BEGIN_AT_LOOKUP", "0"),
                                                 ("instepk", "PEGAFLOW_CUDA_LAYER_LEAD_MIB", "1024"),
                                                 ("instepz", "PEGAFLOW_CUDA_LAYER_LEAD_MIB", "16384"),
                                                 ("instepl", "PEGAFLOW_CUDA_LAYER_LEAD_MIB", "160"),
                                                 ("instepp", "PEGAFLOW_CUDA_LAYER_LEAD_PACED", "1"),
                                                 ("instepx", "PEGAFLOW_PRESTAGE_MIB", "4096"),
                                                 ("instepx", "PEGAFLOW_CUDA_LAYER_LEAD_PACED", "1"),
                                                 ("instepx2", "PEGAFLOW_PRESTAGE_DEPTH", "2"),
                                                 ("instepx2", "PEGAFLOW_PRESTAGE_MIB", "4096"),
                                                 ("instepxh", "PEGAFLOW_PRESTAGE_MIB", "4096"),
                                                 ("instepxh", "PEGAFLOW_JVM_OPTIONS", "-Xms192m -Xmn128m"),
                                                 ("instepxk", "PEGAFLOW_CUDA_SAVE_KERNEL_BLOCKS", "16"),
                                                 ("instepxk", "PEGAFLOW_PRESTAGE_MIB", "4096"),
                                                 ("instepxs", "PEGAFLOW_CUDA_BOUNCE_MIB", "2"),
                                                 ("instepxp", "PEGAFLOW_CUDA_SAVE_PACE", "1"),
                                                 ("instepxq", "PEGAFLOW_CUDA_SAVE_PACE", "2"),
                                                 ("instepxu", "PEGAFLOW_CUDA_SAVE_PACE", "0")])
def test_instepa_variants_set_one_variable_in_their_vllm_process(tmp_path, system, env, value):
    """The A/B arms of _instepa: _instepaw without the JVM's warm-ups (PEGAFLOW_WARM_UP=0), _instepl
    and _instepk with a held load's first 160 MiB / GiB led by the copy kernel (all of an 8K
    load, half of a 16K one), _instepz with all of it (the lead's cap, 16 GiB), _instepp all of it paced through the copy engine
    (with PEGAFLOW_CUDA_LAYER_LEAD_MIB=16384), _instepx that with loads staged at their lookup in 4 GiB
    (PEGAFLOW_PRESTAGE_MIB), _instepx2 that with two layers of the staging in flight (PEGAFLOW_PRESTAGE_DEPTH),
    _instepxh with a young generation of 128 MiB in its JVM (PEGAFLOW_JVM_OPTIONS), _instepxk with saves on 16 thread
    blocks of the copy kernel (PEGAFLOW_CUDA_SAVE_KERNEL_BLOCKS), _instepxs with saves in copies of 1 MiB
    (PEGAFLOW_CUDA_BOUNCE_MIB=2), _instepxp / _instepxq / _instepxu with one / two / all save copies on the copy
    engine at a time (PEGAFLOW_CUDA_SAVE_PACE); the variable in that vLLM process's environment only,
    loads at allocation, refused under asynchronous scheduling like _instepa."""
    from types import SimpleNamespace

    from pegaflow.bench.ttft import Systems, main

    args = SimpleNamespace(pool_size="1gb", pegaflow_site="", vllm_site="", pool_dir=str(tmp_path))
    systems = Systems(args, tmp_path)
    assert systems.env(f"embedded_{system}")[env] == value
    assert systems.env("embedded_instepa").get(env) == ttft.os.environ.get(env)
    kv, stop = systems.start(f"embedded_{system}")
    stop()
    extra = kv["kv_connector_extra_config"]
    assert extra["load_in_step"] is True and extra["load_at_alloc"] is True
    with pytest.raises(SystemExit, match="need --async-scheduling off"):
        main(["--lengths", "256", "--systems", f"none,server_{system}"])


def test_a_variants_jvm_options_come_after_the_callers(tmp_path, monkeypatch):
    """_instepxh's JVM options go after the caller's PEGAFLOW_JVM_OPTIONS (a GC log, say), so
    both apply; other systems keep the caller's alone."""
    from types import SimpleNamespace

    from pegaflow.bench.ttft import Systems

    args = SimpleNamespace(pool_size="1gb", pegaflow_site="", vllm_site="", pool_dir=str(tmp_path))
    monkeypatch.setenv("PEGAFLOW_JVM_OPTIONS", "-Xlog:gc:file=gc-%p.log")
    systems = Systems(args, tmp_path)
    assert systems.env("server_instepxh")["PEGAFLOW_JVM_OPTIONS"] == "-Xlog:gc:file=gc-%p.log -Xms192m -Xmn128m"
    assert systems.env("server_instepx")["PEGAFLOW_JVM_OPTIONS"] == "-Xlog:gc:file=gc-%p.log"


def test_instepb_loads_in_the_step_asking_for_its_plans_itself(tmp_path):
    """_instepb: _instep (no load at allocation, so any scheduling) with PEGAFLOW_BEGIN_AT_LOOKUP=0
    in its vLLM process: the A/B of a lookup that begins its load."""
    from types import SimpleNamespace

    from pegaflow.bench.ttft import Systems

    args = SimpleNamespace(pool_size="1gb", pegaflow_site="", vllm_site="", pool_dir=str(tmp_path))
    systems = Systems(args, tmp_path)
    assert systems.env("embedded_instepb")["PEGAFLOW_BEGIN_AT_LOOKUP"] == "0"
    kv, stop = systems.start("embedded_instepb")
    stop()
    extra = kv["kv_connector_extra_config"]
    assert extra["load_in_step"] is True and "load_at_alloc" not in extra


def test_summary_puts_cold_ttft_and_decode_beside_no_connector():
    """Cold requests' TTFT and their decode (mean time between tokens while saves go out), each
    against no connector's in the same run: the 1.02x and 1.05x targets read off the record."""
    def cold(ttfts, itls):
        return [{"ttft_ms": t, "itl_ms": i, "cached_tokens": 0, "token_ids": [1]} for t, i in zip(ttfts, itls)]

    results = {
        "none": {"lengths": {"8192": {"cold": cold([200, 210, 220], [10.0, 10.0, 12.0]),
                                      "gpu_hit": run([40, 50, 60], [8176] * 3, [1])}}},
        "server": {"lengths": {"8192": {"cold": cold([204, 214, 230], [10.5, 10.6, 11.0]), "reset_ok": True,
                                        "warm": run([60, 70, 80], [8176] * 3, [1]),
                                        "cold_threads": {"wall_s": 1.5, "main": {"cpu_s": 1.2}}}}},
        "vllm_native": {"lengths": {"8192": {"cold": run([205], [0], [1]), "warm": run([90], [8176], [1])}}},
    }
    s = ttft.summarize(results, [8192], 131072, 55.0)
    assert s["none"]["8k"]["cold_itl_p50_ms"] == 10.0
    assert s["server"]["8k"]["cold_vs_none"] == round(214 / 210, 3)
    assert s["server"]["8k"]["cold_itl_vs_none"] == round(10.6 / 10.0, 3)
    # a run whose answers carried no decode timestamps: no ratio made up for it
    assert s["vllm_native"]["8k"]["cold_itl_p50_ms"] is None
    assert "cold_itl_vs_none" not in s["vllm_native"]["8k"]
    # the worker's thread record rides along with its phase; none where the worker wrote none
    assert s["server"]["8k"]["cold_threads"] == {"wall_s": 1.5, "main": {"cpu_s": 1.2}}
    assert "warm_threads" not in s["server"]["8k"] and "cold_threads" not in s["none"]["8k"]


def test_cold_start_names_a_bad_pool_size():
    from pegaflow.bench.ttft import main

    with pytest.raises(SystemExit, match="--cold-start 'sixty'; expected a pool size such as 60gb"):
        main(["--lengths", "256", "--systems", "none", "--cold-start", "sixty"])


def test_max_tokens_must_be_positive():
    from pegaflow.bench.ttft import main

    with pytest.raises(SystemExit, match="--max-tokens 0; expected at least 1"):
        main(["--lengths", "256", "--systems", "none", "--max-tokens", "0"])


def test_worker_records_what_its_threads_did():
    """The ttft worker's thread record (read by path: the worker never imports pegaflow): this
    process's threads from /proc, and between two snapshots the main thread's CPU and context
    switches and the other threads' CPU by name, the busiest first."""
    import threading

    worker = _worker_module()
    me = threading.get_native_id()
    snap = worker.threads()
    assert me in snap and snap[me][1] >= 0 and snap[me][2] >= 0
    tick = __import__("os").sysconf("SC_CLK_TCK")
    # names as /proc gives them (15 characters): two save lanes' threads add up under one name;
    # thread 6's id was reused by a thread with less CPU (never below zero)
    before = {1: ("python", 0, 10, 1), 2: ("pegaflow-cuda-s", tick, 0, 0), 3: ("gone", 5, 0, 0),
              6: ("pegaflow-pin", 9 * tick, 0, 0)}
    after = {1: ("python", 2 * tick, 15, 4), 2: ("pegaflow-cuda-s", 4 * tick, 0, 0),
             4: ("pegaflow-cuda-s", tick, 0, 0), 5: ("idle", 0, 0, 0), 7: ("C2 CompilerThre", tick // 2, 0, 0),
             6: ("pool-1-thread-1", tick, 0, 0)}
    use = worker.thread_use(before, after, 1.23456, main_tid=1)
    half = round((tick // 2) / tick, 2)
    assert use == {"wall_s": 1.235, "main": {"cpu_s": 2.0, "voluntary_switches": 5, "involuntary_switches": 3},
                   "others_cpu_s": round(4.0 + half, 2),
                   "busiest_others_cpu_s": {"pegaflow-cuda-s": 4.0, "C2 CompilerThre": half}}


def test_worker_records_the_machine_and_its_cgroup_throttling():
    """Between two machine snapshots: the share of the CPUs busy and the cgroup's throttling; a
    snapshot of this machine reads /proc/stat."""
    worker = _worker_module()
    snap = worker.machine()
    assert snap["jiffies"] >= snap["busy_jiffies"] >= 0
    before = {"jiffies": 1000, "busy_jiffies": 100, "nr_throttled": 3, "throttled_usec": 5000}
    after = {"jiffies": 1400, "busy_jiffies": 200, "nr_throttled": 10, "throttled_usec": 45500}
    assert worker.machine_use(before, after) == {"busy_share": 0.25, "throttled_periods": 7, "throttled_ms": 40.5}
    # no cgroup v2 file: the share alone; no time passed: nothing
    assert worker.machine_use({"jiffies": 10, "busy_jiffies": 1}, {"jiffies": 20, "busy_jiffies": 6}) == {"busy_share": 0.5}
    assert worker.machine_use(snap, snap) == ({"throttled_periods": 0, "throttled_ms": 0.0} if "nr_throttled" in snap else {})


def test_summary_gives_the_connector_hooks_time_per_step():
    from pegaflow.bench.ttft import hook_ms_per_step

    moved = {"vllm:pegaflow_worker_steps": 20.0, "vllm:pegaflow_worker_hook_ns": 3.0e6,
             "vllm:pegaflow_scheduler_steps": 4.0, "vllm:pegaflow_scheduler_hook_ns": 10.0e6}
    assert hook_ms_per_step(moved) == {"scheduler": 2.5, "scheduler_steps": 4, "worker": 0.15, "worker_steps": 20}
    assert hook_ms_per_step({"vllm:pegaflow_worker_hook_ns": 5.0}) == {}


def test_summary_gives_a_warm_loads_phases_with_its_wait_for_the_compute_stream():
    warm_counters = {"vllm:pegaflow_in_step_loads": 2.0, "vllm:pegaflow_in_step_load_ns": 80e6,
                     "vllm:pegaflow_alloc_to_load_starts": 2.0, "vllm:pegaflow_alloc_to_load_ns": 30e6,
                     "vllm:pegaflow_load_fences": 2.0, "vllm:pegaflow_load_fence_ns": 24e6}
    results = {"embedded": {"start_s": 5.0, "lengths": {"8192": {
        "cold": run([205, 215], [0, 0], [1, 2]), "reset_ok": True, "warm": run([60, 70], [8176] * 2, [1, 2]),
        "warm_counters": warm_counters}}}}
    phases = ttft.summarize(results, [8192], 131072, None)["embedded"]["8k"]["warm_in_step_phases_ms"]
    assert phases["load"] == 40.0 and phases["alloc_to_start"] == 15.0 and phases["fence"] == 12.0
    assert phases["plan"] == 0.0  # a phase the run did not count
    assert "build" not in phases and "submit" not in phases  # an older jar's 14 counters: absent, not 0
    assert "first_copy" not in phases and "staged_share" not in phases
    warm_counters.update({"vllm:pegaflow_in_step_build_ns": 1.2e6, "vllm:pegaflow_in_step_submit_ns": 0.4e6,
                          "vllm:pegaflow_in_step_first_copy_ns": 5.0e6, "vllm:pegaflow_loads_staged": 1.0})
    phases = ttft.summarize(results, [8192], 131072, None)["embedded"]["8k"]["warm_in_step_phases_ms"]
    assert phases["build"] == 0.6 and phases["submit"] == 0.2 and phases["first_copy"] == 2.5
    assert phases["staged_share"] == 0.5  # one of the two loads read a staging (PEGAFLOW_PRESTAGE_MIB)
    assert ttft.summarize(results, [8192], 131072, None)["embedded"]["8k"]["warm_loads_staged"] == 1
    assert "warm_lookup_stagings" not in ttft.summarize(results, [8192], 131072, None)["embedded"]["8k"]  # an older jar


def test_summary_sets_a_warm_requests_phases_on_one_clock_from_its_queued_event():
    """warm_timeline_ms: the connector's lookup and allocation after each hit's QUEUED event
    (means over the timed hits), the load's end (allocation plus the in-step load, every load
    started at allocation), vLLM's first token (queued plus scheduled-to-first), and what came
    after the load; absent without the connector's counters or vLLM's times."""
    warm = run([23.0, 24.0], [7776] * 2, [1, 2])
    for x, (q, s2f) in zip(warm, ((0.03, 21.7), (0.05, 22.1))):
        x["queued_ms"], x["scheduled_to_first_ms"] = q, s2f
    counters = {"vllm:pegaflow_hits_timed": 2.0, "vllm:pegaflow_queued_to_lookup_ns": 0.4e6,
                "vllm:pegaflow_queued_to_alloc_ns": 1.6e6, "vllm:pegaflow_in_step_loads": 2.0,
                "vllm:pegaflow_in_step_at_alloc": 2.0, "vllm:pegaflow_in_step_load_ns": 38.3e6}
    results = {"embedded": {"start_s": 5.0, "lengths": {"8192": {
        "cold": run([205, 215], [0, 0], [1, 2]), "reset_ok": True, "warm": warm, "warm_counters": counters}}}}
    t = ttft.summarize(results, [8192], 131072, None)["embedded"]["8k"]["warm_timeline_ms"]
    assert t == {"lookup": 0.2, "alloc": 0.8, "landed": 19.95, "first_token": 21.94, "after_landed": 1.99}
    counters["vllm:pegaflow_in_step_at_alloc"] = 1.0  # one load timed from its step instead: no load end on this clock
    t = ttft.summarize(results, [8192], 131072, None)["embedded"]["8k"]["warm_timeline_ms"]
    assert "landed" not in t and "after_landed" not in t and t["first_token"] == 21.94
    del counters["vllm:pegaflow_hits_timed"]  # an older wheel, or vLLM's stats off
    assert "warm_timeline_ms" not in ttft.summarize(results, [8192], 131072, None)["embedded"]["8k"]


def test_summary_says_why_a_warm_lookup_staged_nothing():
    """The lookups' staging counters: a load begun at its lookup whose staging was refused says
    why (here one refused as too large for the buffer, one staged)."""
    warm_counters = {"vllm:pegaflow_begun_at_lookup": 2.0, "vllm:pegaflow_stagings": 1.0,
                     "vllm:pegaflow_staging_too_large": 1.0, "vllm:pegaflow_loads_staged": 1.0}
    results = {"server": {"start_s": 5.0, "lengths": {"8192": {
        "cold": run([205, 215], [0, 0], [1, 2]), "reset_ok": True, "warm": run([60, 70], [8176] * 2, [1, 2]),
        "warm_counters": warm_counters}}}}
    row = ttft.summarize(results, [8192], 131072, None)["server"]["8k"]
    assert row["warm_lookup_stagings"] == {"begun": 2, "staged": 1, "busy": 0, "too_large": 1, "failed": 0,
                                           "unavailable": 0, "not_begun_no_worker": 0, "not_begun_declined": 0}
    assert "warm_lookup_ms" not in row  # the phase counted no lookup
    warm_counters.update({"vllm:pegaflow_lookups": 2.0, "vllm:pegaflow_lookup_ns": 1.9e6})
    assert ttft.summarize(results, [8192], 131072, None)["server"]["8k"]["warm_lookup_ms"] == 0.95
    assert ttft.staging_counts({"vllm:pegaflow_lookups": 3.0}) == {}
    warm_counters.update({"vllm:pegaflow_staging_starts": 2.0, "vllm:pegaflow_staging_to_thread_ns": 0.2e6,
                          "vllm:pegaflow_staging_layout_ns": 0.6e6, "vllm:pegaflow_staging_to_first_ns": 3.0e6})
    row = ttft.summarize(results, [8192], 131072, None)["server"]["8k"]["warm_lookup_stagings"]
    assert (row["to_thread_ms"], row["layout_ms"], row["to_first_ms"]) == (0.1, 0.3, 1.5)  # means over the two that started
    assert "to_landed_ms" not in row  # no staging's first group was seen landed
    warm_counters.update({"vllm:pegaflow_staging_landed": 1.0, "vllm:pegaflow_staging_to_landed_ns": 2.5e6})
    row = ttft.summarize(results, [8192], 131072, None)["server"]["8k"]["warm_lookup_stagings"]
    assert row["to_landed_ms"] == 2.5  # over the one seen landed
    assert "paced_groups" not in row and "paced_gap_us" not in row  # an older wheel, or nothing paced
    warm_counters.update({"vllm:pegaflow_staging_paced_groups": 9.0, "vllm:pegaflow_staging_paced_gap_ns": 0.36e6})
    row = ttft.summarize(results, [8192], 131072, None)["server"]["8k"]["warm_lookup_stagings"]
    assert (row["paced_groups"], row["paced_gap_us"]) == (9.0, 40.0)  # the one staged load's groups; the mean gap


def test_overlap_refuses_a_negative_forward_delay():
    from pegaflow.bench.overlap import main

    with pytest.raises(SystemExit, match="--forward-delay-ms -1.0; expected 0 or more"):
        main(["--forward-delay-ms", "-1"])


def test_rounds_pair_each_system_with_no_connector_of_its_own_round():
    """With --rounds each round's decode is read against no connector's of the same round (run
    beside it), with the CPU probe's ratio, and the medians over rounds are reported."""
    def cold(itl, probe):
        return {"cold": [{"ttft_ms": 200.0, "itl_ms": itl, "cached_tokens": 0, "token_ids": [1]}],
                "cold_threads": {"cpu_probe": {"python_us": 1.0, "torch_us": probe}},
                "gpu_hit": run([40], [8176], [1]), "warm": run([60], [8176], [1]), "reset_ok": True}

    results = {"none": {"lengths": {"8192": cold(10.0, 100.0)}},
               "server": {"lengths": {"8192": cold(15.0, 150.0)}},
               "none@2": {"lengths": {"8192": cold(20.0, 200.0)}},
               "server@2": {"lengths": {"8192": cold(21.0, 200.0)}},
               "none@3": {"lengths": {"8192": cold(10.0, 100.0)}},
               "server@3": {"lengths": {"8192": cold(11.0, 100.0)}}}
    s = ttft.summarize(results, [8192], 131072, None)
    assert s["server@2"]["8k"]["cold_itl_vs_none"] == 1.05  # against none@2, not none
    assert s["server"]["8k"]["cold_cpu_probe_vs_none"] == 1.5
    assert s["none@2"]["8k"]["gpu_hit_p50_ms"] == 40 and s["none@2"]["8k"]["outputs_identical"] is True
    assert "cold_itl_vs_none" not in s["none@2"]["8k"]
    med = ttft.rounds_summary(s, [8192])
    assert med["server"]["8k"]["cold_itl_vs_none_rounds"] == [1.5, 1.05, 1.1]
    assert med["server"]["8k"]["cold_itl_vs_none_median"] == 1.1
    assert med["server"]["8k"]["cold_cpu_probe_vs_none_median"] == 1.0
    assert med["none"]["8k"]["cold_itl_p50_median"] == 10.0
    assert med["none"]["8k"]["gpu_hit_p50_rounds"] == [40, 40, 40]
    assert ttft.round_key("server", 1) == "server" and ttft.round_key("server", 3) == "server@3"
    assert ttft.split_key("server@3") == ("server", 3) and ttft.split_key("none") == ("none", 1)
    # a round whose process failed: None in its place, the median over the others
    del s["server@2"]
    med = ttft.rounds_summary(s, [8192])
    assert med["server"]["8k"]["cold_itl_vs_none_rounds"] == [1.5, None, 1.1]
    assert med["server"]["8k"]["cold_itl_vs_none_median"] == 1.3


def test_rounds_must_be_positive():
    from pegaflow.bench.ttft import main

    with pytest.raises(SystemExit, match="--rounds 0; expected at least 1"):
        main(["--lengths", "256", "--systems", "none", "--rounds", "0"])


def test_worker_cpu_probe_times_python_work():
    import importlib.util
    from pathlib import Path

    import pegaflow.bench

    path = Path(pegaflow.bench.__file__).with_name("ttft_worker.py")
    spec = importlib.util.spec_from_file_location("ttft_worker_probe", path)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    probe = worker.cpu_probe()
    assert probe["python_us"] > 0 and probe.get("torch_us", 1.0) > 0


def test_host_speed_samples_sit_beside_each_request():
    """pegaflow.bench.hostspeed: each sampler's spread, and each request of a ttft report with the
    median loop time of the samples taken while it ran (none where no sample fell in it)."""
    from pegaflow.bench import hostspeed

    report = {"raw": {"none": {"lengths": {"8192": {"cold": [
        {"ttft_ms": 200.0, "itl_ms": 15.0, "wall_ms": 1000.0, "began_s": 100.0, "token_ids": [1]},
        {"ttft_ms": 210.0, "itl_ms": 30.0, "wall_ms": 1000.0, "began_s": 102.0, "token_ids": [1]},
        {"ttft_ms": 205.0, "itl_ms": 20.0, "wall_ms": 100.0, "began_s": 110.0, "token_ids": [1]}]}}}}}
    samples = [{"t": 100.2, "cpu": 13, "us": 2000.0}, {"t": 100.6, "cpu": 14, "us": 2200.0},
               {"t": 102.5, "cpu": 13, "us": 4000.0}, {"t": 102.9, "cpu": 14, "us": 4400.0}]
    out = hostspeed.summarize(report, samples)
    assert out["samplers"]["13"] == {"samples": 2, "min_us": 2000.0, "p50_us": 3000.0, "max_us": 4000.0}
    rows = out["requests"]["none"]["8192/cold"]
    assert [r["host_loop_us"] for r in rows] == [2100.0, 4200.0, None]
    assert [r["itl_ms"] for r in rows] == [15.0, 30.0, 20.0]


def test_host_speed_sampler_writes_a_line_per_sample(tmp_path):
    from pegaflow.bench import hostspeed

    out = tmp_path / "host.jsonl"
    hostspeed.sample(str(out), 0.3, every_s=0.1)
    import json

    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) >= 2 and all(x["us"] > 0 and x["cpu"] >= 0 for x in lines)


def test_the_worker_ranges_vllms_step_parts_where_it_finds_them():
    """annotate_steps wraps the in-process engine core's step parts in profiler ranges (a call
    still returns what the method returns) and skips the parts it does not find."""
    import types

    import torch

    from pegaflow.bench.ttft_worker import annotate_steps

    class Scheduler:
        def schedule(self, *a):
            return ("scheduled", a)

    scheduler = Scheduler()
    core = types.SimpleNamespace(scheduler=scheduler)  # no model executor, no cache manager
    llm = types.SimpleNamespace(llm_engine=types.SimpleNamespace(engine_core=types.SimpleNamespace(engine_core=core)))
    assert annotate_steps(llm) == ["vllm.schedule"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        assert scheduler.schedule(1) == ("scheduled", (1,))
    assert any(e.name == "vllm.schedule" for e in prof.events())
    assert annotate_steps(types.SimpleNamespace(llm_engine=types.SimpleNamespace())) == []


def test_the_key_warm_up_report_takes_medians_over_processes():
    """keywarm's summary: per mode, the median over processes of the first chain, of each
    process's median chain before and after; a bad process count is refused naming it."""
    import pytest

    from pegaflow.bench.keywarm import main, summary

    rows = [{"first_8k_chain_ms": f, "chains_before_ms": [b, b + 2, b + 4], "next_16k_chains_ms": [a, a, 9.0],
             "warm_up_s": 0.2} for f, b, a in ((10.0, 1.0, 1.0), (30.0, 3.0, 2.0), (20.0, 5.0, 3.0))]
    assert summary(rows) == {"processes": 3, "first_8k_chain_ms_median": 20.0, "chains_before_ms_median": 5.0,
                             "next_16k_chain_ms_median": 2.0, "warm_up_s_median": 0.2}
    with pytest.raises(SystemExit):
        main(["--processes", "0"])


def test_the_lookup_warm_up_report_takes_medians_over_processes(capsys):
    """lookupwarm's summary: per arm, the median over processes of each process's median hook,
    Java lookup, keys and cold lookup, and of each process's first warm hook; bad counts and a
    token count off the block size are refused naming them."""
    import pytest

    from pegaflow.bench.lookupwarm import main, summary

    rows = [{"warm_hook_ms": [h, h + 1, 9.0], "warm_java_lookup_ms": [j, j, 5.0], "warm_keys_ms": [k, k, k],
             "cold_hook_ms": [c, 1.0, c]} for h, j, k, c in ((3.0, 1.0, 0.5, 20.0), (1.0, 0.2, 0.7, 10.0),
                                                             (2.0, 0.4, 0.9, 30.0))]
    assert summary(rows) == {"processes": 3, "warm_hook_ms_median": 3.0, "warm_java_lookup_ms_median": 0.4,
                             "warm_keys_ms_median": 0.7, "first_warm_hook_ms_median": 2.0, "cold_hook_ms_median": 20.0}
    for bad, said in ((["--processes", "0"], "--processes 0: expected 1 or more"),
                      (["--prompts", "0"], "--prompts 0: expected 1 or more"),
                      (["--lookups", "0"], "--lookups 0: expected 1 or more"),
                      (["--tokens", "100"], "--tokens 100: expected a positive multiple of 16"),
                      (["--arms", "all,fast"], "--arms all,fast: expected some of none,keys,all,nomemo")):
        with pytest.raises(SystemExit):
            main(bad)
        assert said in capsys.readouterr().err



def test_summary_gives_the_server_calls_of_a_lengths_warm_requests():
    """Server mode: the control path by phase as the server counted it (ttft_worker's
    ``server:`` counters, moved by the warm phase), per request and per call."""
    warm_counters = {"server:calls:Query": 2.0, "server:seconds:Query": 0.001, "server:calls:EndCopy": 3.0,
                     "server:seconds:EndCopy": 0.0009, "server:calls:BeginLoad": 0.0}
    results = {"server": {"start_s": 5.0, "lengths": {"8192": {
        "cold": run([205, 215], [0, 0], [1, 2]), "reset_ok": True, "warm": run([60, 70], [8176] * 2, [1, 2]),
        "warm_counters": warm_counters}}}}
    row = ttft.summarize(results, [8192], 131072, None)["server"]["8k"]
    assert row["warm_server_calls"] == {"EndCopy": {"per_request": 1.5, "mean_ms": 0.3},
                                        "Query": {"per_request": 1.0, "mean_ms": 0.5}}
    assert "warm_server_query_phases_ms" not in row  # a server without the phase counters
    warm_counters.update({"server:query_s:lookup": 2e-4, "server:query_s:lease": 1e-4, "server:query_s:plan": 5e-4})
    row = ttft.summarize(results, [8192], 131072, None)["server"]["8k"]
    assert row["warm_server_query_phases_ms"] == {"lookup": 0.1, "lease": 0.05, "plan": 0.25}  # per Query: two
    del warm_counters["server:calls:Query"], warm_counters["server:calls:EndCopy"]
    row = ttft.summarize(results, [8192], 131072, None)["server"]["8k"]
    assert "warm_server_calls" not in row and "warm_server_query_phases_ms" not in row


def test_worker_reads_the_servers_calls_from_its_metrics():
    import http.server
    import threading

    from pegaflow.bench import ttft_worker

    text = ('# TYPE pegaflow_rpc_duration_seconds histogram\n'
            'pegaflow_rpc_duration_seconds_bucket{method="Query",le="0.001"} 3\n'
            'pegaflow_rpc_duration_seconds_count{method="Query"} 4\n'
            'pegaflow_rpc_duration_seconds_sum{method="Query"} 0.002\n'
            'pegaflow_rpc_duration_seconds_count{method="EndCopy"} 1\n'
            'pegaflow_rpc_duration_seconds_sum{method="EndCopy"} 0.0001\n'
            'pegaflow_rpc_requests_total{method="Query",status="OK"} 4.0\n'
            '# TYPE pegaflow_query_lookup_seconds_total counter\n'
            'pegaflow_query_lookup_seconds_total 1.2E-4\n'
            'pegaflow_query_plan_seconds_total 4.0E-4\n').encode()

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/metrics"
        assert ttft_worker.server_rpc(url) == {"server:calls:Query": 4.0, "server:seconds:Query": 0.002,
                                               "server:calls:EndCopy": 1.0, "server:seconds:EndCopy": 0.0001,
                                               "server:query_s:lookup": 1.2e-4, "server:query_s:plan": 4.0e-4}
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert ttft_worker.server_rpc(None) == {}
    assert ttft_worker.server_rpc(url) == {}, "a server that does not answer: no figures, no failure"


def test_a_runs_log_keeps_the_jvms_warnings_said_early_in_a_process():
    """A warning the JVM said once, early in a vLLM process (a staging that failed), is printed
    beside that process's log tail, which it fell outside of, and so is the process's line on where
    its lookup warm-up ran; other loggers' lines are not."""
    ours = ("2026-12-06T00:40:02.120Z WARN [pegaflow-stage-cuda] io.pegaflow.engine.transfer.Stager: staging a load "
            "of 2147483648 bytes failed; that load reads the pool: boom | java.lang.IllegalStateException: boom")
    warm = ("2026-12-06T00:40:02.140Z INFO [pegaflow-lookup-warm-up] io.pegaflow.connector.LookupWarmUp: "
            "lookup warm-up: 400 rounds in 2950 ms as a client of a scratch server")
    log = "\n".join([
        "INFO 12-06 00:40:01 [core.py:1] vLLM started",
        ours,
        "2026-12-06T00:40:02.130Z INFO [main] io.pegaflow.bridge.Bridge: not a warning",
        warm,
        "2026-12-06T00:40:03.000Z WARN [main] org.other.Lib: not ours",
        '{"ts":"2026-12-06T00:40:03Z","level":"ERROR","thread":"x","logger":"io.pegaflow.engine.PegaEngine","msg":"json"}',
        "WARNING 12-06 00:40:04 [block_pool.py:772] Failed to reset prefix cache",
    ] + ["INFO filler"] * 200)
    said = ttft.java_warnings(log)
    assert said == [ours, warm, log.splitlines()[5]]  # and where the process's warm-up ran
    assert "staging a load" not in log[-1500:]  # outside the tail the run prints
    assert len(ttft.java_warnings("\n".join([ours] * 30), limit=5)) == 5
    assert len(ttft.java_warnings(ours + "x" * 1000)[0]) == 400


def _worker_module():
    """ttft_worker.py loaded by path, as the run loads it (the worker never imports pegaflow)."""
    import importlib.util
    from pathlib import Path

    import pegaflow.bench

    path = Path(pegaflow.bench.__file__).with_name("ttft_worker.py")
    spec = importlib.util.spec_from_file_location("ttft_worker_under_test", path)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    return worker


class _Outputs:
    def __init__(self, outputs, stats):
        self.outputs, self.scheduler_stats = outputs, stats


class _Manager:
    def __init__(self):
        self.recorded = []

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
        self.recorded.append(scheduler_stats)


class _Core:
    def __init__(self, queue):
        self.queue = queue

    def get_output(self):
        return self.queue.pop(0)


class _GatedEngine:  # LLMEngine.step of vLLM 0.26-0.31, as far as the stats go
    def __init__(self, queue):
        self.engine_core, self.logger_manager = _Core(queue), _Manager()

    def step(self):
        outputs = self.engine_core.get_output()
        if (self.logger_manager is not None and outputs.scheduler_stats is not None
                and len(outputs.outputs) > 0):
            self.logger_manager.record(scheduler_stats=outputs.scheduler_stats, iteration_stats=None)


class _FixedEngine(_GatedEngine):  # vLLM 0.32's (PR 48668): every step's stats
    def step(self):
        outputs = self.engine_core.get_output()
        if self.logger_manager is not None and outputs.scheduler_stats is not None:
            self.logger_manager.record(scheduler_stats=outputs.scheduler_stats, iteration_stats=None)


def test_the_worker_records_the_stats_of_steps_without_outputs_where_vllm_drops_them():
    """vLLM 0.26-0.31's offline step records a step's stats only beside request outputs, so the
    connector counters of an asynchronous load's lookup step and end step were lost (every warm
    counter of _async systems read 0 on the GPU); the worker records those steps' stats itself
    there, once each, and leaves an engine without the gate alone."""
    worker = _worker_module()
    gated = _GatedEngine([_Outputs([], "lookup step"), _Outputs(["token"], "token step"), _Outputs([], None)])
    assert worker.record_zero_output_steps(gated) is True
    for _ in range(3):
        gated.step()
    assert gated.logger_manager.recorded == ["lookup step", "token step"]
    fixed = _FixedEngine([_Outputs([], "lookup step")])
    assert worker.record_zero_output_steps(fixed) is False
    fixed.step()
    assert fixed.logger_manager.recorded == ["lookup step"]  # once: vLLM's own
    silent = _GatedEngine([])
    silent.logger_manager = None  # stats off (disable_log_stats)
    assert worker.record_zero_output_steps(silent) is False


def test_the_worker_clocks_each_step_that_produced_outputs(monkeypatch):
    """Decode steps one by one without a profiler: the worker stamps each engine-core output that
    carries request outputs (a token step), not those without (a lookup step); an engine without
    an engine core is left alone."""
    worker = _worker_module()
    engine = _GatedEngine([_Outputs(["first token"], None), _Outputs([], None), _Outputs(["decode 1"], None),
                           _Outputs(["decode 2"], None)])
    ticks = iter([1.0, 1.012, 1.0305])
    monkeypatch.setattr(worker.time, "perf_counter", lambda: next(ticks))
    stamps = worker.clock_output_steps(engine)
    for _ in range(4):
        engine.step()
    assert stamps == [1.0, 1.012, 1.0305]
    assert worker.clock_output_steps(object()) is None


def test_summary_gives_the_first_decode_steps_against_no_connector():
    """cold_decode_steps_ms: the median over the cold answers of each of their first decode steps
    (as many as every answer has, six at most), and each against no connector's: a save slowing
    the steps beside it shows in the first ones, not in the mean over the answer."""
    def cold(steps):
        return [{"ttft_ms": 200.0, "itl_ms": sum(x) / len(x), "cached_tokens": 0, "token_ids": [1], "step_ms": x}
                for x in steps]

    results = {
        "none": {"lengths": {"8192": {"cold": cold([[12.0] * 8, [12.0] * 8, [11.0] * 8]),
                                      "gpu_hit": run([40, 50, 60], [8176] * 3, [1])}}},
        "server": {"lengths": {"8192": {"cold": cold([[19.0, 18.0] + [12.0] * 6, [20.0, 12.0] + [12.0] * 6,
                                                      [18.0, 12.5, 12.0]]),
                                        "reset_ok": True, "warm": run([60, 70, 80], [8176] * 3, [1])}}},
        "vllm_native": {"lengths": {"8192": {"cold": run([205], [0], [1]), "warm": run([90], [8176], [1])}}},
    }
    s = ttft.summarize(results, [8192], 131072, 55.0)
    assert s["server"]["8k"]["cold_decode_steps_ms"] == [19.0, 12.5, 12.0]  # three: the shortest answer's
    assert s["server"]["8k"]["cold_decode_steps_vs_none"] == [round(19 / 12, 3), round(12.5 / 12, 3), 1.0]
    assert "cold_decode_steps_ms" not in s["vllm_native"]["8k"]  # its answers carried no steps
    assert ttft.decode_steps(cold([[5.0] * 10])) == [5.0] * ttft.DECODE_STEPS_SHOWN
    # too few steps for a settled median (three answers of 8 and 3 steps): no extra time made up
    assert "cold_decode_extra_ms" not in s["server"]["8k"]


def test_decode_extra_time_is_the_first_steps_over_the_settled_ones():
    """decode_extra_ms: per answer, its first six steps minus six times the median of its steps
    from the ninth on; the median over the answers. no connector's beside it in the summary."""
    slow_start = {"step_ms": [20.0, 16.0, 12.0, 12.0, 12.0, 12.0, 12.0, 12.0, 12.0, 12.0, 11.0]}
    even = {"step_ms": [12.0] * 11}
    assert ttft.decode_extra_ms([slow_start, even, slow_start]) == 12.0  # (20 + 16 + 4 * 12) - 6 * 12
    assert ttft.decode_extra_ms([{"step_ms": [12.0] * 8}]) is None
    cold = [{"ttft_ms": 200.0, "cached_tokens": 0, "token_ids": [1], **x} for x in (slow_start, even, slow_start)]
    base = [{"ttft_ms": 200.0, "cached_tokens": 0, "token_ids": [1], **even}] * 3
    results = {"none": {"lengths": {"8192": {"cold": base, "gpu_hit": run([40], [8176], [1])}}},
               "server": {"lengths": {"8192": {"cold": cold, "reset_ok": True, "warm": run([60], [8176], [1])}}}}
    row = ttft.summarize(results, [8192], 131072, 55.0)["server"]["8k"]
    assert (row["cold_decode_extra_ms"], row["none_cold_decode_extra_ms"]) == (12.0, 0.0)


def test_a_settled_decode_step_is_each_answers_median_after_its_first_steps():
    """settled_step_ms: per answer, the median of its steps from the ninth on; the median over
    the answers; in the summary beside no connector's as a ratio, the part of the decode figure
    every step pays (the first steps' part is cold_decode_extra_ms)."""
    slower = {"step_ms": [20.0] * 8 + [13.0, 13.0, 12.0]}  # settled 13
    even = {"step_ms": [12.0] * 11}  # settled 12
    assert ttft.settled_step_ms([slower, even, slower]) == 13.0
    assert ttft.settled_step_ms([{"step_ms": [12.0] * 8}]) is None  # nothing after the first eight
    cold = [{"ttft_ms": 200.0, "cached_tokens": 0, "token_ids": [1], **x} for x in (slower, slower, even)]
    base = [{"ttft_ms": 200.0, "cached_tokens": 0, "token_ids": [1], **even}] * 3
    results = {"none": {"lengths": {"8192": {"cold": base, "gpu_hit": run([40], [8176], [1])}}},
               "server": {"lengths": {"8192": {"cold": cold, "reset_ok": True, "warm": run([60], [8176], [1])}}}}
    row = ttft.summarize(results, [8192], 131072, 55.0)["server"]["8k"]
    assert (row["cold_settled_step_ms"], row["cold_settled_step_vs_none"]) == (13.0, round(13 / 12, 3))
    assert "cold_settled_step_ms" not in ttft.summarize(results, [8192], 131072, 55.0)["none"]["8k"]


def test_a_failed_systems_error_keeps_how_its_worker_exited():
    """The report's error of a failed system: the first line (the exit code) and the log's end
    within the limit; short errors whole."""
    log = "\n".join(f"WARNING line {i}" for i in range(500))
    e = RuntimeError(f"system embedded_asyncx: worker exited with -9 (killed by SIGKILL: out of memory?):\n{log}")
    text = ttft.error_text(e)
    assert len(text) <= 1200
    assert text.startswith("system embedded_asyncx: worker exited with -9 (killed by SIGKILL")
    assert text.endswith("WARNING line 499")
    assert ttft.error_text(RuntimeError("short")) == "short"


def test_enforce_eager_off_runs_every_vllm_with_cuda_graphs():
    """--enforce-eager off (vLLM's own default on GPUs: CUDA graphs, torch.compile) reaches both
    kinds of vLLM process of a run: the ttft workers' spec and the OpenAI server of the load;
    on (the default) keeps every recorded run's eager mode."""
    from types import SimpleNamespace

    def args(eager):
        return SimpleNamespace(enforce_eager=eager, async_scheduling="off", prompts=2, seed=1, dtype="bfloat16",
                               block_size=None, max_tokens=16, load_gpu_blocks=64, concurrency=4)

    for eager, want in (("on", True), ("off", False)):
        spec = ttft.worker_spec(args(eager), "m", [256, 512], {"vocab_size": 100})
        assert spec["enforce_eager"] is want and spec["max_model_len"] == 768 and spec["async_scheduling"] is False
        cmd = ttft.api_server_command(args(eager), "m", 8192, 8000, {"kv_connector": "X"})
        assert ("--enforce-eager" in cmd) is want
        assert cmd[cmd.index("--max-model-len") + 1] == "8256" and "--no-async-scheduling" in cmd
    import pytest

    with pytest.raises(SystemExit):
        ttft.main(["--lengths", "256", "--enforce-eager", "maybe"])


def test_server_instepxb_starts_its_server_busy_polling_and_is_server_only(tmp_path, monkeypatch):
    """server_instepxb is server_instepx whose pegaflow-server is started with --busy-poll-us 1000000
    (the A/B arm of a warm lookup's round trip to a server thread that slept); other server systems
    get no extra argument, and there is no embedded_instepxb (nothing to poll)."""
    from types import SimpleNamespace

    import pegaflow._server
    from pegaflow.bench import ttft

    started = []

    def fake_start_server(pool_path, pool_size="32mb", extra=None, **kw):
        started.append(list(extra or []))
        return SimpleNamespace(http_port=1, endpoint="127.0.0.1:1", stop=lambda: None)

    monkeypatch.setattr(pegaflow._server, "start_server", fake_start_server)
    systems = ttft.Systems(SimpleNamespace(pool_size="1gb", pegaflow_site="", vllm_site="", pool_dir=str(tmp_path)), tmp_path)
    kv, _ = systems.start("server_instepxb")
    assert started[-1] == ["--busy-poll-us", "1000000"]
    assert kv["kv_connector_extra_config"]["load_at_alloc"] is True
    assert systems.env("server_instepxb")["PEGAFLOW_PRESTAGE_MIB"]
    systems.start("server_instepx")
    assert started[-1] == []
    assert "embedded_instepxb" not in ttft.VARIANTS and "embedded_instepxc" not in ttft.VARIANTS
    assert systems.env("server_instepxc")["PEGAFLOW_LOCAL_SPIN_US"] == "1000"
    systems.start("server_instepxc")
    assert started[-1] == [], "the client spins; the server runs as it is"
    with pytest.raises(SystemExit, match="system 'embedded_instepxb'"):
        ttft.main(["--lengths", "256", "--systems", "embedded_instepxb"])
    # the busy-polling server with the compute share: both halves
    kv, _ = systems.start("server_instepxbr5")
    assert started[-1] == ["--busy-poll-us", "1000000"] and kv["kv_connector_extra_config"]["load_at_alloc"] is True
    assert systems.env("server_instepxbr5")["PEGAFLOW_COMPUTE_SHARE"] == "0.05"
    # the low_ttft preset with the busy-polling server (a server flag the preset cannot set): the
    # server started polling, the connector given the preset alone, no setting of the bench's own
    kv, _ = systems.start("server_lowttftb")
    assert started[-1] == ["--busy-poll-us", "1000000"]
    assert kv["kv_connector_extra_config"] == {"mode": "server", "endpoint": "127.0.0.1:1", "health_interval_s": 3600,
                                               "cross_layer_blocks": True}
    assert systems.env("server_lowttftb")["PEGAFLOW_PRESET"] == "low_ttft"
    systems.start("server_lowttft")
    assert started[-1] == []
    assert "embedded_lowttftb" not in ttft.VARIANTS
    assert "embedded_instepxbr5" not in ttft.VARIANTS
