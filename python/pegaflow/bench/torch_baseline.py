"""PyTorch per-piece copy baseline for ``pegaflow-bench transfer``.

The same scattered Llama-shaped pieces the Java transfer bench moves, copied the way a
Python connector without a copy engine would: one ``Tensor.copy_`` per piece between a GPU
KV cache and a pinned host buffer. Views are built before timing, so the figure is the cost
of the copies, not of Python indexing.
"""

from __future__ import annotations

import statistics
import time


def per_piece_gbps(
    layers: int = 32,
    piece_bytes: int = 32768,
    cache_blocks: int = 4096,
    moved: int = 1024,
    repeat: int = 3,
) -> dict:
    import torch

    elems = piece_bytes // 2  # bf16
    dev = torch.empty((layers, 2, cache_blocks, elems), dtype=torch.bfloat16, device="cuda")
    host = torch.empty((moved, layers, 2, elems), dtype=torch.bfloat16, pin_memory=True)
    ids = torch.randperm(cache_blocks, generator=torch.Generator().manual_seed(7))[:moved].tolist()
    pairs = [(host[i, l, s], dev[l, s, b]) for i, b in enumerate(ids) for l in range(layers) for s in range(2)]

    def run(to_host: bool) -> float:
        start = time.perf_counter()
        for h, d in pairs:
            if to_host:
                h.copy_(d, non_blocking=True)
            else:
                d.copy_(h, non_blocking=True)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    total = len(pairs) * piece_bytes
    out = {}
    for name, to_host in (("save", True), ("load", False)):
        run(to_host)  # warm-up
        seconds = statistics.median(run(to_host) for _ in range(repeat))
        out[f"torch_{name}_gbps"] = total / seconds / 1e9
    out["torch_pieces"] = len(pairs)
    return out
