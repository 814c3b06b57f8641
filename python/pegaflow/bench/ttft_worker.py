"""One system of ``pegaflow-bench ttft`` in its own process: ``python ttft_worker.py SPEC OUT``.

Run as a script by path, never imported through the ``pegaflow`` package: the original
PegaFlow's wheel installs the same import name, so its system runs with its own folder first
on ``PYTHONPATH`` and this file must not import ours. It imports vLLM only.

SPEC (JSON): ``model``, ``max_model_len``, ``kv_transfer`` (vLLM's KVTransferConfig fields, or
null), ``lengths`` (tokens), ``prompts`` (per length), ``seed``, ``gpu_hit`` (also time vLLM's own
prefix-cache hit), ``gpu_memory_utilization``, ``max_tokens``, ``cold_start`` (``length``, ``role``: a fresh
process's first request alone, timed from the engine being ready). OUT gets, per length, each
prompt's cold and warm TTFT (vLLM's own first-token latency, and the wall time of the call),
the tokens vLLM did not compute, and the generated token ids.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time


def server_rpc(url: str | None) -> dict:
    """pegaflow-server's calls so far by method from its ``/metrics`` at ``url``
    (``pegaflow_rpc_duration_seconds`` count and sum: gRPC and local socket, every status), and
    its store's time in the phases of the queries it answered (``server:query_s:<phase>``:
    lookup, lease, plan); empty without a server or when it does not answer."""
    if not url:
        return {}
    import re
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: dict = {}
    for m in re.finditer(r'^pegaflow_rpc_duration_seconds_(count|sum)\{method="(\w+)"\} (\S+)$', text, re.M):
        out[f"server:{'calls' if m[1] == 'count' else 'seconds'}:{m[2]}"] = float(m[3])
    for m in re.finditer(r'^pegaflow_query_(lookup|lease|plan)_seconds_total (\S+)$', text, re.M):
        out[f"server:query_s:{m[1]}"] = float(m[2])
    return out


def prompt_set(length: int, n: int, seed: int, vocab: int) -> list[list[int]]:
    """n prompts of ``length`` tokens, no two sharing a first token (so no shared prefix)."""
    rnd = random.Random(seed * 1_000_003 + length)
    lo = 1000 if vocab > 4000 else 10
    return [[lo + i] + [rnd.randrange(lo + n, vocab - 1) for _ in range(length - 1)] for i in range(n)]


def threads() -> dict[int, tuple[str, int, int, int]]:
    """This process's threads from /proc: tid -> (name, CPU ticks user + system, voluntary and
    involuntary context switches). Empty where /proc is not there."""
    out: dict[int, tuple[str, int, int, int]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/self/task/{tid}/status") as f:
                status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        except OSError:
            continue  # the thread ended meanwhile
        close = stat.rfind(")")
        fields = stat[close + 2:].split()
        out[int(tid)] = (stat[stat.find("(") + 1:close], int(fields[11]) + int(fields[12]),
                         int(status.get("voluntary_ctxt_switches", "0")), int(status.get("nonvoluntary_ctxt_switches", "0")))
    return out


def machine() -> dict[str, int]:
    """The machine's CPU time (/proc/stat: busy and all jiffies) and this cgroup's throttling
    (cgroup v2 cpu.stat: periods throttled, microseconds throttled); what is not there is left out."""
    out: dict[str, int] = {}
    try:
        with open("/proc/stat") as f:
            cpu = [int(x) for x in f.readline().split()[1:9]]  # guest time is counted in user already
        out["jiffies"], out["busy_jiffies"] = sum(cpu), sum(cpu) - cpu[3] - (cpu[4] if len(cpu) > 4 else 0)
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu.stat") as f:
            stat = dict(line.split() for line in f if len(line.split()) == 2)
        for key in ("nr_throttled", "throttled_usec"):
            if key in stat:
                out[key] = int(stat[key])
    except (OSError, ValueError):
        pass
    return out


def machine_use(before: dict, after: dict) -> dict:
    """Between two :func:`machine` snapshots: the share of the machine's CPUs busy, and the
    cgroup's throttled periods and milliseconds (a CPU quota holding the process back)."""
    res: dict = {}
    if "jiffies" in before and "jiffies" in after and after["jiffies"] > before["jiffies"]:
        res["busy_share"] = round((after["busy_jiffies"] - before["busy_jiffies"]) / (after["jiffies"] - before["jiffies"]), 3)
    if "nr_throttled" in before and "nr_throttled" in after:
        res["throttled_periods"] = after["nr_throttled"] - before["nr_throttled"]
        res["throttled_ms"] = round((after.get("throttled_usec", 0) - before.get("throttled_usec", 0)) / 1e3, 1)
    return res


