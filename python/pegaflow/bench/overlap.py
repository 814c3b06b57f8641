"""``pegaflow-bench overlap``: does an in-step load overlap the forward beside it? No vLLM.

The worker connector's own objects (``WorkerCore`` and the scheduler brain, embedded store) on
KV tensors of vLLM's FlashAttention shape (one ``[2, blocks, block_size, heads, head_dim]``
tensor per layer). A prefix of ``--tokens`` tokens is saved once; then, per round, three
timings on the same GPU stream:

- ``compute``: a stand-in forward alone, layer by layer (``--kernels-per-layer`` small kernels
  per layer, launch-bound like vLLM's eager forward of a short tail);
- ``load``: the in-step load alone (start, every layer waited for on the stream, synchronize);
- ``overlap``: the load started, then the forward, each layer waiting for its own bytes
  (``wait_layer``, as vLLM's ``wait_for_layer_load`` does) before its kernels.

``launch_ms`` (the thread's time to issue the overlapped forward) and ``in_waits_ms`` (its time
inside the layer waits) say whether the waits hold the thread. The stand-in's kernels do little
GPU work, so ``overlap`` beside ``load`` does not show GPU overlap; on CUDA the overlapped
forward records an event after each layer's kernels, and ``layer_done_ms`` (first, middle,
last layer, from the load's start) shows when each layer could run: a layer whose bytes came
early finishes early, one that waited for the whole load finishes with the last. Every round
checks the loaded bytes. Prints JSON.

    pegaflow-bench overlap --tokens 16384 --json out/overlap.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="pegaflow-bench overlap", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=16384, help="prefix tokens loaded (default 16384)")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=8, help="KV heads (default 8, Llama-3.1-8B)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--kernels-per-layer", type=int, default=40, help="the stand-in forward's kernels per layer")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--pool-size", default="8gb")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--forward-delay-ms", type=float, default=0.0,
                    help="the overlapped forward starts this long after the load (its copies queued meanwhile)")
    ap.add_argument("--side-stream", action="store_true", help="run the forward on a stream of its own (not the default)")
    ap.add_argument("--json", default="out/overlap.json")
    args = ap.parse_args(argv)
    if args.forward_delay_ms < 0:
        raise SystemExit(f"pegaflow-bench overlap: --forward-delay-ms {args.forward_delay_ms}; expected 0 or more")
    if args.tokens % args.block_size or args.tokens <= 0:
        raise SystemExit(f"pegaflow-bench overlap: --tokens {args.tokens}; expected a positive multiple of "
                         f"--block-size {args.block_size}")
    import torch

    from pegaflow.connector import _runtime
    from pegaflow.connector._brain import Group, SchedulerBrain
    from pegaflow.connector.worker import WorkerCore

    cuda = args.device.startswith("cuda")
    dev = torch.device(args.device)
    blocks = args.tokens // args.block_size
    nb = 2 * blocks + 2  # saved blocks, then other blocks the loads land in
    shape = (2, nb, args.block_size, args.heads, args.head_dim)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(args.layers)]
    kv = {n: torch.zeros(shape, dtype=torch.bfloat16, device=dev) for n in names}
    src, dst = list(range(1, blocks + 1)), list(range(blocks + 1, 2 * blocks + 1))
    gen = torch.Generator(device=dev).manual_seed(1)
    for t in kv.values():
        t[:, src].normal_(generator=gen)
    want = [float(kv[n][:, src].float().sum()) for n in names]
    hashes = [i.to_bytes(8, "little") + b"overlap-bench" for i in range(blocks)]
    x = torch.ones(1 << 16, device=dev)

    waited = [0.0]
    marks: list = []  # CUDA events: the start, then one after each layer of the overlapped forward

    def forward(wait=None) -> float:
        t = time.perf_counter()
        for i, n in enumerate(names):
            if wait is not None:
                w = time.perf_counter()
                wait(n)
                waited[0] += time.perf_counter() - w
            for _ in range(args.kernels_per_layer):
                x.mul_(1.0000001)
            x.add_(kv[n][0, dst[0], 0, 0, 0].float())  # reads the layer's loaded bytes
            if wait is not None and marks:
                marks.append(torch.cuda.Event(enable_timing=True))
                marks[-1].record()
        return (time.perf_counter() - t) * 1e3

    def sync():
        if cuda:
            torch.cuda.synchronize()

    settings = _runtime.Settings(mode="embedded", pool_size=args.pool_size)
    core = WorkerCore(settings, "overlap-bench")
    core.register(kv, nb, mla=False, facts={"model": "overlap-bench", "block_size": args.block_size})
    sched = SchedulerBrain(core.link.handle, [Group("overlap-bench")], args.block_size, True, in_step=True)
    rows = []
    try:
        assert sched.lookup("save", hashes, args.tokens + 1, 0) == 0
        sched.after_alloc("save", [src + [nb - 1]], 0)
        sched.schedule("save", hashes, 0, [src + [nb - 1]], False, 0, args.tokens + 1)
        sync()
        core.submit_saves(sched.build_plan())
        assert sched.request_finished("save")
        core.wait_reported("S", "save", 120)
        sched.finished(["save"], [])

        def start(req: str) -> bytes:
            for t in kv.values():
                t[:, dst].zero_()
            sync()
            hit = sched.lookup(req, hashes, args.tokens + 1, 0)
            assert hit == args.tokens, f"hit {hit} of {args.tokens} tokens"
            sched.after_alloc(req, [dst + [nb - 1]], hit)
            plan = sched.build_plan()
            sync()
            return plan

        def end(req: str) -> None:
            sync()
            core.get_finished([req])
            sched.request_finished(req)
            sched.finished([], [req])
            errors = core.load_errors()
            got = [float(kv[n][:, dst].float().sum()) for n in names]
            assert not errors and got == want, f"{req}: loaded bytes differ (load errors {sorted(errors)[:4]})"

        if cuda and args.side_stream:
            side = torch.cuda.Stream()
            torch.cuda.set_stream(side)
        stream_handle = core._stream_of() if core._stream_of else 0
        for r in range(args.rounds + 1):  # round 0 warms up
            sync()
            t = time.perf_counter()
            compute_launch = forward()
            sync()
            compute = (time.perf_counter() - t) * 1e3

            plan = start(f"l{r}")
            t = time.perf_counter()
            core.start_loads(plan)
            assert core.step_loads == 1, "the load did not run in the step"
            for n in names:
                core.wait_layer(n)
            sync()
            load = (time.perf_counter() - t) * 1e3
            end(f"l{r}")

            plan = start(f"o{r}")
            marks.clear()
            if cuda:
                marks.append(torch.cuda.Event(enable_timing=True))
                marks[0].record()
            t = time.perf_counter()
            core.start_loads(plan)
            waited[0] = 0.0
            if args.forward_delay_ms:
                time.sleep(args.forward_delay_ms / 1e3)
            launch = forward(core.wait_layer)
            sync()
            overlap = (time.perf_counter() - t) * 1e3
            end(f"o{r}")
            if r:
                row = {"compute_ms": compute, "compute_launch_ms": compute_launch, "load_ms": load,
                       "overlap_ms": overlap, "launch_ms": launch, "in_waits_ms": waited[0] * 1e3}
                if len(marks) == len(names) + 1:
                    for label, i in (("first", 1), ("middle", len(names) // 2), ("last", len(names))):
                        row[f"layer_done_{label}_ms"] = marks[0].elapsed_time(marks[i])
                rows.append(row)
    finally:
        sched.close()
        core.close()
        _runtime.close_all()
    med = {k: round(statistics.median(row[k] for row in rows), 2) for k in rows[0]}
    nbytes = blocks * args.layers * 2 * args.block_size * args.heads * args.head_dim * 2
    med["load_gbps"] = round(nbytes / (med["load_ms"] / 1e3) / 1e9, 2)
    report = {"command": "pegaflow-bench overlap " + " ".join(argv), "device": args.device, "tokens": args.tokens,
              "layers": args.layers, "bytes": nbytes, "kernels_per_layer": args.kernels_per_layer,
              "stream_handle": stream_handle,
              "env": {k: v for k, v in os.environ.items() if k.startswith("PEGAFLOW_CUDA_")},
              "median": med, "rounds": [{k: round(v, 2) for k, v in row.items()} for row in rows]}
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(dict(report["median"], stream_handle=stream_handle)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
