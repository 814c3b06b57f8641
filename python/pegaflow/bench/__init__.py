"""``pegaflow-bench``'s Python side; nothing here is loaded by vLLM or by ``PegaEngine``.

- ``workload``: the engine alone under a multi-turn trace (``pegaflow-bench workload``,
  ``make run-engine``).
- ``vllm_workload``: the same kind of trace through vLLM 0.33's scheduler and
  PegaKVConnector against pegaflow-server (``pegaflow-bench vllm-workload``, ``make run``).
- ``sim``: the CPU vLLM engine ``vllm_workload`` and the connector tests drive (vLLM's own
  objects, a deterministic forward; ``tiny_llama/config.json`` is its model config).
- ``bridge``: what calling the in-process Java engine costs (``pegaflow-bench bridge``).
- ``torch_baseline``: the PyTorch per-piece copy baseline ``pegaflow-bench transfer`` adds.

Modules import their heavy dependencies (vLLM, torch) themselves; importing this package
imports nothing.
"""
