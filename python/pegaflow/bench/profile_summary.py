"""Summarizes the torch.profiler traces the ttft worker writes with $PEGAFLOW_TTFT_PROFILE.

``python -m pegaflow.bench.profile_summary TRACE.json.gz [...] > summary.json``: for each trace,
the first forward's timeline in ms from the trace's start: when each layer's attention kernel
started, when the first token was copied to the host, and this project's load copies
(``pega_copy`` kernels: per CUDA stream, when they started and ended, and how long they ran), and
when the thread that launched them made its first launch; the load's copy-engine copies
(host-to-device ``gpu_memcpy`` records on streams other than the attention's, up to the first
token's copy), with the gaps where the copy engine stood idle between them (``idle_gaps``); the step's own host-to-device copies on the attention's stream (vLLM's inputs:
how long the longest waited from its launch to its start); the decode steps after it (from one
sampled-token copy to the host to the next: the step's length and how long the attention's stream
ran kernels in it, medians; and the first steps one by one in ``decode_steps_first``, with how
long each step's token copy waited and how long a save's copies ran inside it); how long each kernel launch of the forward's thread took (median and mean in
microseconds, first forward only): a load whose driver calls hold up that thread's launches
shows there (docs/gpu.md, "Layer-wise loads and the launch rate"); and what the thread of the
first ``vllm.execute_model`` range did in it on the host (``execute_model_host_ops``); the
profiler's own stops and whether one held the load's first copy (``profiler_stalls``); and what
set each layer's attention going (``first_forward_layer_pacing``: vLLM's thread launching it, the
GPU's compute before it on its stream, or a wait such as a load's). No GPU needed; it reads the
files only.
Every ``pega_copy`` kernel in the trace counts, saves' included: in the ttft worker's warm and
GPU-hit traces the prompt is stored already (no saves run beside the first forward); in its
cold trace (a prompt never seen) they are the save's gathers. ``first_token_copy``: how long the
first token's copy to the host waited from its launch to its start, and the device-to-host
copies of other streams (a cold request's save) that ran meanwhile.
"""

from __future__ import annotations

import gzip
import json
import sys
from collections import defaultdict

COPY_KERNEL = "pega_copy"


def _attention(name: str) -> bool:
    # FlashAttention 3's forward kernel on Hopper (vLLM 0.26's default backend there)
    return "flash::enable_sm90" in name or "flash_fwd" in name


def _stream(e: dict):
    # a GPU record's CUDA stream: torch's traces put it in tid, and in args too
    return e.get("tid", e.get("args", {}).get("stream"))


