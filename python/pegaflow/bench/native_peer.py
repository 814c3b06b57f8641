"""The second process of the native embedding run (docs/embedding.md): the vLLM connector's
worker path (``WorkerCore`` running the scheduler brain's plans, as in vLLM's call order) in
server mode, with GPU tensors laid out as vLLM 0.33 allocates them, loads the blocks that
``bridge/cuda/native_kv.cu`` saved, found by the same vLLM block hashes in the shared
namespace, and checks every element against the native program's pattern; then it saves a
fresh prompt of the same size through the same path, so both paths' figures come from one run.

    python -m pegaflow.bench.native_peer --endpoint HOST:PORT [--blocks 2048] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

L, H, D, BS = 32, 8, 128, 16
SLOT_ELEMS = BS * H * 2 * D
NAMESPACE = "native-share/llama-8b-geometry"


def prompt(n: int, rep: int) -> list[int]:
    """native_kv.cu's prompt_hashes tokens: n full blocks and one more token."""
    return [3 + (i * 7919 + rep * 104729) % 32000 for i in range(n * BS + 1)]


def expected(torch, logical, layer: int, device):
    """native_kv.cu's pattern for blocks ``logical`` (int64 tensor) of one layer: [n, SLOT_ELEMS] uint16 values."""
    e = torch.arange(SLOT_ELEMS, dtype=torch.int64, device=device)
    seg = ((e % (2 * D)) >= D).to(torch.int64)
    return (logical[:, None] * 40503 + layer * 2531 + seg[None, :] * 977 + e[None, :] * 3 + 1) & 0xFFFF


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True)
    p.add_argument("--blocks", type=int, default=2048)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json")
    a = p.parse_args()

    import torch

    from pegaflow.connector import _runtime
    from pegaflow.connector._brain import Group, SchedulerBrain
    from pegaflow.connector.worker import WorkerCore
    from pegaflow.engine import vllm_block_hashes

    n, device = a.blocks, "cuda:0"
    nb = n + 2
    page = BS * H * 2 * D * 2
    # vLLM 0.33's allocation: one int8 buffer, layer l's view [NB, H, BS, 2D] over its own
    # [l*NB*page, (l+1)*NB*page), physical order B, N, H, C (test_gpu_e2e.vllm_layout_views)
    buf = torch.zeros(L * nb * page, dtype=torch.int8, device=device)
    views, names = {}, []
    for layer in range(L):
        raw = buf[layer * nb * page:(layer + 1) * nb * page].view(torch.bfloat16)
        name = f"model.layers.{layer}.self_attn.attn"
        views[name] = raw.view(nb, BS, H, 2 * D).permute(0, 2, 1, 3)
        names.append(name)
    t0 = time.perf_counter()
    settings = _runtime.Settings(mode="server", endpoint=a.endpoint, namespace=NAMESPACE, deadline_ms=30000)
    core = WorkerCore(settings, "python-peer")
    namespace = core.register(views, nb, mla=False, facts={"model": "native-share"})
    attach_s = time.perf_counter() - t0
    sched = SchedulerBrain(core.link.handle, [Group("python-peer")], BS, True)
    result: dict = {"namespace": namespace, "blocks": n, "block_bytes": page * L, "attach_s": round(attach_s, 2)}
    try:
        tokens = prompt(n, 0)
        hashes = vllm_block_hashes(tokens, BS, "xxhash_cbor", "0")
        dst = list(range(1, n + 1))
        load_gbps = []
        for r in range(a.reps):
            req = f"load-{r}"
            t0 = time.perf_counter()
            hit = sched.lookup(req, hashes, len(tokens), 0)
            assert hit == n * BS, f"the connector found {hit} tokens of {n * BS} saved by the native engine"
            sched.after_alloc(req, [dst + [n + 1]], hit)
            core.start_loads(sched.build_plan())
            core.wait_reported("R", req, timeout_s=120)
            secs = time.perf_counter() - t0
            assert core.load_errors() == set()
            sched.request_finished(req)
            sched.finished([], [req])
            load_gbps.append(n * page * L / secs / 1e9)
        torch.cuda.synchronize()
        logical = torch.arange(n, dtype=torch.int64, device=device)
        bad = 0
        for layer, name in enumerate(names):
            got = buf[layer * nb * page:(layer + 1) * nb * page].view(torch.int16).view(nb, SLOT_ELEMS)[1:n + 1]
            want = expected(torch, logical, layer, device)
            bad += int(((got.to(torch.int64) & 0xFFFF) != want).sum())
        untouched = int((buf.view(L, nb, page)[:, [0, n + 1]] != 0).sum())  # block 0 and the partial block
        assert bad == 0, f"{bad} elements differ from the native engine's pattern"
        assert untouched == 0, "blocks nobody loaded stay zero"
        print(f"connector worker path: loaded {n} blocks the native engine saved (same vLLM hashes, namespace "
              f"{namespace}): every element equal, untouched blocks zero", flush=True)

        save_gbps = []
        for r in range(a.reps):
            req = f"save-{r}"
            fresh = prompt(n, 1000 + r)
            fh = vllm_block_hashes(fresh, BS, "xxhash_cbor", "0")
            assert sched.lookup(req, fh, len(fresh), 0) == 0
            sched.after_alloc(req, [dst + [n + 1]], 0)
            sched.schedule(req, fh, 0, [dst + [n + 1]], True, 0, len(fresh))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            core.submit_saves(sched.build_plan())
            assert sched.request_finished(req)
            core.wait_reported("S", req, timeout_s=120)
            secs = time.perf_counter() - t0
            sched.finished([req], [])
            save_gbps.append(n * page * L / secs / 1e9)
        med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
        result.update(load_gbps=round(med(load_gbps), 2), save_gbps=round(med(save_gbps), 2),
                      load_all=[round(x, 2) for x in load_gbps], save_all=[round(x, 2) for x in save_gbps],
                      bits_equal=True, untouched_zero=True)
        print(f"connector worker path: save {result['save_gbps']} GB/s, load {result['load_gbps']} GB/s "
              f"(median of {a.reps}; load = lookup + plan + copy)", flush=True)
    finally:
        sched.close()
        core.close()
        _runtime.close_all()
    print(json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