def cpu_probe() -> dict:
    """How fast this thread runs CPU work now, in microseconds, best of five: a fixed loop of
    interpreted Python (``python_us``) and of PyTorch operator calls that launch nothing
    (``torch_us``: views and shape changes of one tensor, the dispatcher work an eager decode
    step is made of). Between processes of one run it tells a host or process that runs slower
    (CPU frequency, a busy sibling thread) from work a system adds to each step."""
    best_py = best_torch = float("inf")
    try:
        import torch

        x = torch.empty((64, 64))
    except ImportError:  # the unit tier's interpreter may have no torch
        x = None
    for _ in range(5):
        t = time.perf_counter_ns()
        acc, d = 0, {}
        for i in range(20000):
            acc += i * 3 % 7
            d[i & 63] = acc
        best_py = min(best_py, time.perf_counter_ns() - t)
        if x is not None:
            t = time.perf_counter_ns()
            for _ in range(500):
                x.view(-1).view(64, 64).transpose(0, 1).reshape(16, 256)
            best_torch = min(best_torch, time.perf_counter_ns() - t)
    out = {"python_us": round(best_py / 1e3, 1)}
    if x is not None:
        out["torch_us"] = round(best_torch / 1e3, 1)
    return out


def thread_use(before: dict, after: dict, wall_s: float, main_tid: int, top: int = 8) -> dict:
    """What the threads did between two :func:`threads` snapshots: the main thread's (the one
    that runs vLLM's steps) CPU seconds and context switches (voluntary: it blocked, on a lock
    or a wait; involuntary: it was preempted), and the other threads' CPU seconds by name, the
    busiest ``top`` of them. Names are the kernel's, cut to 15 characters, so threads alike in
    those (the copy lanes' ``pegaflow-cuda-s`` ...) add up under one. Threads started meanwhile
    count from zero, threads that ended meanwhile are not counted, and a thread id reused by
    another thread never counts below zero."""
    tick = os.sysconf("SC_CLK_TCK")
    res: dict = {"wall_s": round(wall_s, 3)}
    if main_tid in after:
        b = before.get(main_tid, (after[main_tid][0], 0, 0, 0))
        a = after[main_tid]
        res["main"] = {"cpu_s": round((a[1] - b[1]) / tick, 2), "voluntary_switches": a[2] - b[2],
                       "involuntary_switches": a[3] - b[3]}
    others: dict[str, float] = {}
    for tid, a in after.items():
        if tid == main_tid:
            continue
        b = before.get(tid, (a[0], 0, 0, 0))
        others[a[0]] = others.get(a[0], 0.0) + max(0, a[1] - b[1]) / tick
    res["others_cpu_s"] = round(sum(others.values()), 2)
    res["busiest_others_cpu_s"] = {k: round(v, 2) for k, v in sorted(others.items(), key=lambda kv: -kv[1])[:top] if v > 0}
    return res


# vLLM's parts of an engine step timed as torch.profiler ranges in the traces: (path from the
# in-process engine core, method, range name); vLLM 0.26-0.33's names, each skipped where absent
STEP_PARTS = (("scheduler", "schedule", "vllm.schedule"),
              ("scheduler.kv_cache_manager", "get_computed_blocks", "vllm.get_computed_blocks"),
              ("scheduler.kv_cache_manager", "allocate_slots", "vllm.allocate_slots"),
              ("model_executor.driver_worker.worker.model_runner", "execute_model", "vllm.execute_model"),
              ("model_executor.driver_worker.worker.model_runner", "sample_tokens", "vllm.sample_tokens"),
              ("scheduler", "update_from_output", "vllm.update_from_output"))


