"""``pegaflow-bench ttft``: time to first token in a real vLLM on the GPU, every system in one run.

Systems, each in its own process (``ttft_worker.py``) on one model of Llama-3.1-8B's shape
with random weights (``pegaflow.models.shapes``):

- ``none``: vLLM without a connector: cold, and warm from its own GPU prefix cache;
- ``embedded`` / ``server``: this project's connector, the store in the vLLM process or in a
  ``pegaflow-server`` started for the run;
- ``vllm_native``: vLLM's own ``OffloadingConnector`` with a CPU tier of the same bytes;
- ``pegaflow``: the original PegaFlow (its wheel unpacked in ``--pegaflow-site``: its server
  and connector, in their own processes; both projects install the import name ``pegaflow``).

Per prompt length, each store system runs every prompt cold (its saves go out), empties vLLM's
prefix cache, and runs them again warm (from the store); TTFT is vLLM's own first-token
latency of each request. ``outputs_identical``: every warm answer's token ids equal ``none``'s
answer from vLLM's GPU prefix cache (the same compute path). Optionally (``--concurrency``) a
load through vLLM's OpenAI server: requests of ``--load-length`` tokens, about half of them
repeats of earlier prompts, ``--concurrency`` in flight: TTFT p50/p99 and requests/s.

    pegaflow-bench ttft --json docs/benchmarks/vllm-gpu-ttft.json --pegaflow-site /tmp/pf
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pegaflow.bench import openai_http
from pegaflow.connector.settings import LOW_TTFT_LEAD, LOW_TTFT_PRESTAGE_MIB

SYSTEMS = ("none", "embedded", "server", "vllm_native", "pegaflow")
# Variants of this project's systems, for choosing defaults by measurement: "<system>_async"
# loads asynchronously (load_in_step false: the request waits a step); "<system>_instep" loads in
# the step (load_in_step true, which auto leaves off under vLLM's V2 runner); "<system>_v1cross" runs
# vLLM's V1 model runner, which allocates cross-layer blocks where 0.26-0.28's default runner
# does not; "<system>_instepg" loads in the step with layers grouped into 256 KiB stretches of
# each block (the CUDA engine's bounce path) and "<system>_instep2" deals the layers over two
# copy lanes and "<system>_instepc" caps each copy-kernel launch at 264 thread blocks (two per
# H200 SM; io.pegaflow.engine.transfer.LayerSplit) where "_instep" copies one layer per group on one
# lane with kernels of 32 thread blocks (the default); "<system>_instepa" starts each in-step load
# where vLLM allocates its blocks (load_at_alloc, the worker in the scheduler's process), held until
# its step starts; "<system>_instepl" the same with the load's first 160 MiB of layers copied at once
# by the copy kernel (PEGAFLOW_CUDA_LAYER_LEAD_MIB: PCIe works while vLLM prepares the step, and the
# step's input copies on the copy engine wait behind none of it) and "<system>_instepk" with its
# first GiB so (all of an 8K load, half of a 16K one, the copy engine taking the rest when the
# step opens the hold, both at once) and "<system>_instepz" with the whole load so (the lead's
# cap, 16 GiB, past any one load: nothing waits for the step); "<system>_instepp" leads the whole load
# through the copy engine paced one layer at a time (PEGAFLOW_CUDA_LAYER_LEAD_PACED=1: the step's input
# copies wait behind one layer at most, the rest queued at once when the step opens the hold);
# "<system>_instepx" is _instepp whose loads' pool side is staged in 4 GiB of device memory from the
# lookup that begins them on (PEGAFLOW_PRESTAGE_MIB; the caller's own value of it wins), before vLLM
# allocates their blocks: the copy engine works through vLLM's scheduling and allocation, and the
# step's loads move the staged bytes device to device, and "<system>_instepx2" the same with two layers of the
# staging in flight before the step instead of one (PEGAFLOW_PRESTAGE_DEPTH=2); "<system>_instepy" is _instep with that staging
# (no load at allocation: it runs under vLLM's asynchronous scheduling, vLLM's default on GPUs), and
# "<system>_asyncx" _async with it (asynchronous loads, the connector's default on GPUs);
# "<system>_instepxh" is _instepx whose in-process JVM has a young generation of 128 MiB
# (PEGAFLOW_JVM_OPTIONS="-Xms192m -Xmn128m", which also turns the AOT cache off): the twenty-sixth
# run's A/B arm against a heap of 16 MiB, whose young collections stopped the staging thread; since
# then a staging process's default (pegaflow._bridge.staging_options), so the arms differ by the AOT cache;
# "<system>_instepxk" is _instepx whose saves go to the host through the copy kernel alone, 16 thread
# blocks a launch (PEGAFLOW_CUDA_SAVE_KERNEL_BLOCKS=16), leaving the copy engine to vLLM's own copies
# (each decode step's sampled tokens to the host), "<system>_instepxs" _instepx whose saves
# keep the copy engine in copies of 1 MiB, not 8 (PEGAFLOW_CUDA_BOUNCE_MIB=2), and "<system>_instepxp"
# and "<system>_instepxq" _instepx whose saves have one / two copies queued on the copy engine at a
# time (PEGAFLOW_CUDA_SAVE_PACE; one is the default since the thirtieth run), and "<system>_instepxu"
# _instepx whose saves queue all their copies at once as before it (PEGAFLOW_CUDA_SAVE_PACE=0): the
# arms of issue 3/6's decode spacing while saves run (docs/gpu.md, "Saves beside decode");
# "server_instepxb" (server only) is server_instepx whose pegaflow-server keeps its local-socket
# threads spinning up to 1 s for a client's next frame (--busy-poll-us 1000000; its clients then spin
# for answers): the A/B arm of a warm lookup's round trip to a server thread that slept;
# "server_instepxc" (server only) is server_instepx whose vLLM process spins up to 1 ms for each
# local-socket answer (PEGAFLOW_LOCAL_SPIN_US=1000), the server as it is: the client's half of that;
# "<system>_instepxr3", "_instepxr5", "_instepxr7" and "_instepxr8" are _instepx whose vLLM
# computes the last 3% / 5% / 7% / 8% of a hit's blocks in the step instead of loading them, within
# its largest CUDA graph (PEGAFLOW_COMPUTE_SHARE; docs/gpu.md, "Computing the end of a hit"), and
# "server_instepxbr5" (server only) server_instepxb with the 5% share: the server set-up the 36th and
# 37th runs point at;
# "<system>_lowttft" sets nothing but the connector's preset low_ttft (PEGAFLOW_PRESET), which is
# _instepxr3's set-up as a user asks for it (_instepxr5's until the 46th run; docs/connector.md,
# "The low_ttft preset"), and "server_lowttftb" (server only) that with the server's --busy-poll-us,
# which stays the user's (server_instepxbr5 with the 3% share as a user asks for it);
# "<system>_instepaw" is _instepa without the JVM's warm-ups at start (PEGAFLOW_WARM_UP=0), for A/B
# runs within one call; "<system>_instepb" and "<system>_instepab" are _instep and _instepa whose
# loads ask the store for their plans themselves (PEGAFLOW_BEGIN_AT_LOOKUP=0) where the lookup begins
# them by default: the A/B of one round trip before the copy against the store's plan moved onto
# vLLM's scheduling thread.
# the connector's preset low_ttft takes these arms' values: one source, so the two cannot drift
_PACED = dict(LOW_TTFT_LEAD)
_STAGED = {"PEGAFLOW_PRESTAGE_MIB": LOW_TTFT_PRESTAGE_MIB[True]}  # with a GPU; the caller's own value wins (Systems.env)
# Without a GPU the host engine stages in host memory: 4 GiB of it beside vLLM's CPU KV cache got
# a worker killed for memory on the 24 GiB build VM; a CPU run's loads are small (the caller's value wins)
CPU_STAGED_MIB = LOW_TTFT_PRESTAGE_MIB[False]
_PRESET = {"PEGAFLOW_PRESET": "low_ttft"}  # the _lowttft systems: the preset alone, as a user asks for it
VARIANT_ENV = {"instepg": {"PEGAFLOW_CUDA_LAYER_GROUP_KIB": "256"}, "instep2": {"PEGAFLOW_CUDA_LAYER_LANES": "2"},
               "instepc": {"PEGAFLOW_CUDA_LAYER_KERNEL_BLOCKS": "264"}, "v1cross": {"VLLM_USE_V2_MODEL_RUNNER": "0"},
               "instepl": {"PEGAFLOW_CUDA_LAYER_LEAD_MIB": "160"}, "instepk": {"PEGAFLOW_CUDA_LAYER_LEAD_MIB": "1024"},
               "instepz": {"PEGAFLOW_CUDA_LAYER_LEAD_MIB": "16384"},
               "instepp": _PACED, "instepx": {**_PACED, **_STAGED},
               "instepx2": {**_PACED, **_STAGED, "PEGAFLOW_PRESTAGE_DEPTH": "2"},
               "instepxh": {**_PACED, **_STAGED, "PEGAFLOW_JVM_OPTIONS": "-Xms192m -Xmn128m"},
               "instepxk": {**_PACED, **_STAGED, "PEGAFLOW_CUDA_SAVE_KERNEL_BLOCKS": "16"},
               "instepxs": {**_PACED, **_STAGED, "PEGAFLOW_CUDA_BOUNCE_MIB": "2"},
               "instepxp": {**_PACED, **_STAGED, "PEGAFLOW_CUDA_SAVE_PACE": "1"},
               "instepxq": {**_PACED, **_STAGED, "PEGAFLOW_CUDA_SAVE_PACE": "2"},
               "instepxu": {**_PACED, **_STAGED, "PEGAFLOW_CUDA_SAVE_PACE": "0"},
               "instepxb": {**_PACED, **_STAGED},
               "instepxc": {**_PACED, **_STAGED, "PEGAFLOW_LOCAL_SPIN_US": "1000"},
               **{f"instepxr{n}": {**_PACED, **_STAGED, "PEGAFLOW_COMPUTE_SHARE": f"0.0{n}"} for n in (3, 5, 7, 8)},
               "instepxbr5": {**_PACED, **_STAGED, "PEGAFLOW_COMPUTE_SHARE": "0.05"},
               "instepy": _STAGED, "asyncx": _STAGED,
               "lowttft": _PRESET, "lowttftb": _PRESET,
               "instepaw": {"PEGAFLOW_WARM_UP": "0"}, "instepb": {"PEGAFLOW_BEGIN_AT_LOOKUP": "0"},
               "instepab": {"PEGAFLOW_BEGIN_AT_LOOKUP": "0"}}
AT_ALLOC = ("instepa", "instepl", "instepk", "instepz", "instepp", "instepx", "instepx2", "instepxh", "instepxk", "instepxs",
            "instepxp", "instepxq", "instepxu", "instepxb", "instepxc", "instepxr3", "instepxr5", "instepxr7", "instepxr8",
            "instepxbr5", "instepaw", "instepab")
_AT_ALLOC_NAMES = ", ".join(f"_{v}" for v in AT_ALLOC[:-1]) + f" and _{AT_ALLOC[-1]}"
# pegaflow-server arguments of a server variant (the variant's name after "server_")
_BUSY_POLL = ("--busy-poll-us", "1000000")
VARIANT_SERVER_ARGS = {"instepxb": _BUSY_POLL, "instepxbr5": _BUSY_POLL, "lowttftb": _BUSY_POLL}
SERVER_ONLY = ("instepxb", "instepxc", "instepxbr5", "lowttftb")  # about the round trip to a server: no embedded twin
VARIANTS = tuple(f"{base}_{v}" for v in ("async", "asyncx", "instep", "instepb", "instepy", *AT_ALLOC, "instepg", "instep2", "instepc",
                                          "v1cross", "lowttft", "lowttftb")
                 for base in ("embedded", "server") if base == "server" or v not in SERVER_ONLY)
WORKER = Path(__file__).with_name("ttft_worker.py")


def _tokens(text: str) -> int:
    text = text.strip().lower()
    return int(float(text[:-1]) * 1024) if text.endswith("k") else int(text)


def _label(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(round(q * (len(s) - 1))))], 2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def line_rate_gbps() -> float | None:
    """One large pinned host-to-device copy, best of five (the PCIe line of this run); None
    without a GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    n = 1 << 30
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    best = 0.0
    for _ in range(6):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        best = max(best, n / (time.perf_counter() - t) / 1e9)
    del host, dev
    torch.cuda.empty_cache()
    return round(best, 2)


