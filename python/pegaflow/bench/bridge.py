"""``pegaflow-bench bridge``: what calling the in-process Java engine costs from Python.

Run in a fresh process (the CLI is one), so the JVM start is measured: JVM creation plus
the upcall table, then per-call latency of a call that does nothing and of a prefix query,
and the resident memory the JVM added to this process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _percentiles(samples_ns: list[int]) -> tuple[float, float]:
    s = sorted(samples_ns)
    return s[len(s) // 2] / 1000, s[min(len(s) - 1, int(len(s) * 0.99))] / 1000


def run(calls: int, query_hashes: int) -> dict:
    import ctypes

    from pegaflow import _bridge
    from pegaflow.engine import LayerRegion, PegaEngine

    if _bridge.started():
        raise RuntimeError("the JVM is already running in this process; run the bridge bench in a fresh one")
    runtime, jar = _bridge.find_java(), _bridge.find_jar()
    aot_used = _bridge.aot_cache(runtime, jar).is_file()
    rss_before = _rss_mib()
    api = _bridge.api()
    rss_started = _rss_mib()

    # Trivial call: the public path (fork check, call, status check), one call per sample.
    clock = time.perf_counter_ns
    for _ in range(20_000):  # warm-up: JIT of the upcall path
        api.call("noop")
    trivial = []
    for _ in range(calls):
        t0 = clock()
        api.call("noop")
        trivial.append(clock() - t0)
    timer = min(clock() - clock() for _ in range(1000)) * -1  # clock() - clock() is negative

    # Query: the prefix of a 4K-token prompt, all resident; the lease is released untimed.
    blocks, seg = query_hashes, 512
    buf = ctypes.create_string_buffer(blocks * seg)
    with PegaEngine(pool_size=f"{max(4, blocks * seg * 2 // (1 << 20) + 1)}mb") as engine:
        engine.register_instance("bench", "bench", 1, 1)
        engine.register_worker("bench", 0, 0, [LayerRegion("l", "mla", ctypes.addressof(buf), blocks * seg, blocks, seg, seg)])
        hashes = [os.urandom(32) for _ in range(blocks)]
        engine.save("bench", 0, list(range(blocks)), hashes).wait()
        for _ in range(2000):
            engine.release("bench", engine.query("bench", hashes).lease)
        query = []
        for _ in range(max(1000, calls // 100)):
            t0 = clock()
            q = engine.query("bench", hashes)
            query.append(clock() - t0)
            engine.release("bench", q.lease)
        rss_end = _rss_mib()

    t50, t99 = _percentiles(trivial)
    q50, q99 = _percentiles(query)
    return {
        "trivial_call_p50_us": t50,
        "trivial_call_p99_us": t99,
        "trivial_call_mean_us": statistics.fmean(trivial) / 1000,
        "timer_overhead_us": timer / 1000,
        "query_call_p50_us": q50,
        "query_call_p99_us": q99,
        "query_hashes": query_hashes,
        "jvm_start_ms": api.jvm_start_ms,
        "aot_cache_used": aot_used,
        "rss_added_mib": max(rss_started, rss_end) - rss_before,
        "rss_added_after_start_mib": rss_started - rss_before,
        "calls": calls,
        "java": runtime.version,
        "cpus": os.cpu_count(),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="pegaflow-bench bridge", description=__doc__)
    parser.add_argument("--json", default="out/bridge.json", type=Path)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--query-hashes", type=int, default=256)
    args = parser.parse_args(argv)
    report = run(args.calls, args.query_hashes)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(
        "bridge: JVM start + table %.0f ms (AOT cache %s), trivial call p50 %.2f us p99 %.2f us, "
        "query(%d hashes) p50 %.1f us, RSS +%.0f MiB"
        % (report["jvm_start_ms"], "used" if report["aot_cache_used"] else "absent", report["trivial_call_p50_us"],
           report["trivial_call_p99_us"], report["query_hashes"], report["query_call_p50_us"], report["rss_added_mib"])
    )
    print("  report:", args.json)
    return 0
