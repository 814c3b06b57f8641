"""How fast the host runs, beside a benchmark: ``python hostspeed.py sample OUT SECONDS`` times a
fixed loop of interpreted Python every 0.2 s on the CPU it is pinned to (``taskset -c N``) and
writes one JSON line per sample (wall time, CPU, microseconds); ``python -m
pegaflow.bench.hostspeed summarize REPORT SAMPLES...`` sets a ``pegaflow-bench ttft`` report's
requests beside those samples: each request's decode spacing with the host's loop time (the
median of every sampler's samples while the request ran), and each sampler's spread.

Why: on a shared GPU machine the same loop on an otherwise idle CPU ran 2x slower over stretches
of seconds (docs/benchmarks/README.md, thirteenth H200 run), which moves an eager vLLM decode step
(host-bound) as much as any connector could; a decode comparison between processes means
something only beside the host's speed at the time. Run as a script by path (stdlib only).
"""

from __future__ import annotations

import bisect
import json
import os
import statistics
import sys
import time


def sample(out_path: str, seconds: float, every_s: float = 0.2) -> None:
    end = time.time() + seconds
    cpu = min(os.sched_getaffinity(0))
    with open(out_path, "w") as out:
        while time.time() < end:
            t = time.perf_counter_ns()
            acc = 0
            for i in range(20000):
                acc += i * 3 % 7
            us = (time.perf_counter_ns() - t) / 1e3
            out.write(json.dumps({"t": round(time.time(), 3), "cpu": cpu, "us": round(us, 1)}) + "\n")
            out.flush()
            time.sleep(every_s)


def summarize(report: dict, samples: list[dict]) -> dict:
    """Per sampler CPU: the loop's min, median and max (us); per system and length and phase:
    each request's decode spacing (ms) beside the host's loop time while it ran (us)."""
    out: dict = {"samplers": {}, "requests": {}}
    by_cpu: dict[int, list[float]] = {}
    for s in samples:
        by_cpu.setdefault(s["cpu"], []).append(s["us"])
    for cpu, us in sorted(by_cpu.items()):
        out["samplers"][str(cpu)] = {"samples": len(us), "min_us": min(us), "p50_us": statistics.median(us),
                                     "max_us": max(us)}
    timeline = sorted((s["t"], s["us"]) for s in samples)
    times = [t for t, _ in timeline]

    def host_us(t0: float, t1: float) -> float | None:
        during = [us for _, us in timeline[bisect.bisect_left(times, t0):bisect.bisect_right(times, t1)]]
        return round(statistics.median(during), 1) if during else None

    for system, res in (report.get("raw") or {}).items():
        for length, entry in (res.get("lengths") or {}).items():
            for phase in ("cold", "warm", "gpu_hit"):
                rows = [r for r in entry.get(phase) or [] if "began_s" in r]
                if rows:
                    out["requests"].setdefault(system, {})[f"{length}/{phase}"] = [
                        {"itl_ms": round(r["itl_ms"], 2) if "itl_ms" in r else None, "ttft_ms": round(r["ttft_ms"], 2),
                         "host_loop_us": host_us(r["began_s"], r["began_s"] + r["wall_ms"] / 1e3)} for r in rows]
    return out


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "sample":
        sample(argv[1], float(argv[2]))
        return 0
    if len(argv) >= 3 and argv[0] == "summarize":
        samples = [json.loads(line) for path in argv[2:] for line in open(path) if line.strip()]
        print(json.dumps(summarize(json.loads(open(argv[1]).read()), samples), indent=1))
        return 0
    print("usage: hostspeed.py sample OUT SECONDS | summarize REPORT SAMPLES...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
