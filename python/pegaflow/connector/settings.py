"""The connector's settings, from ``kv_connector_extra_config`` (keys may carry a
``pegaflow.`` prefix) and a few environment variables; unknown keys and bad values are
refused with the accepted ones listed."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..engine import DEFAULT_SSD_CAPACITY, ssd_lines
from ..errors import InvalidArgumentError

MODES = ("auto", "embedded", "server")
DEFAULT_ENDPOINT = "127.0.0.1:50055"
PRESETS = ("none", "low_ttft")
# preset "low_ttft": the set-up the GPU runs measured warm requests fastest with (the bench's
# _instepxr3 systems; docs/connector.md, "The low_ttft preset"). Its settings are defaults: a
# key or environment variable of the caller's own wins over each.
LOW_TTFT = {"load_in_step": True, "load_at_alloc": True, "compute_share": 0.03}
# ... and the copy engine's environment it sets where the process has none of its own: the load
# begun at allocation goes ahead of its step a layer at a time through the copy engine, and the
# lookup that begins it stages its pool side in a buffer of the copy engine's (device memory on a
# GPU; host memory without one, where 4 GiB beside vLLM's CPU KV cache is more than a host can
# spare and the loads are small)
LOW_TTFT_LEAD = {"PEGAFLOW_CUDA_LAYER_LEAD_MIB": "16384", "PEGAFLOW_CUDA_LAYER_LEAD_PACED": "1"}
LOW_TTFT_PRESTAGE_MIB = {True: "4096", False: "256"}
_KEYS = {
    "mode": "auto | embedded | server (default auto: server when one answers, else embedded)",
    "endpoint": f"HOST:PORT of pegaflow-server (default {DEFAULT_ENDPOINT}, env PEGAFLOW_ENDPOINT)",
    "namespace": "cache namespace override (default: derived from model, dtype, block size, layout, TP)",
    "pool_size": "embedded mode's host pool, e.g. 30gb (default 8gb, env PEGAFLOW_POOL_SIZE)",
    "copy_threads": "threads copying between the pool and the KV cache (default 2)",
    "deadline_ms": "bound on every call to the server (default 2000)",
    "health_interval_s": "server mode: how often the link checks the server (default 1.0, >= 0.01)",
    "ssd_cache_path": "directory (or list of directories) of an SSD tier below the host pool: embedded mode's, or "
    "the private server's that mode auto starts (default none, env PEGAFLOW_SSD_CACHE_PATH, comma-separated)",
    "ssd_cache_capacity": f"disk space of that SSD tier over all its paths (default {DEFAULT_SSD_CAPACITY})",
    "load_in_step": "auto | true | false: load a hit inside the step that computes the request's tail, layer by "
    "layer, each attention layer waiting for its own (true), or asynchronously, the request waiting in "
    "WAITING_FOR_REMOTE_KVS (false); default auto: in the step on vLLM's CPU runner, asynchronous on a GPU, where "
    "vLLM's model runners mishandle a failed in-step load (docs/connector.md) (env PEGAFLOW_LOAD_IN_STEP)",
    "load_at_alloc": "true | false: with load_in_step, start a hit's load when vLLM allocates its blocks "
    "(update_state_after_alloc) rather than in the step's start_load_kv, where the worker runs in the scheduler's "
    "process (TP 1); default false (env PEGAFLOW_LOAD_AT_ALLOC)",
    "begin_at_lookup": "true | false: where vLLM's worker runs in the scheduler's process and the model has one "
    "KV-cache group, the lookup's store call also begins the worker's load (one round trip to the server before a "
    "warm request's copy); false: the load asks for its plan itself (default true, env PEGAFLOW_BEGIN_AT_LOOKUP)",
    "compute_share": "with load_in_step, the share (0 to 0.5) of a hit's blocks, at its end, that vLLM computes "
    "in the step instead of loading them, while the rest loads layer by layer: each layer's compute of those tokens "
    "runs while the next layer's bytes cross PCIe, so up to about the ratio of the link's speed to the GPU's "
    "per-token compute this shortens a warm request (docs/gpu.md, \"Computing the end of a hit\"); "
    "default 0 (env PEGAFLOW_COMPUTE_SHARE)",
    "preset": "none | low_ttft: low_ttft sets load_in_step and load_at_alloc true, compute_share 0.03 and, where "
    "the process has none of its own, the copy engine's paced lead and staging (PEGAFLOW_CUDA_LAYER_LEAD_MIB=16384, "
    "PEGAFLOW_CUDA_LAYER_LEAD_PACED=1, PEGAFLOW_PRESTAGE_MIB=4096 on a GPU, 256 without): the set-up measured "
    "fastest for warm requests; a key or variable set explicitly wins (default none, env PEGAFLOW_PRESET)",
    "cross_layer_blocks": "ask vLLM for the cross-layer KV layout (BLNHC: each block one run over all layers) "
    "where the attention backend allows it (default true, env PEGAFLOW_CROSS_LAYER_BLOCKS)",
}


@dataclass(frozen=True)
class Settings:
    mode: str = "auto"
    endpoint: str = DEFAULT_ENDPOINT
    namespace: str | None = None
    pool_size: str = "8gb"
    copy_threads: int = 2
    deadline_ms: int = 2000
    health_interval_s: float = 1.0
    cross_layer_blocks: bool = True
    load_in_step: bool | None = None  # None: auto (in_step_default)
    load_at_alloc: bool = False
    begin_at_lookup: bool = True
    compute_share: float = 0.0
    ssd_cache_paths: tuple[str, ...] = ()
    ssd_cache_capacity: str = DEFAULT_SSD_CAPACITY
    preset: str = "none"

    def engine_env(self, gpu: bool, zeroing: bool) -> dict[str, str]:
        """The copy engine's environment the preset sets where the process has none of its own
        (``_vllm.apply_preset``, before the engine starts): none but for ``low_ttft``. ``gpu``:
        vLLM runs on a CUDA GPU (the lead is the CUDA engine's, and the staging buffer device
        memory); ``zeroing``: vLLM zeroes newly allocated blocks on its compute stream, which
        would wipe a lead's bytes (the connector refuses a lead there)."""
        if self.preset != "low_ttft":
            return {}
        env = dict(LOW_TTFT_LEAD) if gpu and not zeroing else {}
        env["PEGAFLOW_PRESTAGE_MIB"] = LOW_TTFT_PRESTAGE_MIB[gpu]
        return env

    def ssd_lines(self) -> bytes:
        """The SSD tier as the engine's link takes it (b"" for none)."""
        return ssd_lines(self.ssd_cache_paths, self.ssd_cache_capacity)

    def ssd_flags(self) -> list[str]:
        """The SSD tier as pegaflow-server's flags."""
        if not self.ssd_cache_paths:
            return []
        flags = [f"--ssd-cache-path={p}" for p in self.ssd_cache_paths]
        return flags + [f"--ssd-cache-capacity={self.ssd_cache_capacity}"]

    @staticmethod
    def from_extra(extra: dict | None, env: dict | None = None) -> "Settings":
        """From ``kv_connector_extra_config`` (keys may carry a ``pegaflow.`` prefix)."""
        env = os.environ if env is None else env
        raw = {}
        for key, value in (extra or {}).items():
            k = key.removeprefix("pegaflow.")
            if k not in _KEYS:
                accepted = ", ".join(f"{name} ({doc})" for name, doc in _KEYS.items())
                raise InvalidArgumentError(f"kv_connector_extra_config key '{key}' is unknown; expected one of: {accepted}")
            raw[k] = value
        mode = str(raw.get("mode", env.get("PEGAFLOW_MODE", "auto"))).lower()
        if mode not in MODES:
            raise InvalidArgumentError(f"kv_connector_extra_config mode '{mode}'; expected one of {list(MODES)}")

        def number(key, kind, default, minimum):
            value = raw.get(key, default)
            try:
                n = kind(value)
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"kv_connector_extra_config {key} '{value}'; expected a number") from None
            if n < minimum:
                raise InvalidArgumentError(f"kv_connector_extra_config {key} {n}; expected >= {minimum}")
            return n

        preset = str(raw.get("preset", env.get("PEGAFLOW_PRESET", "none"))).strip().lower()
        if preset not in PRESETS:
            raise InvalidArgumentError(f"kv_connector_extra_config preset '{preset}'; expected one of {list(PRESETS)}")
        preset_defaults = LOW_TTFT if preset == "low_ttft" else {}
        share = raw.get("compute_share", env.get("PEGAFLOW_COMPUTE_SHARE", preset_defaults.get("compute_share", 0.0)))
        try:
            compute_share = float(share)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"kv_connector_extra_config compute_share '{share}'; expected a number from 0 "
                                       "to 0.5") from None
        if not 0.0 <= compute_share <= 0.5:  # also refuses nan
            raise InvalidArgumentError(f"kv_connector_extra_config compute_share {compute_share}; expected 0 to 0.5")
        namespace = raw.get("namespace")
        if namespace is not None and (not isinstance(namespace, str) or not namespace.strip()):
            raise InvalidArgumentError(f"kv_connector_extra_config namespace {namespace!r}; expected a non-empty string")
        def boolean(key: str, env_name: str, auto: bool = False, default: bool = True) -> bool | None:
            """The flag (None: 'auto', where ``auto`` allows it; that is then its default)."""
            flag = raw.get(key, env.get(env_name, preset_defaults.get(key, "auto" if auto else default)))
            expected = "auto, true or false" if auto else "true or false"
            if isinstance(flag, str):
                word = flag.strip().lower()
                if auto and word == "auto":
                    return None
                if word not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                    raise InvalidArgumentError(f"kv_connector_extra_config {key} '{flag}'; expected {expected}")
                return word in ("1", "true", "yes", "on")
            if not isinstance(flag, bool):
                raise InvalidArgumentError(f"kv_connector_extra_config {key} {flag!r}; expected {expected}")
            return flag

        flag = boolean("cross_layer_blocks", "PEGAFLOW_CROSS_LAYER_BLOCKS")
        in_step = boolean("load_in_step", "PEGAFLOW_LOAD_IN_STEP", auto=True)
        at_alloc = boolean("load_at_alloc", "PEGAFLOW_LOAD_AT_ALLOC", default=False)
        begin = boolean("begin_at_lookup", "PEGAFLOW_BEGIN_AT_LOOKUP", default=True)
        paths = raw.get("ssd_cache_path", env.get("PEGAFLOW_SSD_CACHE_PATH", ""))
        if isinstance(paths, str):
            paths = [p.strip() for p in paths.split(",") if p.strip()]
        if not isinstance(paths, (list, tuple)) or not all(isinstance(p, str) and p and "\n" not in p for p in paths):
            raise InvalidArgumentError(f"kv_connector_extra_config ssd_cache_path {paths!r}; expected a directory or a "
                                       "list of directories")
        return Settings(
            mode=mode,
            preset=preset,
            ssd_cache_paths=tuple(paths),
            ssd_cache_capacity=str(raw.get("ssd_cache_capacity", DEFAULT_SSD_CAPACITY)),
            cross_layer_blocks=flag,
            load_in_step=in_step,
            load_at_alloc=at_alloc,
            begin_at_lookup=begin,
            compute_share=compute_share,
            endpoint=str(raw.get("endpoint", env.get("PEGAFLOW_ENDPOINT", DEFAULT_ENDPOINT))),
            namespace=namespace,
            pool_size=str(raw.get("pool_size", env.get("PEGAFLOW_POOL_SIZE", "8gb"))),
            copy_threads=number("copy_threads", int, 2, 1),
            deadline_ms=number("deadline_ms", int, 2000, 1),
            health_interval_s=number("health_interval_s", float, 1.0, 0.01),
        )