def _wait_port(port: int, proc: subprocess.Popen, what: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{what} not listening on {port} after {timeout:.0f} s:\n{log.read_text()[-3000:]}")


class Systems:
    """Starts what each system needs and names its vLLM connector config and environment."""

    def __init__(self, args, work: Path, gpu: bool = True):
        self.args = args
        self.work = work
        self.gpu = gpu  # False: the staged variants' buffer is host memory (CPU_STAGED_MIB unless the caller set one)
        import pegaflow

        self.ours = str(Path(pegaflow.__file__).resolve().parent.parent)
        self.pool_bytes = _bytes(args.pool_size)

    def env(self, system: str) -> dict:
        env = dict(os.environ)
        variant_env = VARIANT_ENV.get(system.partition("_")[2], {}) if system in VARIANTS else {}
        env.update(variant_env)
        if "PEGAFLOW_PRESTAGE_MIB" in variant_env:  # the caller's own value, else the GPU's or the host's default
            env["PEGAFLOW_PRESTAGE_MIB"] = os.environ.get("PEGAFLOW_PRESTAGE_MIB") or (
                variant_env["PEGAFLOW_PRESTAGE_MIB"] if self.gpu else CPU_STAGED_MIB)
        if "PEGAFLOW_JVM_OPTIONS" in variant_env:  # the variant's after the caller's (a GC log, say): both apply
            env["PEGAFLOW_JVM_OPTIONS"] = f"{os.environ.get('PEGAFLOW_JVM_OPTIONS', '')} {variant_env['PEGAFLOW_JVM_OPTIONS']}".strip()
        env.pop("PYTHONHASHSEED", None)  # as users run it: processes share without it
        paths = [self.args.pegaflow_site] if system == "pegaflow" else [self.ours]
        paths += [p for p in (self.args.vllm_site, env.get("PYTHONPATH", "")) if p]
        if system == "pegaflow":
            paths = [p for p in paths if Path(p).resolve() != Path(self.ours)]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        return env

    def start(self, system: str, server_args: tuple = ()):
        """(kv_transfer config or None, a stop function); ``self.server_metrics``: the
        ``/metrics`` address of the pegaflow-server it started (None for other systems), started
        with ``server_args`` beside the run's own."""
        self.server_metrics = None
        base, _, variant = system.partition("_") if system in VARIANTS else (system, "", "")
        if variant:
            kv, stop = self.start(base, VARIANT_SERVER_ARGS.get(variant, ()))
            extra = kv["kv_connector_extra_config"]
            if variant.startswith(("async", "instep")):
                extra["load_in_step"] = not variant.startswith("async")
            if variant in AT_ALLOC:
                extra["load_at_alloc"] = True
            extra["cross_layer_blocks"] = variant == "v1cross" or extra.get("cross_layer_blocks", True)
            return kv, stop
        if system == "none":
            return None, lambda: None
        if system == "embedded":
            return {"kv_connector": "PegaKVConnector", "kv_connector_module_path": "pegaflow.connector",
                    "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                    "kv_connector_extra_config": {"mode": "embedded", "pool_size": self.args.pool_size}}, lambda: None
        if system == "server":
            from pegaflow._server import start_server

            server = start_server(Path(self.args.pool_dir) / f"pegaflow-ttft-{os.getpid()}.pool",
                                  pool_size=self.args.pool_size, extra=list(server_args))
            self.server_metrics = f"http://127.0.0.1:{server.http_port}/metrics"
            return {"kv_connector": "PegaKVConnector", "kv_connector_module_path": "pegaflow.connector",
                    "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                    # the link's health check is an empty Query each interval: none in the counted phases
                    "kv_connector_extra_config": {"mode": "server", "endpoint": server.endpoint,
                                                  "health_interval_s": 3600}}, server.stop
        if system == "vllm_native":
            return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                    "kv_connector_extra_config": {"cpu_bytes_to_use": self.pool_bytes}}, lambda: None
        if system == "pegaflow":
            if not self.args.pegaflow_site:
                raise RuntimeError("system pegaflow needs --pegaflow-site (the original PegaFlow's wheel unpacked)")
            port, http = _free_port(), _free_port()
            log = self.work / "pegaflow-server.log"
            proc = subprocess.Popen([sys.executable, "-m", "pegaflow._server", "--pool-size", self.args.pool_size,
                                     "--devices", "0", "--addr", f"127.0.0.1:{port}", "--http-addr",
                                     f"127.0.0.1:{http}"], env=self.env("pegaflow"), stdout=log.open("w"),
                                    stderr=subprocess.STDOUT, cwd=self.work)
            t = time.perf_counter()
            _wait_port(port, proc, "PegaFlow's server", log, 300)
            print(f"  PegaFlow's server listening after {time.perf_counter() - t:.1f} s", file=sys.stderr)

            def stop():
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()

            return {"kv_connector": "PegaKVConnector", "kv_connector_module_path": "pegaflow.connector",
                    "kv_role": "kv_both",
                    "kv_connector_extra_config": {"pegaflow.host": "http://127.0.0.1", "pegaflow.port": port}}, stop
        raise ValueError(f"system {system!r}; expected one of {SYSTEMS}")


def _bytes(text: str) -> int:
    units = {"kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "tb": 1 << 40}
    t = text.strip().lower()
    for u, m in units.items():
        if t.endswith(u):
            return int(float(t[:-2]) * m)
    return int(t)


def _worker_process(systems: Systems, name: str, system: str, spec: dict, timeout: float) -> dict:
    """``ttft_worker.py`` in a fresh process with ``system``'s environment: its report."""
    spec_path = systems.work / f"{name}.spec.json"
    out_path = systems.work / f"{name}.out.json"
    spec_path.write_text(json.dumps(dict(spec, name=name)))
    log = systems.work / f"{name}.log"
    # run from the work folder: a script's own folder leads sys.path, and ours holds other modules
    worker = systems.work / WORKER.name
    worker.write_text(WORKER.read_text())
    t = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.call([sys.executable, str(worker), str(spec_path), str(out_path)],
                             env=systems.env(system), stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                             cwd=systems.work)
    if rc != 0:
        how = " (killed by SIGKILL: out of memory?)" if rc == -9 else ""
        raise RuntimeError(f"system {name}: worker exited with {rc}{how}:\n{log.read_text()[-4000:]}")
    out = json.loads(out_path.read_text())
    out["process_s"] = round(time.perf_counter() - t, 1)
    return out


def run_worker(systems: Systems, system: str, spec: dict, timeout: float, name: str | None = None) -> dict:
    kv, stop = systems.start(system)
    try:
        return _worker_process(systems, name or system, system, dict(spec, kv_transfer=kv, gpu_hit=system == "none",
                                                                     server_metrics=systems.server_metrics), timeout)
    finally:
        stop()


def error_text(e: BaseException, limit: int = 1200) -> str:
    """A failed system's error for the report: its first line (which process exited, and how)
    and the end of what it said, within ``limit`` characters; a log's tail alone hid the exit
    code (a worker killed for memory ended with vLLM's last warnings)."""
    text = str(e)
    if len(text) <= limit:
        return text
    head = text.split("\n", 1)[0][:200]
    return head + "\n...\n" + text[-(limit - len(head) - 5):]


def java_warnings(text: str, limit: int = 20) -> list[str]:
    """The JVM's warnings and errors in a process log, one line each as the engine logs them
    (``io.pegaflow.engine.logging``: text ``<instant> WARN [<thread>] io.pegaflow...: <message>``
    or a JSON object per line), at most ``limit`` of them, each cut at 400 characters: a warning
    said once early in a process (a staging that failed, a buffer that could not be had) falls
    outside the tail the run prints of each log. Also the process's one line on where its lookup
    warm-up ran (``LookupWarmUp``, at info: as a client of a scratch server or on an embedded
    scratch engine), which says what the first requests' calls had compiled."""
    out = []
    for line in text.splitlines():
        text_form = "] io.pegaflow." in line and (" WARN [" in line or " ERROR [" in line)
        json_form = '"logger":"io.pegaflow.' in line and ('"level":"WARN"' in line or '"level":"ERROR"' in line)
        warm_up = "io.pegaflow.connector.LookupWarmUp" in line and "lookup warm-up: " in line
        if text_form or json_form or warm_up:
            out.append(line.strip()[:400])
            if len(out) == limit:
                break
    return out


def round_key(system: str, r: int) -> str:
    """A system's key in the report for its round ``r`` (from 1; ``--rounds``): the system's
    name in the first, ``<system>@<r>`` after it."""
    return system if r == 1 else f"{system}@{r}"


def split_key(key: str) -> tuple[str, int]:
    """:func:`round_key`'s inverse: (system, round)."""
    system, _, r = key.partition("@")
    return system, int(r or 1)


def api_server_command(args, model: str, length: int, port: int, kv: dict | None) -> list[str]:
    """vLLM's OpenAI server for the load, in the run's modes: eager unless ``--enforce-eager off``
    (CUDA graphs, vLLM's own default), asynchronous scheduling as ``--async-scheduling`` says."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--load-format", "dummy",
           "--skip-tokenizer-init", "--dtype", "bfloat16", "--max-model-len", str(length + 64),
           "--host", "127.0.0.1", "--port", str(port), "--gpu-memory-utilization", "0.85",
           "--num-gpu-blocks-override", str(args.load_gpu_blocks), "--max-num-seqs", str(max(args.concurrency, 8))]
    if args.enforce_eager == "on":
        cmd += ["--enforce-eager"]
    if kv is not None:
        cmd += ["--kv-transfer-config", json.dumps(kv)]
    if args.async_scheduling != "auto":  # as for every other system of the run
        cmd += ["--async-scheduling" if args.async_scheduling == "on" else "--no-async-scheduling"]
    return cmd


def load_test(systems: Systems, system: str, args, model: str, timeout: float) -> dict:
    """``--load-requests`` requests through vLLM's OpenAI server, ``--concurrency`` at a time. The
    server's whole log is kept beside the report (``<report>-<system>.api.log``): in the nineteenth
    GPU run a server that did not start left only the end of its traceback, not the cause."""
    kv, stop = systems.start(system)
    port = _free_port()
    log = systems.work / f"{system}.api.log"
    length = _tokens(args.load_length)
    cmd = api_server_command(args, model, length, port, kv)
    env = systems.env(system)
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=systems.work)
    try:
        try:
            openai_http.wait_ready(port, proc, log, timeout)
        except AssertionError as e:
            raise RuntimeError(f"system {system}: {e}") from None
        rnd = random.Random(args.seed)
        uniques: list[list[int]] = []
        plan: list[list[int]] = []
        for i in range(args.load_requests):
            if uniques and rnd.random() < 0.5:
                plan.append(rnd.choice(uniques))
            else:
                p = [200 + len(uniques)] + [rnd.randrange(1000, 128000) for _ in range(length - 1)]
                uniques.append(p)
                plan.append(p)
        def one(p):
            t = time.perf_counter()
            openai_http.complete(port, model, p, 1, timeout=600)
            return (time.perf_counter() - t) * 1e3

        one(plan[0][:2048])  # warm-up, not counted
        t = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            lat = list(pool.map(one, plan))
        elapsed = time.perf_counter() - t
        repeats = len(plan) - len(uniques)
        return {"requests": len(plan), "repeats": repeats, "concurrency": args.concurrency, "prompt_tokens": length,
                "ttft_p50_ms": _p(lat, 0.5), "ttft_p99_ms": _p(lat, 0.99), "requests_per_s": round(len(plan) / elapsed, 2)}
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        stop()
        try:  # the whole log beside the report: the work folder goes at the run's end
            shutil.copyfile(log, Path(args.json).with_name(f"{Path(args.json).stem}-{system}.api.log"))
        except OSError:
            pass


def cold_start(args, work: Path, spec: dict, length: int) -> dict:
    """The first request after a cold start (``--cold-start POOL``): a fresh ``pegaflow-server``
    with a pool of POOL bytes under ``--pool-dir``, a fresh vLLM (the writer) answers one prompt
    and exits after its saves landed, then another fresh vLLM (the reader) asks the same prompt as
    its very first request, no warm-up before it. Timed: the server until it listens, each
    engine until ready (``LLM()`` returned: the pool attached and registered), and the reader's
    first answer from its engine being ready (target: within 5 s, from the store)."""
    import argparse as _argparse

    cold_args = _argparse.Namespace(**dict(vars(args), pool_size=args.cold_start))
    systems = Systems(cold_args, work)
    t = time.perf_counter()
    kv, stop = systems.start("server")
    out = {"pool_size": args.cold_start, "pool_dir": args.pool_dir, "length": length,
           "server_ready_s": round(time.perf_counter() - t, 2)}
    try:
        for role in ("writer", "reader"):
            one = dict(spec, kv_transfer=kv, gpu_hit=False, cold_start={"length": length, "role": role},
                       max_model_len=length + 256)
            res = _worker_process(systems, f"cold-{role}", "server", one, args.timeout)
            first = res["first"]
            out[role] = {"start_s": round(res["start_s"], 2), "ttft_ms": round(first["ttft_ms"], 1),
                         "ready_to_answer_s": round(first["ready_to_answer_s"], 3),
                         "cached_tokens": first["cached_tokens"], "token_ids": first["token_ids"][:8]}
            out[role]["_ids"] = first["token_ids"]
        reader, writer = out["reader"], out["writer"]
        reader["from_store"] = reader["cached_tokens"] > 0  # its own prefix cache is empty: any hit is the store's
        out["outputs_identical"] = reader.pop("_ids") == writer.pop("_ids")
        out["within_5s"] = reader["from_store"] and reader["ready_to_answer_s"] <= 5.0
    finally:
        stop()
    return out


DECODE_STEPS_SHOWN = 6


def decode_steps(requests: list, shown: int = DECODE_STEPS_SHOWN) -> list:
    """The median over ``requests`` of each of their first decode steps (ttft_worker's
    ``step_ms``), ms; as many steps as every request has, up to ``shown``."""
    runs = [x["step_ms"] for x in requests if x.get("step_ms")]
    if not runs:
        return []
    return [_p([run[i] for run in runs], 0.5) for i in range(min(shown, *(len(run) for run in runs)))]


# An answer's decode steps from this index on are its settled ones: a cold answer's save runs
# beside its first steps and is over by then.
SETTLED_FROM = 8


def _settled(requests: list, settled_from: int) -> list[tuple[list, float]]:
    """Each of ``requests`` with steps past ``settled_from`` (ttft_worker's ``step_ms``): its
    steps and the median of those from index ``settled_from`` on."""
    return [(x["step_ms"], statistics.median(x["step_ms"][settled_from:])) for x in requests
            if len(x.get("step_ms") or []) > settled_from]


def decode_extra_ms(requests: list, first: int = DECODE_STEPS_SHOWN, settled_from: int = SETTLED_FROM) -> float | None:
    """How much longer an answer's first decode steps ran than its settled ones, in all: for each
    of ``requests`` with enough steps, the sum of its first ``first`` steps minus ``first`` times
    its settled median (``_settled``); the median over the answers, ms."""
    extra = [sum(steps[:first]) - first * settled for steps, settled in _settled(requests, settled_from)]
    return _p(extra, 0.5) if extra else None


def settled_step_ms(requests: list, settled_from: int = SETTLED_FROM) -> float | None:
    """An answer's decode step once its first steps are over: the median over ``requests`` of
    each one's settled median (``_settled``), ms. Against no connector's it is what a connector
    adds to every step, apart from what its saves add to the first ones (``decode_extra_ms``)."""
    settled = [m for _, m in _settled(requests, settled_from)]
    return _p(settled, 0.5) if settled else None


def _probe(r: dict, phase: str) -> float | None:
    return ((r.get(f"{phase}_threads") or {}).get("cpu_probe") or {}).get("torch_us")


def summarize(results: dict, lengths: list[int], bytes_per_token: int, line: float | None) -> dict:
    systems = {}
    for system, res in results.items():
        # against no connector of the same round (``--rounds``): processes run close in time
        base_name, rnd = split_key(system)
        none = results.get(round_key("none", rnd), {}).get("lengths", {})
        if "error" in res:
            systems[system] = {"error": res["error"]}
            continue
        entry = {"start_s": round(res.get("start_s", 0.0), 1)}
        if res.get("zero_output_stats_recorded"):
            # this vLLM's offline engine drops the stats of steps without request outputs; the
            # worker recorded them (ttft_worker.record_zero_output_steps): counters complete
            entry["zero_output_stats_recorded"] = True
        for n in lengths:
            r = res["lengths"][str(n)]
            cold = [x["ttft_ms"] for x in r["cold"]]
            row = {"cold_p50_ms": _p(cold, 0.5)}
            # decode while this request's saves go out: its mean time between tokens
            itl = [x["itl_ms"] for x in r["cold"] if "itl_ms" in x]
            row["cold_itl_p50_ms"] = _p(itl, 0.5) if itl else None
            ref = none.get(str(n), {}).get("gpu_hit")
            base = none.get(str(n), {}).get("cold")
            if base_name != "none" and base:
                # against no connector in this run (the targets: 1.02x cold TTFT, 1.05x decode)
                row["cold_vs_none"] = round(row["cold_p50_ms"] / _p([x["ttft_ms"] for x in base], 0.5), 3)
                base_itl = [x["itl_ms"] for x in base if "itl_ms" in x]
                if itl and base_itl:
                    row["cold_itl_vs_none"] = round(row["cold_itl_p50_ms"] / _p(base_itl, 0.5), 3)
                mine_steps, their_steps = decode_steps(r["cold"]), decode_steps(base)
                extra, their_extra = decode_extra_ms(r["cold"]), decode_extra_ms(base)
                if extra is not None and their_extra is not None:
                    # the first steps' extra time, beside no connector's own (its first step is slower too)
                    row["cold_decode_extra_ms"] = extra
                    row["none_cold_decode_extra_ms"] = their_extra
                settled, their_settled = settled_step_ms(r["cold"]), settled_step_ms(base)
                if settled is not None and their_settled:
                    # every step's part of the decode figure, after the save's first steps
                    row["cold_settled_step_ms"] = settled
                    row["cold_settled_step_vs_none"] = round(settled / their_settled, 3)
                if mine_steps and their_steps:
                    # step by step: the first ones run beside the save, the rest after it
                    row["cold_decode_steps_ms"] = mine_steps
                    row["cold_decode_steps_vs_none"] = [round(a / b, 3) for a, b in zip(mine_steps, their_steps) if b]
                # the same against how fast each process ran CPU work before the phase
                # (ttft_worker.cpu_probe): a ratio near the decode's says the host, not the step
                mine, theirs = _probe(r, "cold"), _probe(none.get(str(n), {}), "cold")
                if mine and theirs:
                    row["cold_cpu_probe_vs_none"] = round(mine / theirs, 3)
            if base_name == "none":
                row["gpu_hit_p50_ms"] = _p([x["ttft_ms"] for x in r["gpu_hit"]], 0.5)
                row["outputs_identical"] = [x["token_ids"] for x in r["gpu_hit"]] == [x["token_ids"] for x in r["cold"]]
                row["gpu_hit_cached_tokens"] = [x["cached_tokens"] for x in r["gpu_hit"]]
                row.update(around_queued(r["gpu_hit"], "gpu_hit"))
            else:
                warm = r.get("warm", [])
                row["warm_p50_ms"] = _p([x["ttft_ms"] for x in warm], 0.5)
                row["warm_cached_tokens"] = [x["cached_tokens"] for x in warm]
                row.update(around_queued(warm, "warm"))
                # None: no reference in this run (system none not run)
                row["outputs_identical"] = None if not ref else [x["token_ids"] for x in warm] == [x["token_ids"] for x in ref]
                row["reset_ok"] = r.get("reset_ok")
                own = r.get("own_gpu_hit") or []
                if own:
                    # this process's GPU hit right after its warm answers (ttft_worker): the
                    # 1.2x target read within one process, beside the run's GPU hit of system none
                    row["own_gpu_hit_p50_ms"] = _p([x["ttft_ms"] for x in own], 0.5)
                    row["own_gpu_hit_identical"] = [x["token_ids"] for x in own] == [x["token_ids"] for x in warm]
                    # blocks this project's connector loaded meanwhile: some of it was not a GPU hit
                    row["own_gpu_hit_loaded_blocks"] = int((r.get("own_gpu_hit_counters") or {}).get("vllm:pegaflow_loaded_blocks", 0))
                phases = in_step_phases_ms(r.get("warm_counters") or {})
                if phases:
                    row["warm_in_step_phases_ms"] = phases  # this length's warm in-step loads alone
                staged = (r.get("warm_counters") or {}).get("vllm:pegaflow_loads_staged")
                if staged is not None:
                    row["warm_loads_staged"] = int(staged)  # loads of any kind that read a staging (PEGAFLOW_PRESTAGE_MIB)
                lookups = staging_counts(r.get("warm_counters") or {})
                if lookups:
                    row["warm_lookup_stagings"] = lookups  # what the warm lookups began and staged, or why not
                lookup_ms = warm_lookup_ms(r.get("warm_counters") or {})
                if lookup_ms is not None:
                    row["warm_lookup_ms"] = lookup_ms  # the warm lookups on vLLM's scheduling thread, mean
                calls = server_calls(r.get("warm_counters") or {}, len(warm))
                if calls:
                    row["warm_server_calls"] = calls  # server mode: the control path of this length's warm requests
                query = server_query_phases(r.get("warm_counters") or {})
                if query:
                    row["warm_server_query_phases_ms"] = query  # inside the server's Query: its store's phases
                timeline = warm_timeline_ms(r.get("warm_counters") or {}, warm)
                if timeline:
                    row["warm_timeline_ms"] = timeline  # from vLLM's QUEUED event to the first token, means
            for phase in ("cold", "warm"):
                # the process's threads during the phase: the main thread's CPU and switches, the others' CPU
                if r.get(f"{phase}_threads"):
                    row[f"{phase}_threads"] = r[f"{phase}_threads"]
                hooks = hook_ms_per_step(r.get(f"{phase}_counters") or {})
                if hooks:
                    row[f"{phase}_hook_ms_per_step"] = hooks
            if line:
                row["line_floor_ms"] = round(n * bytes_per_token / (line * 1e9) * 1e3, 2)
                if row.get("warm_p50_ms") and row.get("own_gpu_hit_p50_ms"):
                    # warm TTFT over max(own GPU hit, line floor): wave 3's target is 1.2; only where
                    # the warm answers came from the store (vLLM's cache was reset, every answer
                    # had cached tokens) and the GPU hits were GPU hits with the same answers
                    meaningful = (row.get("reset_ok") is True and all(c > 0 for c in row["warm_cached_tokens"])
                                  and row["own_gpu_hit_identical"] and row["own_gpu_hit_loaded_blocks"] == 0)
                    row["warm_vs_own_bound"] = round(row["warm_p50_ms"] / max(row["own_gpu_hit_p50_ms"], row["line_floor_ms"]), 3) \
                        if meaningful else None
                    own_from = around_queued(r.get("own_gpu_hit") or [], "own").get("own_from_queued_p50_ms")
                    if meaningful and row.get("warm_from_queued_p50_ms") and own_from:
                        # the same from vLLM's QUEUED event on, the GPU hit's taken the same way: what
                        # vLLM's front end and the engine core's intake spend before it is in every
                        # system's TTFT and in no line floor (around_queued)
                        row["warm_from_queued_vs_own_bound"] = round(
                            row["warm_from_queued_p50_ms"] / max(own_from, row["line_floor_ms"]), 3)
            entry[_label(n)] = row
        if "load" in res:
            entry["load"] = res["load"]
        c = res.get("connector") or {}
        phases = in_step_phases_ms(c)
        if phases:
            entry["in_step_phases_ms"] = phases  # over the whole run (cold, warm, warm-up)
            entry["in_step_loads"] = int(c["vllm:pegaflow_in_step_loads"])
        if c.get("vllm:pegaflow_lookups"):
            entry["lookup_ms_mean"] = round(c.get("vllm:pegaflow_lookup_ns", 0) / c["vllm:pegaflow_lookups"] / 1e6, 3)
        systems[system] = entry
    return systems


def rounds_summary(systems: dict, lengths: list[int]) -> dict:
    """With ``--rounds``: per system and length, each round's figures (cold decode spacing, its
    ratio to no connector's of the same round, the CPU probe's ratio, warm TTFT, the process's
    own GPU hit and the warm TTFT over the larger of that and the line floor) and their
    medians: one process's host speed varies between processes of one run, so a ratio is read
    over rounds, each against the neighbour run beside it. A round without a figure (its process
    failed, or the figure does not apply) is None in the list; the median is over the others."""
    out: dict = {}
    rounds = max((split_key(k)[1] for k in systems), default=1)
    keys = ("cold_itl_p50_ms", "cold_itl_vs_none", "cold_settled_step_vs_none", "cold_cpu_probe_vs_none", "warm_p50_ms", "gpu_hit_p50_ms",
            "own_gpu_hit_p50_ms", "warm_vs_own_bound")
    for key, entry in systems.items():
        base, rnd = split_key(key)
        for n in lengths:
            row = entry.get(_label(n))
            if not isinstance(row, dict):
                continue
            slot = out.setdefault(base, {}).setdefault(_label(n), {})
            for k in keys:
                if row.get(k) is not None:
                    slot.setdefault(f"{k[:-3] if k.endswith('_ms') else k}_rounds", [None] * rounds)[rnd - 1] = row[k]
    for per_length in out.values():
        for slot in per_length.values():
            for k in list(slot):
                values = [v for v in slot[k] if v is not None]
                slot[k.replace("_rounds", "_median")] = round(statistics.median(values), 3)
    return out


def in_step_phases_ms(counters: dict) -> dict:
    """The in-step loads' phases in mean ms per load from connector counters (vllm:pegaflow_*),
    with, where counted, ``alloc_to_start`` (a load's blocks allocated to its step's
    ``start_load_kv`` done) and ``fence`` (that call's wait for the compute stream); empty
    without in-step loads."""
    loads = counters.get("vllm:pegaflow_in_step_loads", 0)
    if not loads:
        return {}
    out = {k: round(counters.get(f"vllm:pegaflow_in_step_{k}_ns", 0) / loads / 1e6, 3)
           for k in ("plan", "hop", "store", "load", "wait", "step")}
    for k in ("build", "submit", "first_copy"):  # since efb74d6 (first_copy: d639cae): absent, not 0, with an older jar
        if f"vllm:pegaflow_in_step_{k}_ns" in counters:
            out[k] = round(counters[f"vllm:pegaflow_in_step_{k}_ns"] / loads / 1e6, 3)
    for name, count, ns in (("alloc_to_start", "alloc_to_load_starts", "alloc_to_load_ns"),
                            ("fence", "load_fences", "load_fence_ns")):
        if counters.get(f"vllm:pegaflow_{count}"):
            out[name] = round(counters.get(f"vllm:pegaflow_{ns}", 0) / counters[f"vllm:pegaflow_{count}"] / 1e6, 3)
    if "vllm:pegaflow_loads_staged" in counters:  # the share of loads read from a staging (PEGAFLOW_PRESTAGE_MIB)
        out["staged_share"] = round(counters["vllm:pegaflow_loads_staged"] / loads, 3)
    return out


def around_queued(rows: list, prefix: str) -> dict:
    """A phase's answers by vLLM's own request times, p50s over the answers:
    ``<prefix>_queued_p50_ms`` (QUEUED, the engine core adding the request, to its first
    schedule: an asynchronous load waits there), ``<prefix>_scheduled_to_first_p50_ms``, and
    each answer split at QUEUED: ``<prefix>_before_queued_p50_ms``, its TTFT less QUEUED to first
    token (vLLM's front end and the engine core's intake of the prompt, before any connector sees
    the request: every system pays it, the GPU hit included, and the line floor holds none of it),
    and ``<prefix>_from_queued_p50_ms``, QUEUED to first token. Empty unless every answer has
    both times (``queued_ms``, ``scheduled_to_first_ms``; the worker records them together)."""
    if not rows or not all("queued_ms" in x and "scheduled_to_first_ms" in x for x in rows):
        return {}
    since = [x["queued_ms"] + x["scheduled_to_first_ms"] for x in rows]
    return {f"{prefix}_queued_p50_ms": _p([x["queued_ms"] for x in rows], 0.5),
            f"{prefix}_scheduled_to_first_p50_ms": _p([x["scheduled_to_first_ms"] for x in rows], 0.5),
            f"{prefix}_before_queued_p50_ms": _p([x["ttft_ms"] - q for x, q in zip(rows, since)], 0.5),
            f"{prefix}_from_queued_p50_ms": _p(since, 0.5)}


def warm_timeline_ms(counters: dict, warm: list) -> dict:
    """Where a phase's warm requests spent their time, mean ms after each request's QUEUED event
    (vLLM's engine core adding it; one monotonic clock for vLLM, the connector and the JVM):
    ``lookup`` (the hit's lookup began), ``alloc`` (its blocks allocated: a load at allocation
    starts there), ``landed`` (that plus the in-step load: its last byte seen landed), ``first_token``
    (vLLM's own queued and scheduled-to-first-token times); and ``after_landed``, the last less
    ``landed``: the last layer, the logits, the sampling and vLLM's output after the load. Empty
    without the connector's counters (``hits_timed``: an older wheel, stats off) or vLLM's times."""
    timed = counters.get("vllm:pegaflow_hits_timed", 0)
    firsts = [x["queued_ms"] + x["scheduled_to_first_ms"] for x in warm
              if "queued_ms" in x and "scheduled_to_first_ms" in x]
    if not timed or not firsts:
        return {}
    out = {"lookup": counters.get("vllm:pegaflow_queued_to_lookup_ns", 0) / timed / 1e6,
           "alloc": counters.get("vllm:pegaflow_queued_to_alloc_ns", 0) / timed / 1e6}
    loads = counters.get("vllm:pegaflow_in_step_loads", 0)
    if loads and counters.get("vllm:pegaflow_in_step_at_alloc", 0) == loads:  # every load timed from its allocation
        out["landed"] = out["alloc"] + counters.get("vllm:pegaflow_in_step_load_ns", 0) / loads / 1e6
    out["first_token"] = statistics.fmean(firsts)
    if "landed" in out:
        out["after_landed"] = out["first_token"] - out["landed"]
    return {k: round(v, 3) for k, v in out.items()}


STAGING_COUNTERS = {"begun": "begun_at_lookup", "staged": "stagings", "busy": "staging_busy",
                    "too_large": "staging_too_large", "failed": "staging_failed", "unavailable": "staging_unavailable",
                    "not_begun_no_worker": "begin_no_worker", "not_begun_declined": "begin_declined"}


def warm_lookup_ms(counters: dict) -> float | None:
    """Mean ms of the connector's lookups a phase moved (``vllm:pegaflow_lookup_ns`` over
    ``vllm:pegaflow_lookups``), as its scheduler side timed them on vLLM's scheduling thread:
    the block keys, the store's query (in server mode its round trip to the server) and the
    load it began. A warm request's lookup comes before its allocation, so in server mode this
    beside ``warm_server_calls``' server-timed Query says what the round trip's client half
    costs. None where the phase counted no lookup."""
    n = counters.get("vllm:pegaflow_lookups", 0)
    if not n:
        return None
    return round(counters.get("vllm:pegaflow_lookup_ns", 0) / n / 1e6, 3)


def staging_counts(counters: dict) -> dict:
    """The lookups' side of loads staged at their lookup (PEGAFLOW_PRESTAGE_MIB), from connector
    counters: lookups that began their load, loads staged, and lookups that staged nothing because
    the buffer was occupied, the load too large, the staging failed or the buffer could not be had,
    and hits whose load did not begin at the lookup (no worker in the scheduler's process, or the
    engine declined). Where a warm load read no staging (``warm_loads_staged`` 0), this says which
    of those it was. Empty without the counters (an older jar, or a system without the connector)."""
    if not any(f"vllm:pegaflow_{c}" in counters for c in STAGING_COUNTERS.values()):
        return {}
    out = {k: int(counters.get(f"vllm:pegaflow_{c}", 0)) for k, c in STAGING_COUNTERS.items()}
    started = counters.get("vllm:pegaflow_staging_starts", 0)
    if started:  # how soon a staging started, mean ms from its lookup: the thread's start, the layout, the first group queued
        for k in ("to_thread", "layout", "to_first"):
            out[f"{k}_ms"] = round(counters.get(f"vllm:pegaflow_staging_{k}_ns", 0) / started / 1e6, 3)
    landed = counters.get("vllm:pegaflow_staging_landed", 0)
    if landed:  # and to its first group landed (host-timed): beside to_first, the copy engine's start and the group's copy
        out["to_landed_ms"] = round(counters.get("vllm:pegaflow_staging_to_landed_ns", 0) / landed / 1e6, 3)
    paced = counters.get("vllm:pegaflow_staging_paced_groups", 0)
    if paced:  # groups queued while paced, a load's mean, and the host's mean µs between seeing one land and the next queued
        out["paced_groups"] = round(paced / max(1, out["staged"]), 1)
        out["paced_gap_us"] = round(counters.get("vllm:pegaflow_staging_paced_gap_ns", 0) / paced / 1e3, 1)
    return out


def server_calls(counters: dict, requests: int) -> dict:
    """Server mode: the pegaflow-server calls a phase moved (``server:calls:<method>`` and
    ``server:seconds:<method>``, from its ``/metrics``; gRPC and local socket alike), by method:
    calls per request and mean ms per call as the server timed them (its side of each round
    trip). A warm request's control path by phase: Query (lookup and lease, and the plan where
    the lookup began the load), BeginLoad and LoadRest (the plan, where it did not), EndCopy
    (the ends, beside the copies), ReserveSave (saves). Empty for other systems."""
    out = {}
    for key, n in sorted(counters.items()):
        if key.startswith("server:calls:") and n > 0:
            method = key.split(":", 2)[2]
            out[method] = {"per_request": round(n / requests, 2) if requests else None,
                           "mean_ms": round(counters.get(f"server:seconds:{method}", 0.0) / n * 1e3, 3)}
    return out


def server_query_phases(counters: dict) -> dict:
    """Server mode: mean ms per Query the server answered, of its store's phases (ttft_worker's
    ``server:query_s:<phase>``): lookup (the resident prefix in the index), lease (the prefix's
    blocks marked, the lease issued), plan (where the lookup began the load: its blocks pinned, its
    copy planned); the rest of the server-timed Query is the request's parsing, the caller's
    check, the answer's encoding and its write. Empty without Query calls or the counters."""
    calls = counters.get("server:calls:Query", 0)
    if not calls:
        return {}
    return {phase: round(counters[f"server:query_s:{phase}"] / calls * 1e3, 3)
            for phase in ("lookup", "lease", "plan") if f"server:query_s:{phase}" in counters}


def hook_ms_per_step(counters: dict) -> dict:
    """Mean milliseconds per step that vLLM's threads spent in the connector's hooks (each side:
    its hooks' time over its steps), from a phase's counter deltas; empty without them."""
    out = {}
    for side in ("scheduler", "worker"):
        steps = counters.get(f"vllm:pegaflow_{side}_steps", 0)
        if steps:
            out[side] = round(counters.get(f"vllm:pegaflow_{side}_hook_ns", 0) / steps / 1e6, 3)
            out[f"{side}_steps"] = int(steps)
    return out


def merge(earlier: dict, report: dict) -> dict:
    """``earlier`` with this run's figures joined: each system's entries (a load, lengths) added
    or replaced, this run's command and line rate kept beside the earlier ones."""
    out = dict(earlier)
    for key in ("systems", "raw"):
        merged = {k: dict(v) for k, v in earlier.get(key, {}).items()}
        for system, entry in report[key].items():
            mine = {k: v for k, v in entry.items() if k not in ("lengths", "start_s") or v}
            merged.setdefault(system, {}).update(mine)
        out[key] = merged
    out["merged_runs"] = earlier.get("merged_runs", []) + [
        {"command": report["command"], "line_h2d_gbps": report["line_h2d_gbps"], "vllm_version": report["vllm_version"]}]
    return out


def _read_report(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"pegaflow-bench ttft: --summarize '{path}': {e}; expected a report this command wrote (--json)")


def resummarize(report: dict) -> dict:
    """An earlier report's systems summarized again from its raw records (``--summarize``): the
    figures this version adds, for runs made before it. Refuses a report without its raw
    records, its KV bytes per token or its lengths, naming what is missing."""
    raw = report.get("raw") if isinstance(report, dict) else None
    if not isinstance(raw, dict) or not isinstance(report.get("kv_bytes_per_token"), int):
        raise SystemExit("pegaflow-bench ttft: --summarize needs a report with its raw records ('raw') and "
                         "'kv_bytes_per_token', as --json writes them; this one has "
                         + (", ".join(sorted(report)) if isinstance(report, dict) else type(report).__name__))
    keys = {n for r in raw.values() if isinstance(r, dict) for n in r.get("lengths", {})}
    odd = sorted(n for n in keys if not str(n).isdigit())
    if odd:
        raise SystemExit(f"pegaflow-bench ttft: --summarize: raw length '{odd[0]}'; expected prompt lengths in "
                         "tokens such as '8192', as --json writes them")
    lengths = sorted(int(n) for n in keys)
    if not lengths:
        raise SystemExit("pegaflow-bench ttft: --summarize: the report's raw records hold no length (a --load-only run?)")
    return summarize(raw, lengths, report["kv_bytes_per_token"], report.get("line_h2d_gbps"))


def worker_spec(args, model: str, lengths: list[int], config: dict) -> dict:
    """What every system's ttft worker runs: the model, the lengths, and vLLM's modes of the run."""
    return {"model": model, "max_model_len": max(lengths, default=0) + 256, "lengths": lengths, "prompts": args.prompts,
            "seed": args.seed, "vocab": int(config.get("vocab_size", 128256)), "dtype": args.dtype,
            "block_size": args.block_size, "max_tokens": args.max_tokens,
            "async_scheduling": {"auto": None, "on": True, "off": False}[args.async_scheduling],
            "enforce_eager": args.enforce_eager == "on"}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="pegaflow-bench ttft", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="model folder (config.json; random weights); default: Llama-3.1-8B's shape")
    ap.add_argument("--lengths", default="2k,8k,16k,32k")
    ap.add_argument("--prompts", type=int, default=6, help="prompts per length (default 6)")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--pool-size", default="28gb", help="host bytes of every store (default 28gb)")
    ap.add_argument("--async-scheduling", choices=("auto", "on", "off"), default="auto",
                    help="vLLM's asynchronous scheduling for every system (auto: vLLM's default, on on GPUs); "
                         f"off lets <system>{_AT_ALLOC_NAMES} start loads at allocation (load_at_alloc stays off under it)")
    ap.add_argument("--enforce-eager", choices=("on", "off"), default="on",
                    help="vLLM's eager mode for every system (default on, as every run recorded before the "
                         "thirty-second); off: CUDA graphs and torch.compile, vLLM's own default on GPUs")
    ap.add_argument("--pool-dir", default="/dev/shm", help="where pegaflow-server keeps its pool (default /dev/shm)")
    ap.add_argument("--pegaflow-site", help="the original PegaFlow's wheel unpacked (system pegaflow)")
    ap.add_argument("--vllm-site", help="a folder put on PYTHONPATH of every system (a staged vLLM)")
    ap.add_argument("--concurrency", type=int, default=0, help="OpenAI-server load: requests in flight (0: none)")
    ap.add_argument("--load-requests", type=int, default=48)
    ap.add_argument("--load-systems", default="server,vllm_native", help="systems the load runs on (default server,vllm_native)")
    ap.add_argument("--load-length", default="8k")
    ap.add_argument("--load-only", action="store_true",
                    help="run the OpenAI-server load alone (no per-length runs), on --load-systems")
    ap.add_argument("--merge", help="a report of an earlier run (same machine) whose systems this run's figures join")
    ap.add_argument("--load-gpu-blocks", type=int, default=8192, help="vLLM's GPU blocks in the load (its own cache)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--block-size", type=int, help="vLLM's block size (default: the platform's)")
    ap.add_argument("--max-tokens", type=int, default=16,
                    help="tokens each answer generates (default 16; their mean spacing is the decode figure, "
                         "which reads steadily from 64 on the H200: docs/benchmarks, ninth run)")
    ap.add_argument("--cold-start", metavar="POOL_SIZE",
                    help="also time the first request after a cold start: a fresh pegaflow-server with a pool of "
                         "POOL_SIZE (e.g. 60gb) under --pool-dir, a fresh vLLM saving one prompt of the longest "
                         "length, another fresh vLLM asking it first")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the systems this many times in turn, each a fresh process (default 1); the report "
                         "keeps every round (<system>@<round>) and their medians (rounds)")
    ap.add_argument("--json", default="out/vllm-gpu-ttft.json")
    ap.add_argument("--summarize", metavar="REPORT",
                    help="run nothing: print the systems of an earlier report (its JSON) summarized again from its "
                         "raw records by this version (figures added since that run included)")
    args = ap.parse_args(argv)
    if args.summarize:
        print(json.dumps({"systems": resummarize(_read_report(args.summarize))}, indent=1))
        return 0
    from pegaflow.models import shapes

    lengths = [] if args.load_only else [_tokens(x) for x in args.lengths.split(",") if x]
    if not lengths and not args.load_only:
        raise SystemExit("pegaflow-bench ttft: --lengths names no length (e.g. 2k,8k); --load-only runs the load alone")
    if args.load_only and not args.concurrency:
        raise SystemExit("pegaflow-bench ttft: --load-only needs --concurrency N (requests in flight)")
    systems_wanted = [s for s in (args.load_systems if args.load_only else args.systems).split(",") if s]
    for s in systems_wanted:
        if s not in SYSTEMS + VARIANTS:
            raise SystemExit(f"pegaflow-bench ttft: system '{s}'; expected some of {','.join(SYSTEMS + VARIANTS)}")
    if any(s.endswith(AT_ALLOC) for s in systems_wanted) and args.async_scheduling != "off":
        # load_at_alloc stays off under vLLM's asynchronous scheduling: the system would be "_instep" under another name
        raise SystemExit(f"pegaflow-bench ttft: the systems <system>{_AT_ALLOC_NAMES} need --async-scheduling off (load_at_alloc is off "
                         f"under vLLM's asynchronous scheduling); got --async-scheduling {args.async_scheduling}")
    if args.rounds < 1:
        raise SystemExit(f"pegaflow-bench ttft: --rounds {args.rounds}; expected at least 1")
    if args.max_tokens < 1:
        raise SystemExit(f"pegaflow-bench ttft: --max-tokens {args.max_tokens}; expected at least 1")
    if args.cold_start:
        try:
            if _bytes(args.cold_start) <= 0:
                raise ValueError
        except ValueError:
            raise SystemExit(f"pegaflow-bench ttft: --cold-start '{args.cold_start}'; expected a pool size such as 60gb")
    config = shapes.LLAMA_31_8B
    model = str(Path(args.model).resolve()) if args.model else str(shapes.write(Path("out/llama-3.1-8b-shape").resolve(), config))
    if args.model:
        config = json.loads((Path(args.model) / "config.json").read_text())
    bpt = shapes.kv_bytes_per_token(config)
    line = line_rate_gbps()
    print(f"ttft: line {line} GB/s, {bpt} KV bytes per token", file=sys.stderr)
    spec = worker_spec(args, model, lengths, config)
    results = {}
    with tempfile.TemporaryDirectory(prefix="pegaflow-ttft-") as tmp:
        systems = Systems(args, Path(tmp), gpu=line is not None)
        rounds = 1 if args.load_only else args.rounds
        for key, system in ((round_key(s, r), s) for r in range(1, rounds + 1) for s in systems_wanted):
            print(f"ttft: system {key}", file=sys.stderr, flush=True)
            try:
                results[key] = {"lengths": {}} if args.load_only else run_worker(systems, system, spec, args.timeout, key)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                results[key] = {"error": error_text(e)}
                print(f"ttft: system {key} failed: {results[key]['error']}", file=sys.stderr)
                continue
            if args.concurrency and key in args.load_systems.split(","):
                try:
                    results[key]["load"] = load_test(systems, system, args, model, args.timeout)
                except (RuntimeError, OSError) as e:
                    results[key]["load"] = {"error": str(e)[-8000:]}  # the API server's first traceback and its end
            # what is measured so far survives a run cut short
            partial = Path(args.json).with_suffix(".partial.json")
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps({"line_h2d_gbps": line, "kv_bytes_per_token": bpt,
                                           "systems": summarize(results, lengths, bpt, line)}, indent=1))
        cold = None
        if args.cold_start:
            print(f"ttft: cold start, a {args.cold_start} pool", file=sys.stderr, flush=True)
            try:
                cold = cold_start(args, Path(tmp), spec, max(lengths, default=_tokens("16k")))
            except (RuntimeError, subprocess.TimeoutExpired, KeyError) as e:
                cold = {"error": error_text(e)}
        for f in Path(tmp).glob("*.log"):
            text = f.read_text()
            said = java_warnings(text)
            print(f"--- {f.name}\n" + "".join(f"java said: {w}\n" for w in said) + text[-1500:], file=sys.stderr)
    import torch

    from pegaflow._vllm_version import installed_vllm

    report = {
        "vllm_version": (installed_vllm() or ("", ""))[1],
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU)",
        "line_h2d_gbps": line, "kv_bytes_per_token": bpt, "model_shape": "Llama-3.1-8B (random weights)",
        "prompts_per_length": args.prompts, "pool_size": args.pool_size, "torch": torch.__version__,
        "enforce_eager": args.enforce_eager == "on",
        "systems": summarize(results, lengths, bpt, line), "raw": results, "cold_start": cold,
        "rounds": 1 if args.load_only else args.rounds,
        "command": "pegaflow-bench ttft " + " ".join(argv),
    }
    for r in report["raw"].values():
        for entry in r.get("lengths", {}).values():
            for runs in entry.values():
                if isinstance(runs, list):
                    for x in runs:
                        x["token_ids"] = x["token_ids"][:8]
    if args.rounds > 1:
        report["round_medians"] = rounds_summary(report["systems"], lengths)
    if args.merge:
        report = merge(json.loads(Path(args.merge).read_text()), report)
        if "round_medians" in report:  # over the joined systems (an earlier run's medians would be stale)
            merged_lengths = sorted({int(n) for r in report["raw"].values() for n in r.get("lengths", {})})
            report["round_medians"] = rounds_summary(report["systems"], merged_lengths)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    Path(args.json).with_suffix(".partial.json").unlink(missing_ok=True)
    print(json.dumps({"systems": report["systems"], "cold_start": cold, "round_medians": report.get("round_medians")},
                     indent=1))
    return 0 if all("error" not in r for r in results.values()) and not (cold or {}).get("error") else 1