def annotate_steps(llm) -> list[str]:
    """Wraps the parts of vLLM's engine step named in ``STEP_PARTS`` (on the in-process engine
    core's objects, this process only) in torch.profiler ranges, so a trace places the
    connector's hook ranges (``pegaflow.*``) and the GPU's work inside vLLM's step; returns the
    ranges set. For the benchmark's traces only (a range costs a little even with no profiler running)."""
    import torch

    core = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
    done = []
    for path, method, name in STEP_PARTS:
        obj = core
        for part in path.split("."):
            obj = getattr(obj, part, None)
        fn = getattr(obj, method, None)
        if fn is None:
            continue

        def ranged(*args, _fn=fn, _name=name, **kwargs):
            with torch.profiler.record_function(_name):
                return _fn(*args, **kwargs)

        setattr(obj, method, ranged)
        done.append(name)
    print(f"ttft worker: profiler ranges on {', '.join(done) or 'nothing (no in-process engine core)'}",
          file=sys.stderr, flush=True)
    return done


def clock_output_steps(engine) -> list | None:
    """When each of the engine's steps that produced request outputs returned them
    (``time.perf_counter``, appended to the returned list; None where the engine has no engine
    core to wrap). With one request in flight every such step is that request's: its first token,
    then one decode step each, so the gaps are its decode steps one by one, without a profiler
    (whose host-side cost hides how long a step takes on a fast host)."""
    core = getattr(engine, "engine_core", None)
    get_output = getattr(core, "get_output", None)
    if get_output is None:
        return None
    stamps: list = []

    def get_output_clocked(*args, **kwargs):
        out = get_output(*args, **kwargs)
        if getattr(out, "outputs", None):
            stamps.append(time.perf_counter())
        return out

    core.get_output = get_output_clocked
    return stamps


def record_zero_output_steps(engine) -> bool:
    """vLLM's offline engine before PR 48668 (vLLM 0.32) records a step's stats only where the
    step produced request outputs (``LLMEngine.step``: ``len(outputs.outputs) > 0``); the
    counters the connector hands to a step without them are drained and lost. Under asynchronous
    loads that is every warm request's lookup step and the step its load ends in (the request
    waits meanwhile), so every warm counter of ``_async`` systems read 0 on vLLM 0.26. Where
    ``engine``'s step has that gate, its engine core's outputs without request outputs have their
    stats recorded here, as the fix does (online serving, ``AsyncLLM``, records every step
    already). Whether it did so."""
    import inspect

    manager = getattr(engine, "logger_manager", None)
    try:
        gated = "len(outputs.outputs) > 0" in inspect.getsource(type(engine).step)
    except (OSError, TypeError):
        gated = False
    if manager is None or not gated:
        return False
    core = engine.engine_core
    get_output = core.get_output

    def get_output_recording(*args, **kwargs):
        out = get_output(*args, **kwargs)
        if out.scheduler_stats is not None and not out.outputs:
            manager.record(scheduler_stats=out.scheduler_stats, iteration_stats=None)
        return out

    core.get_output = get_output_recording
    return True