def summarize(path: str, layers: int = 32) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    stamped = [e for e in events if "ts" in e]
    if not stamped:
        raise ValueError(f"{path}: no timed events; expected a torch.profiler chrome trace")
    t0 = min(e["ts"] for e in stamped)

    def ms(us: float) -> float:
        return round((us - t0) / 1e3, 2)

    kernels = sorted((e for e in stamped if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    attention = [e for e in kernels if _attention(e["name"])][:layers]
    out: dict = {"first_forward_attention_kernel_starts_by_layer": [ms(e["ts"]) for e in attention]}
    # the sampled tokens' copy to the host: a small device-to-host copy after the last layer's
    # attention (on the compute stream, or vLLM's output-copy stream in the V2 model runner), not
    # a save's
    to_host = [e for e in stamped if e.get("cat") == "gpu_memcpy" and "DtoH" in e.get("name", "")
               and attention and e["ts"] > attention[-1]["ts"] and e.get("args", {}).get("bytes", 0) <= TOKEN_COPY_BYTES]
    if to_host:
        out["first_token_to_host_copy"] = ms(min(e["ts"] for e in to_host))
    copies = [e for e in kernels if e["name"] == COPY_KERNEL]
    if copies:
        by_stream: dict = defaultdict(list)
        for e in copies:
            by_stream[str(e.get("args", {}).get("stream"))].append(e)
        launches = {e.get("args", {}).get("correlation"): e for e in stamped
                    if e.get("cat") == "cuda_driver" and e.get("name") == "cuLaunchKernel"}
        first = [launches[c] for c in (e.get("args", {}).get("correlation") for e in copies) if c in launches]
        out["load_copy_kernels"] = {
            "count": len(copies),
            "first_launch": ms(min(e["ts"] for e in first)) if first else None,
            "first_start": ms(copies[0]["ts"]),
            "last_end": ms(max(e["ts"] + e["dur"] for e in copies)),
            "busy_ms": round(sum(e["dur"] for e in copies) / 1e3, 2),
            "streams": {s: {"count": len(v), "first_start": ms(v[0]["ts"]),
                            "last_end": ms(max(e["ts"] + e["dur"] for e in v)),
                            "grids": sorted({e.get("args", {}).get("grid", [0])[0] for e in v})}
                        for s, v in by_stream.items()},
        }
    end = min((e["ts"] for e in to_host), default=max(e["ts"] for e in stamped))
    if attention:
        compute = _stream(attention[0])
        dma = [e for e in stamped if e.get("cat") == "gpu_memcpy" and "HtoD" in e.get("name", "")
               and _stream(e) != compute and e["ts"] < end]
        if dma:
            out["load_memcpys"] = {"count": len(dma), "first_start": ms(min(e["ts"] for e in dma)),
                                   "last_end": ms(max(e["ts"] + e["dur"] for e in dma)),
                                   "busy_ms": round(sum(e["dur"] for e in dma) / 1e3, 2),
                                   "idle_gaps": idle_gaps(dma, ms), **idle_total(dma)}
            stalls = profiler_stalls(stamped, end, min(e["ts"] for e in dma), ms)
            if stalls:
                out["profiler_stalls"] = stalls
            moved = sum(e.get("args", {}).get("bytes", 0) for e in dma)
            if moved:  # the load's bytes over its copies' span: the rate a layer-wise load kept
                span_us = max(e["ts"] + e["dur"] for e in dma) - min(e["ts"] for e in dma)
                out["load_memcpys"].update(bytes=moved, gbps_over_span=round(moved / span_us / 1e3, 2))
        # the step's own host-to-device copies (vLLM's inputs, on the attention's stream): how long
        # each waited between its launch and its start; a load queued first on the copy engine
        # holds them, and the forward behind them (docs/gpu.md, "Loads started at allocation")
        calls = {e.get("args", {}).get("correlation"): e for e in stamped
                 if e.get("cat") in ("cuda_runtime", "cuda_driver") and "emcpy" in e.get("name", "")}
        held = []
        for e in stamped:
            if (e.get("cat") == "gpu_memcpy" and "HtoD" in e.get("name", "") and e["ts"] < end
                    and _stream(e) == compute):
                call = calls.get(e.get("args", {}).get("correlation"))
                if call is not None:
                    held.append((call["ts"], e["ts"] - call["ts"]))
        # the first token's copy to the host, on the attention's stream: how long it waited from
        # its launch to its start, and the other streams' device-to-host copies (a cold request's
        # save) that ran meanwhile: a save queued first on the copy engine would hold it
        token = min(to_host, key=lambda e: e["ts"], default=None)
        call = calls.get(token.get("args", {}).get("correlation")) if token else None
        if call is not None:
            meanwhile = [e for e in stamped if e.get("cat") == "gpu_memcpy" and "DtoH" in e.get("name", "")
                         and _stream(e) != _stream(token) and e["ts"] < token["ts"] and e["ts"] + e["dur"] > call["ts"]]
            out["first_token_copy"] = {"launched": ms(call["ts"]), "wait_ms": round((token["ts"] - call["ts"]) / 1e3, 2),
                                       "other_dtoh_copies_meanwhile": len(meanwhile),
                                       "other_dtoh_busy_ms": round(sum(e["dur"] for e in meanwhile) / 1e3, 2)}
        paced = layer_pacing(attention, kernels, stamped, compute)
        if paced:
            out["first_forward_layer_pacing"] = paced
        if held:
            worst = max(held, key=lambda h: h[1])
            out["step_input_copies"] = {"count": len(held), "max_wait_ms": round(worst[1] / 1e3, 2),
                                        "worst_launched": ms(worst[0]),
                                        "total_wait_ms": round(sum(h[1] for h in held) / 1e3, 2)}
        # decode steps: each ends with its sampled tokens' copy to the host; between two such
        # copies, how long the attention's stream ran kernels (the rest of the step is host work:
        # a step whose kernels run a fraction of it is set by vLLM's thread, not by the GPU)
        # (the sampled tokens' copies only: small ones; a cold request's save copies to the host
        # in slots of megabytes, and those are not steps)
        on_stream = [e for e in kernels if _stream(e) == compute]
        dtoh = [e for e in stamped if e.get("cat") == "gpu_memcpy" and "DtoH" in e.get("name", "")]
        tokens = sorted((e for e in dtoh if e.get("args", {}).get("bytes", 0) <= TOKEN_COPY_BYTES), key=lambda e: e["ts"])
        marks: list = []
        for e in tokens:
            if not marks or e["ts"] - marks[-1]["ts"] > 1000:  # a step's tokens may come in more than one copy
                marks.append(e)
        rows = []
        for ea, eb in zip(marks, marks[1:]):
            a, b = ea["ts"], eb["ts"]
            rows.append((b - a, _overlap(on_stream, a, b), sum(1 for k in on_stream if a <= k["ts"] < b), a, b, eb))
        if rows:
            mid = len(rows) // 2
            out["decode_steps"] = {"count": len(rows),
                                   "interval_ms_p50": round(sorted(r[0] for r in rows)[mid] / 1e3, 2),
                                   "gpu_busy_ms_p50": round(sorted(r[1] for r in rows)[mid] / 1e3, 2),
                                   "kernels_p50": sorted(r[2] for r in rows)[mid]}
            inputs = [e for e in stamped if e.get("cat") == "gpu_memcpy" and "HtoD" in e.get("name", "") and _stream(e) == compute]
            out["decode_steps_first"] = decode_steps_first(rows, dtoh, copies, calls, _stream(token) if token else None, inputs)
    host = execute_model_host_ops(stamped)
    if host:
        out["execute_model_host_ops"] = host
    ranges = step_ranges(stamped, min((e["ts"] for e in to_host), default=None))
    if ranges:
        out["step_ranges"] = {name: {k: (ms(v) if k in ("first_start", "last_end") else v) for k, v in r.items()}
                              for name, r in ranges.items()}
    by_thread: dict = defaultdict(int)
    for e in stamped:
        if e.get("cat") == "cpu_op":
            by_thread[e.get("tid")] += 1
    if by_thread:
        forward_thread = max(by_thread, key=by_thread.get)
        durations = sorted(e["dur"] for e in stamped if e.get("tid") == forward_thread and e["ts"] < end
                           and e.get("name") in LAUNCHES)
        if durations:
            out["forward_launch_us"] = {"count": len(durations), "median": round(durations[len(durations) // 2], 1),
                                        "mean": round(sum(durations) / len(durations), 1)}
    return out


IDLE_GAP_US = 100
PACED_US = 30  # a kernel that started within this of an event it waited for started because of it


def layer_pacing(attention: list, kernels: list, stamped: list, compute) -> dict:
    """What set each layer's attention kernel going in the first forward: the host (it started
    within ``PACED_US`` of its launch: the GPU waited for vLLM's thread), the GPU (it started as the
    kernel before it on its stream ended, well after its launch: the forward's own compute set the
    pace), or neither (it started after both, waiting for something else, such as an event a layer
    wait put on the stream: a load). Per layer: ``launch_to_start_ms`` and ``after_previous_ms``
    (its start less the previous kernel's end on the stream); and the count of each cause."""
    launches = {e.get("args", {}).get("correlation"): e for e in stamped
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "aunch" in e.get("name", "")}
    on_stream = [e for e in kernels if _stream(e) == compute]
    index = {id(e): i for i, e in enumerate(on_stream)}
    lags, gaps, causes = [], [], {"host": 0, "gpu": 0, "other": 0}
    for k in attention:
        call = launches.get(k.get("args", {}).get("correlation"))
        i = index.get(id(k))
        if call is None or not i:
            return {}  # a trace without launch records or the kernel before it: nothing to say
        prev = on_stream[i - 1]
        lag, gap = k["ts"] - call["ts"], k["ts"] - (prev["ts"] + prev["dur"])
        lags.append(round(lag / 1e3, 2))
        gaps.append(round(gap / 1e3, 2))
        causes["host" if lag <= PACED_US else "gpu" if gap <= PACED_US else "other"] += 1
    return {"launch_to_start_ms": lags, "after_previous_ms": gaps, "set_by": causes}


def _overlap(events: list, a: float, b: float) -> float:
    """How long the events ran inside [a, b), in us (overlapping events counted once each)."""
    return sum(min(e["ts"] + e["dur"], b) - max(e["ts"], a) for e in events if e["ts"] < b and e["ts"] + e["dur"] > a)


def decode_steps_first(rows: list, dtoh: list, copies: list, calls: dict, token_stream, inputs: list = (),
                       first: int = 8) -> list:
    """The first decode steps one by one (a cold request's save runs beside them): each step's
    length, how long the attention's stream ran kernels in it, how long its sampled tokens' copy
    to the host waited from its launch to its start and the longest wait of its own inputs'
    copies to the device (``inputs``: host-to-device copies on the attention's stream), either
    behind the save's copies on the copy engine, and how long the save's device-to-host copies
    (other streams') and this project's copy kernels ran inside it; ms."""
    saves = [e for e in dtoh if _stream(e) != token_stream and e.get("args", {}).get("bytes", 0) > TOKEN_COPY_BYTES]
    out = []
    for interval, busy, _, a, b, token in rows[:first]:
        call = calls.get(token.get("args", {}).get("correlation"))
        waits = [e["ts"] - calls[c]["ts"] for e in inputs if a <= e["ts"] < b
                 and (c := e.get("args", {}).get("correlation")) in calls]
        out.append({"interval_ms": round(interval / 1e3, 2), "gpu_busy_ms": round(busy / 1e3, 2),
                    "token_copy_wait_ms": round((token["ts"] - call["ts"]) / 1e3, 2) if call is not None else None,
                    "input_copy_wait_ms": round(max(waits) / 1e3, 2) if waits else None,
                    "save_dtoh_ms": round(_overlap(saves, a, b) / 1e3, 2),
                    "copy_kernel_ms": round(_overlap(copies, a, b) / 1e3, 2)})
    return out


def _gaps(copies: list):
    """(where each idle stretch between the copies began, its length), in us, overlapping copies merged."""
    end = None
    for e in sorted(copies, key=lambda e: e["ts"]):
        if end is not None and e["ts"] > end:
            yield end, e["ts"] - end
        end = e["ts"] + e["dur"] if end is None else max(end, e["ts"] + e["dur"])


def idle_gaps(copies: list, ms) -> list:
    """Where the load's copy engine stood idle between its first copy and its last: each gap of
    ``IDLE_GAP_US`` or more as [ms from the trace's start where it began, its ms]. Between the
    layers of a paced lead a gap is the lane's turn (one layer landed, the next queued); a longer
    one is the lane's thread not queuing (docs/benchmarks/README.md, nineteenth GPU run)."""
    return [[ms(at), round(gap / 1e3, 2)] for at, gap in _gaps(copies) if gap >= IDLE_GAP_US]


def idle_total(copies: list) -> dict:
    """All the time the load's copy engine stood idle between its first copy and its last
    (overlapping copies merged), and how much of it came in gaps shorter than ``IDLE_GAP_US``
    (too short for ``idle_gaps``, but paid once per layer where each layer is queued after the
    one before landed): ``idle_ms``, ``short_gaps``, ``short_gaps_ms``."""
    gaps = [gap for _, gap in _gaps(copies)]
    short = [gap for gap in gaps if gap < IDLE_GAP_US]
    return {"idle_ms": round(sum(gaps) / 1e3, 3), "short_gaps": len(short), "short_gaps_ms": round(sum(short) / 1e3, 3)}


STALL_HOLDS_US = 200  # a load copy starting this soon after a profiler stop ended was held by it


def profiler_stalls(stamped: list, end: float, first_copy_ts: float, ms) -> dict:
    """The profiler's own stops before the first token's copy (``end``): CUPTI's ``overhead``
    records ("Activity Buffer Request": the process's CUDA calls wait while the profiler takes a
    buffer), each as [start, ms], their sum, and ``held_first_load_copy``: whether the load's
    first copy (``first_copy_ts``) started within 0.2 ms of one's end. A staged load's first byte
    seen late after its lookup in such a trace is the profiler's doing, not the staging's; the
    staging's own counters (``to_first_ms``) say when it queued that copy (docs/gpu.md, "Loads
    staged at the lookup"). Empty when the trace has none."""
    stops = sorted((e for e in stamped if e.get("cat") == "overhead" and "dur" in e and e["ts"] < end),
                   key=lambda e: e["ts"])
    if not stops:
        return {}
    held = any(0 <= first_copy_ts - (e["ts"] + e["dur"]) <= STALL_HOLDS_US for e in stops)
    return {"stops": [[ms(e["ts"]), round(e["dur"] / 1e3, 2)] for e in stops],
            "ms": round(sum(e["dur"] for e in stops) / 1e3, 2), "held_first_load_copy": held}


def step_ranges(stamped: list, token_ts) -> dict:
    """The named ranges of the first step that produced a token (``vllm.*``: the engine step's
    parts the ttft worker wraps; ``pegaflow.*``: the connector's hooks), from the trace's start to
    the end of the first ``vllm.update_from_output`` after the token's copy (``token_ts``; without
    it, the first one): per name, how many, the first's start and the last's end (trace
    microseconds), the time in them and the longest one (ms: one ``wait_for_layer_load`` far
    longer than the others is vLLM's thread held while the lane's thread stood still)."""
    named = sorted((e for e in stamped if e.get("cat") == "user_annotation" and "dur" in e
                    and e.get("name", "").startswith(("vllm.", "pegaflow."))), key=lambda e: e["ts"])
    updates = [e for e in named if e["name"] == "vllm.update_from_output"]
    if not updates:
        return {}
    after = [e for e in updates if token_ts is not None and e["ts"] + e["dur"] >= token_ts]
    end = (after or updates)[0]
    end_ts = end["ts"] + end["dur"]
    out: dict = {}
    for e in named:
        if e["ts"] > end_ts:
            break
        r = out.setdefault(e["name"], {"count": 0, "first_start": e["ts"], "last_end": e["ts"], "total_ms": 0.0,
                                       "longest_ms": 0.0})
        r["count"] += 1
        r["last_end"] = max(r["last_end"], e["ts"] + e["dur"])
        r["total_ms"] = round(r["total_ms"] + e["dur"] / 1e3, 3)
        r["longest_ms"] = max(r["longest_ms"], round(e["dur"] / 1e3, 3))
    return out


def execute_model_host_ops(stamped: list, top: int = 8) -> dict:
    """What the thread of the first ``vllm.execute_model`` range did inside it, on the host: its
    outermost operators (PyTorch ops, vLLM's custom ops, CUDA runtime calls, this project's
    ranges) by name, each name's count and ms, the ``top`` longest; and ``gaps_ms``, the range's
    time outside them (Python between the ops). Set against the GPU hit's trace, it says whether
    a slow forward was the host running slowly everywhere or waiting in particular calls."""
    ranges = sorted((e for e in stamped if e.get("name") == "vllm.execute_model" and "dur" in e), key=lambda e: e["ts"])
    if not ranges:
        return {}
    m = ranges[0]
    lo, hi = m["ts"], m["ts"] + m["dur"]
    inner = sorted((e for e in stamped if e is not m and "dur" in e and e.get("pid") == m.get("pid")
                    and e.get("tid") == m.get("tid") and lo <= e["ts"] <= hi), key=lambda e: (e["ts"], -e["dur"]))
    outer, end = [], float("-inf")
    for e in inner:
        if e["ts"] >= end:  # not inside the previous outermost one
            outer.append(e)
            end = e["ts"] + e["dur"]
    by: dict = defaultdict(lambda: [0, 0.0])
    for e in outer:
        by[e["name"]][0] += 1
        by[e["name"]][1] += e["dur"]
    longest = sorted(by.items(), key=lambda kv: -kv[1][1])[:top]
    return {"execute_model_ms": round(m["dur"] / 1e3, 2),
            "gaps_ms": round((m["dur"] - sum(e["dur"] for e in outer)) / 1e3, 2),
            "ops": {name: {"count": c, "ms": round(us / 1e3, 2)} for name, (c, us) in longest}}


# The sampled tokens' copy to the host is this small at most (a batch's token ids, 8 bytes each
# at most); a save's copies are a bounce slot or a pool stretch, far longer
TOKEN_COPY_BYTES = 64 << 10

LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m pegaflow.bench.profile_summary TRACE.json.gz [...]", file=sys.stderr)
        return 2
    json.dump({"what": "torch.profiler traces (PEGAFLOW_TTFT_PROFILE): the first forward's timeline, ms from "
                       "each trace's start", "traces": {p: summarize(p) for p in argv}}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
