"""Real vLLM engines in child processes, driven over a pipe (``make run``, the e2e tier).

Each :class:`EngineProc` is one process that imports vLLM once (slow: docs/vllm-versions.md,
"Bytecode") and then opens engines one after another, each a real ``vllm.LLM`` on the tiny
local model, with or without PegaKVConnector. One process holds at most one engine at a time:
vLLM keeps the worker's connector in a process-wide global, so two instances must live in two
processes, as they do in production.

Requests are token-id prompts run greedily; each answer carries the generated token ids,
their top logprobs, the time to first token (vLLM's own ``first_token_latency``) and the
prompt tokens vLLM did not compute (``num_cached_tokens``: its prefix cache plus the store).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any


@dataclass
class EngineSpec:
    """One engine: the model folder, vLLM's arguments and the connector (None: no connector)."""

    model: str
    connector: dict | None = None  # kv_connector_extra_config; None runs without the connector
    kv_role: str = "kv_both"
    engine_id: str | None = None
    block_size: int = 32
    # float32: greedy outputs must not depend on how vLLM batched a request (bf16 GEMMs round
    # differently for different batch shapes, which can flip a near-tie in a random model)
    dtype: str = "float32"
    kv_cache_bytes: int = 16 << 20
    max_model_len: int = 2048
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 2048
    in_process: bool = True  # vLLM's in-process executor; False: its multiprocessing executor
    extra: dict = field(default_factory=dict)  # more vllm.LLM keyword arguments


@dataclass
class Answer:
    token_ids: list[int]
    logprobs: list[dict[int, float]]
    ttft_s: float
    cached_tokens: int


def _open(spec: EngineSpec):
    from vllm import LLM
    from vllm.config import KVTransferConfig

    kv = None
    if spec.connector is not None:
        kv = KVTransferConfig(kv_connector="PegaKVConnector", kv_role=spec.kv_role, engine_id=spec.engine_id,
                              kv_connector_extra_config=dict(spec.connector), kv_load_failure_policy="recompute")
    args = dict(model=spec.model, tokenizer=spec.model, dtype=spec.dtype, block_size=spec.block_size,
                max_model_len=spec.max_model_len, kv_transfer_config=kv, enforce_eager=True,
                enable_prefix_caching=True, seed=0, kv_cache_memory_bytes=spec.kv_cache_bytes,
                max_num_seqs=spec.max_num_seqs, max_num_batched_tokens=spec.max_num_batched_tokens,
                disable_log_stats=False, distributed_executor_backend="uni" if spec.in_process else "mp")
    args.update(spec.extra)
    if isinstance(args.get("kv_events_config"), dict):  # a plain dict crosses the process boundary
        from vllm.config import KVEventsConfig

        args["kv_events_config"] = KVEventsConfig(**args["kv_events_config"])
    return LLM(**args)


def _close(llm) -> None:
    import gc

    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # a half-started engine: nothing more to stop
        pass
    del llm
    gc.collect()


def _generate(llm, prompts: list[list[int]], max_tokens: int, logprobs: int) -> list[Answer]:
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=logprobs or None, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    answers = []
    for o in outs:
        c = o.outputs[0]
        lps = [{int(t): float(lp.logprob) for t, lp in step.items()} for step in (c.logprobs or [])]
        ttft = float(getattr(o.metrics, "first_token_latency", 0.0) or 0.0) if o.metrics is not None else 0.0
        answers.append(Answer(list(c.token_ids), lps, ttft, int(o.num_cached_tokens or 0)))
    return answers


def _reset(llm) -> bool:
    """Empties vLLM's prefix cache. Blocks of finished requests whose saves are still running
    are freed only at a later engine step, so a one-token request steps the engine between tries."""
    from vllm import SamplingParams

    for _ in range(50):
        if llm.reset_prefix_cache():
            return True
        llm.generate([{"prompt_token_ids": [7]}], SamplingParams(max_tokens=1), use_tqdm=False)
        time.sleep(0.01)
    return False


def _metrics(llm) -> dict[str, float]:
    """vLLM's own metrics (counters and gauges, summed over label sets), by name."""
    out: dict[str, float] = {}
    for m in llm.get_metrics():
        value = getattr(m, "value", None)
        if isinstance(value, (int, float)):
            out[m.name] = out.get(m.name, 0.0) + float(value)
    return out


def _kv_groups(llm) -> dict:
    """vLLM's KV-cache groups as its scheduler holds them (in-process engines only), and
    whether its hybrid KV cache manager is on."""
    core = llm.llm_engine.engine_core.engine_core  # InprocClient -> EngineCore
    groups = core.scheduler.kv_cache_config.kv_cache_groups
    return {
        "hybrid_manager": not core.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager,
        "groups": [(type(g.kv_cache_spec).__name__, getattr(g.kv_cache_spec, "sliding_window", None), len(g.layer_names))
                   for g in groups],
    }