def main(spec_path: str, out_path: str) -> int:
    spec = json.loads(open(spec_path).read())
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kv = KVTransferConfig(**spec["kv_transfer"]) if spec.get("kv_transfer") else None
    tracing = bool(os.environ.get("PEGAFLOW_TTFT_PROFILE"))
    if tracing:
        os.environ["PEGAFLOW_PROFILE_HOOKS"] = "1"  # the connector's hooks as ranges in the traces
    t0 = time.perf_counter()
    extra = {"block_size": spec["block_size"]} if spec.get("block_size") else {}
    if spec.get("kv_cache_memory_bytes"):
        extra["kv_cache_memory_bytes"] = spec["kv_cache_memory_bytes"]
    if spec.get("async_scheduling") is not None:  # pegaflow-bench ttft --async-scheduling on|off
        extra["async_scheduling"] = spec["async_scheduling"]
    llm = LLM(model=spec["model"], load_format="dummy", skip_tokenizer_init=True, dtype=spec.get("dtype", "bfloat16"),
              max_model_len=spec["max_model_len"], enforce_eager=spec.get("enforce_eager", True),
              enable_prefix_caching=True, gpu_memory_utilization=spec.get("gpu_memory_utilization", 0.85),
              kv_transfer_config=kv, disable_log_stats=False, seed=0,
              max_num_batched_tokens=spec.get("max_num_batched_tokens", 16384), **extra)
    start_s = time.perf_counter() - t0
    zero_output_stats = record_zero_output_steps(llm.llm_engine)
    steps = clock_output_steps(llm.llm_engine)
    if tracing:
        annotate_steps(llm)
    sp = SamplingParams(temperature=0.0, max_tokens=spec.get("max_tokens", 8), ignore_eos=True, detokenize=False)
    vocab = int(spec.get("vocab", 128256))

    def run(tokens: list[int]) -> dict:
        began = time.time()  # wall clock: set beside other processes' records (a host sampler's)
        if steps is not None:
            steps.clear()
        t = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": tokens}], sp, use_tqdm=False)[0]
        wall = time.perf_counter() - t
        m = out.metrics
        ttft = float(getattr(m, "first_token_latency", 0.0) or 0.0) if m is not None else 0.0
        row = {"ttft_ms": ttft * 1e3, "wall_ms": wall * 1e3, "began_s": round(began, 3), "cached_tokens": int(out.num_cached_tokens or 0),
               "token_ids": list(out.outputs[0].token_ids)}
        # where the time went, by vLLM's own request timestamps (engine core, monotonic): waiting
        # until first scheduled (an asynchronous load waits here), then scheduled to first token
        queued, scheduled, first = (float(getattr(m, k, 0.0) or 0.0) for k in ("queued_ts", "scheduled_ts", "first_token_ts"))
        if queued and scheduled and first:
            row["queued_ms"] = (scheduled - queued) * 1e3
            row["scheduled_to_first_ms"] = (first - scheduled) * 1e3
        # decode: the mean time between this answer's tokens (engine core timestamps)
        last, n = float(getattr(m, "last_token_ts", 0.0) or 0.0), int(getattr(m, "num_generation_tokens", 0) or 0)
        if first and last > first and n > 1:
            row["itl_ms"] = (last - first) / (n - 1) * 1e3
        if steps and len(steps) > 1:
            # the decode steps one by one: a cold request's save runs beside the first ones
            row["step_ms"] = [round((b - a) * 1e3, 3) for a, b in zip(steps, steps[1:])]
        return row

    def reset() -> bool:
        # blocks of finished requests whose saves are still reported free only at a later step
        for _ in range(200):
            if llm.reset_prefix_cache():
                return True
            llm.generate([{"prompt_token_ids": [7]}], SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)
            time.sleep(0.005)
        return False

    def shutdown() -> int:
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
        return 0

    def counters() -> dict:
        """This project's connector counters (vllm:pegaflow_*), and in server mode the server's
        calls by method (``server:calls:<method>``, ``server:seconds:<method>``); empty for other
        connectors."""
        try:
            out = {m.name: float(m.value) for m in llm.get_metrics()
                   if m.name.startswith("vllm:pegaflow_") and isinstance(getattr(m, "value", None), (int, float))}
        except Exception:  # noqa: BLE001 - a report without them
            out = {}
        out.update(server_rpc(spec.get("server_metrics")))
        return out

    def cprofiled(label: str, work):
        """With $PEGAFLOW_TTFT_CPROFILE (a folder) and a label: ``work`` under cProfile (this
        thread's Python functions: where vLLM's step spends its CPU), the busiest functions
        written as <system>-<label>.txt (by own time, then by cumulative time); else just ``work``."""
        folder = os.environ.get("PEGAFLOW_TTFT_CPROFILE")
        if not folder or not label:
            return work()
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        try:
            return work()
        finally:
            prof.disable()
            text = io.StringIO()
            stats = pstats.Stats(prof, stream=text)
            stats.sort_stats("tottime").print_stats(60)
            stats.sort_stats("cumulative").print_stats(90)
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{spec.get('name', 'worker')}-{label}.txt"), "w") as f:
                f.write(text.getvalue())

    def profiled(length: int, kind: str, tokens: list[int]) -> None:
        """With $PEGAFLOW_TTFT_PROFILE (a folder): the longest length's last prompt once more
        under torch's profiler (its warm copy first made cold in vLLM's own cache again; for
        ``cold``, a prompt never seen, whose saves go out beside it), its trace written there as
        <kind>-<length>.json.gz, beside the timed runs, not among them."""
        folder = os.environ.get("PEGAFLOW_TTFT_PROFILE")
        if not folder or length != max(spec["lengths"]):
            return
        import gzip

        import torch

        if kind == "warm":
            reset()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            run(tokens)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{spec.get('name', 'worker')}-{kind}-{length}.json")
        prof.export_chrome_trace(path)
        with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
            g.write(f.read())
        os.unlink(path)

    if spec.get("cold_start"):
        # pegaflow-bench ttft --cold-start: this process is fresh and its first request is timed,
        # no warm-up before it (the writer saves the prompt, a fresh reader then asks for it)
        length = spec["cold_start"]["length"]
        tokens = prompt_set(length, 1, spec["seed"] + 7, vocab)[0]
        ready = time.perf_counter()
        row = run(tokens)
        row["ready_to_answer_s"] = time.perf_counter() - ready
        if spec["cold_start"]["role"] == "writer":
            time.sleep(spec.get("settle_s", 0.5))  # its saves land (an idle engine still finishes them)
            assert reset(), "vLLM's prefix cache could not be reset after the writer's request"
        with open(out_path, "w") as f:
            json.dump({"start_s": start_s, "first": row, "connector": counters()}, f)
        return shutdown()
    # warm-up, not counted: kernels and the connector's first operations, then one prompt of the
    # longest length cold and again from the store (every system: buffers sized for the largest
    # load, such as a copy lane's descriptors, grow here rather than in a timed request)
    for w in range(2):
        run(prompt_set(min(2048, min(spec["lengths"])), 1, 99 + w, vocab)[0])
    # its first token is below every timed prompt's (prompt_set's lo), so it shares no block with them
    longest = prompt_set(max(spec["lengths"]), 1, 97, vocab)[0]
    longest[0] -= 1
    run(longest)
    time.sleep(spec.get("settle_s", 0.5) if spec.get("kv_transfer") else 0.0)
    assert reset(), "vLLM's prefix cache could not be reset after the warm-up"
    run(longest)
    assert reset(), "vLLM's prefix cache could not be reset after the warm-up"
    # True: this vLLM drops a step's stats without request outputs, recorded here (record_zero_output_steps)
    result = {"start_s": start_s, "lengths": {}, "zero_output_stats_recorded": zero_output_stats}
    main_tid = threading.get_native_id()

    def timed(rows, label: str = "") -> tuple[list, dict, dict]:
        # the phase's answers, what this process's threads did meanwhile (the decode gap's
        # evidence) and the connector counters the phase moved
        probe = cpu_probe()  # before the snapshots: its own time is not the phase's
        counted = counters()  # outside the thread snapshots: in server mode it reads the server's /metrics
        before, host, t = threads(), machine(), time.perf_counter()
        done = cprofiled(label, lambda: [run(p) for p in rows])
        use = thread_use(before, threads(), time.perf_counter() - t, main_tid)
        use["machine"] = machine_use(host, machine())
        after = counters()
        moved = {k: v - counted.get(k, 0.0) for k, v in after.items() if v != counted.get(k, 0.0)}
        use["cpu_probe"] = probe
        return done, use, moved

    for length in spec["lengths"]:
        ps = prompt_set(length, spec["prompts"], spec["seed"], vocab)
        entry = {}
        entry["cold"], entry["cold_threads"], entry["cold_counters"] = timed(
            ps, f"cold-{length}" if length == max(spec["lengths"]) else "")
        # a prompt of its own (no block shared with ps): cold for every system, its saves beside it
        profiled(length, "cold", prompt_set(length, 1, spec["seed"] + 13, vocab)[0])
        if spec.get("gpu_hit"):
            entry["gpu_hit"] = [run(p) for p in ps]
            profiled(length, "gpu_hit", ps[-1])
        if spec.get("kv_transfer"):
            time.sleep(spec.get("settle_s", 0.5))  # saves land (an idle engine still finishes them)
            entry["reset_ok"] = reset()
            # this length's warm requests alone: the connector's counters they moved
            entry["warm"], entry["warm_threads"], entry["warm_counters"] = timed(ps)
            # the same prompts again, now in vLLM's GPU cache: this process's own GPU hit, right
            # after its warm answers, so the warm-over-GPU-hit ratio does not span two processes
            # (the host's speed differs between them by up to 2x); the connector counters it
            # moved show whether any of it came from the store instead (blocks loaded)
            entry["own_gpu_hit"], _, entry["own_gpu_hit_counters"] = timed(ps)
            profiled(length, "warm", ps[-1])
        assert reset()
        result["lengths"][str(length)] = entry
        print(f"ttft worker: {length} tokens done", file=sys.stderr, flush=True)
    # this project's connector counters (vllm:pegaflow_*: hits, bytes, the in-step loads' phases)
    result["connector"] = counters()
    with open(out_path, "w") as f:
        json.dump(result, f)
    return shutdown()


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    sys.exit(main(sys.argv[1], sys.argv[2]))
