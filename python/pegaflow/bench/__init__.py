"""``pegaflow-bench``'s Python side; nothing here is loaded by vLLM or by ``PegaEngine``.

- ``workload``: the engine alone under a multi-turn trace (``pegaflow-bench workload``,
  ``make run-engine``).
- ``vllm_workload``: the same kind of trace through vLLM 0.33's scheduler and
  PegaKVConnector against pegaflow-server (``pegaflow-bench vllm-workload``, ``make run-sim``).
- ``vllm_run``: the main job on real vLLM engines (``pegaflow-bench vllm-run``, ``make run``), which
  ``engine_proc`` runs in child processes (also the e2e tier's engines).
- ``sim``: the CPU vLLM engine ``vllm_workload`` and the connector tests drive (vLLM's own
  objects, a deterministic forward; ``tiny_llama/config.json`` is its model config).
- ``bridge``: what calling the in-process Java engine costs (``pegaflow-bench bridge``).
- ``torch_baseline``: the PyTorch per-piece copy baseline ``pegaflow-bench transfer`` adds.

Modules import their heavy dependencies (vLLM, torch) themselves; importing this package
imports nothing.
"""


def range_option(prog: str, option: str, text: str) -> tuple[int, int]:
    """``MIN-MAX`` (or one number) of a bench option, with ``1 <= MIN <= MAX``; else one clear line and exit."""
    try:
        parts = [int(p) for p in text.split("-")]
        lo, hi = (parts[0], parts[-1]) if len(parts) in (1, 2) else (0, -1)
    except ValueError:
        lo, hi = 0, -1
    if not 1 <= lo <= hi:
        raise SystemExit(f"pegaflow-bench {prog}: {option} '{text}' is not a range; expected MIN-MAX with 1 <= MIN <= MAX")
    return lo, hi