def _kv_layout(llm) -> dict:
    """How the worker connector of an in-process engine registered vLLM's KV cache: per layer
    region, its bytes per block and block stride (a cross-layer cache has every layer's slice
    of a block back to back: the block stride is the sum of the layers' bytes)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    worker = getattr(get_kv_transfer_group(), "_worker", None)
    if worker is None:
        return {"layers": 0}
    regions = [x.region for x in worker.layers]
    per_block = sum(r.segment_bytes * (2 if r.layout == "split_kv" else 1) for r in regions)
    return {"layers": len(regions), "layouts": sorted({r.layout for r in regions}),
            "block_strides": sorted({r.block_stride for r in regions}), "bytes_per_block": per_block,
            "cross_layer": all(r.block_stride == per_block for r in regions) and len(regions) > 1,
            "namespace": worker.namespace}


def _serve(conn, env: dict) -> None:
    os.environ.update({k: str(v) for k, v in env.items()})
    import vllm  # noqa: F401  (the slow part, started at once so several processes import side by side)

    llm = None
    while True:
        try:
            cmd, arg = conn.recv()
        except EOFError:
            break
        try:
            if cmd == "open":
                if llm is not None:
                    _close(llm)
                    llm = None
                t = time.perf_counter()
                llm = _open(arg)
                conn.send(("ok", time.perf_counter() - t))
            elif cmd == "generate":
                conn.send(("ok", _generate(llm, *arg)))
            elif cmd == "reset_prefix_cache":
                conn.send(("ok", _reset(llm)))
            elif cmd == "metrics":
                conn.send(("ok", _metrics(llm)))
            elif cmd == "kv_groups":
                conn.send(("ok", _kv_groups(llm)))
            elif cmd == "kv_layout":
                conn.send(("ok", _kv_layout(llm)))
            elif cmd == "close":
                if llm is not None:
                    _close(llm)
                    llm = None
                conn.send(("ok", None))
            elif cmd == "exit":
                if llm is not None:
                    _close(llm)
                conn.send(("ok", None))
                break
            else:
                conn.send(("error", f"unknown command {cmd!r}"))
        except BaseException as e:  # reported to the driver, which decides
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


class EngineProc:
    """A child process that opens real vLLM engines and answers requests (see the module doc)."""

    def __init__(self, name: str, env: dict | None = None):
        self.name = name
        base = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false",
                "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}
        base.update(env or {})
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, base), name=f"pegaflow-engine-{name}", daemon=False)
        self.proc.start()
        child.close()

    def send(self, cmd: str, arg: Any = None) -> None:
        """Starts a command without waiting (several processes can open engines side by side)."""
        self._conn.send((cmd, arg))

    def wait(self, cmd: str, timeout: float = 900.0):
        """The answer to the command sent last."""
        if not self._conn.poll(timeout):
            raise TimeoutError(f"engine {self.name}: no answer to {cmd} within {timeout:.0f} s")
        status, value = self._conn.recv()
        if status != "ok":
            raise RuntimeError(f"engine {self.name}: {cmd} failed: {value}")
        return value

    def _call(self, cmd: str, arg: Any = None, timeout: float = 900.0):
        self.send(cmd, arg)
        return self.wait(cmd, timeout)

    def open(self, spec: EngineSpec) -> float:
        """Opens an engine (closing the one before); returns its start seconds."""
        return self._call("open", spec)

    def generate(self, prompts: list[list[int]], max_tokens: int = 8, logprobs: int = 3) -> list[Answer]:
        return self._call("generate", (prompts, max_tokens, logprobs))

    def reset_prefix_cache(self) -> bool:
        return self._call("reset_prefix_cache")

    def metrics(self) -> dict[str, float]:
        return self._call("metrics")

    def kv_groups(self) -> dict:
        """{"hybrid_manager": bool, "groups": [(spec class, sliding window, layers)]} of the open engine."""
        return self._call("kv_groups")

    def kv_layout(self) -> dict:
        """How the open engine's worker connector registered the KV cache (in-process engines)."""
        return self._call("kv_layout")

    def close_engine(self) -> None:
        self._call("close")

    def exit(self) -> None:
        if self.proc.is_alive():
            try:
                self._call("exit", timeout=120)
            except (RuntimeError, TimeoutError, OSError, EOFError):
                pass
            self.proc.join(30)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.exit()
