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

- ``keywarm``, ``lookupwarm``: the connector's start-up warm-ups against none, in fresh processes
  side by side (``python -m pegaflow.bench.keywarm``, ``python -m pegaflow.bench.lookupwarm``).

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


CHILD_MARK = "PEGAFLOW-BENCH-CHILD "


def child_report(figures: dict) -> None:
    """A child process's figures, one marked line on stdout (``fresh_process`` finds it among vLLM's logs)."""
    import json

    print(CHILD_MARK + json.dumps(figures), flush=True)


def fresh_process(argv: list[str], what: str) -> dict:
    """Runs ``python -m <argv>`` in a fresh process and returns the figures it reported with
    ``child_report``; a failed child ends the benchmark with its output's tail, naming ``what``."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith(CHILD_MARK)]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{what} failed (exit {out.returncode}):\n{(out.stdout + out.stderr)[-4000:]}")
    return json.loads(lines[-1][len(CHILD_MARK):])
