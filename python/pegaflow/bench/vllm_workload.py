"""The main job (``make run``): multi-turn conversations through PegaKVConnector and vLLM's
real scheduler, against pegaflow-server.

Several "vLLM instances" (``sim.SimEngine``: vLLM 0.33's own Scheduler, Request, block
hasher, KV allocation and output aggregation on CPU, with a deterministic forward) share
one pegaflow-server. Conversations share system prompts; each turn's prompt is the
conversation so far plus a new user turn, and turns of one conversation move between
instances, so a hit on one instance often comes from another's saves. GPU caches are small,
so vLLM's own prefix cache forgets and the store has to serve. Every block vLLM does not
compute (its own hits and loaded ones) is checked byte for byte against what computing
writes. A perfect cache replayed over the same trace gives ``ideal_hit_rate``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from pegaflow._server import start_server
from pegaflow.bench import range_option


def _range(option: str, text: str) -> tuple[int, int]:
    return range_option("vllm-workload", option, text)


def run(args: argparse.Namespace) -> dict:
    from .sim import SimEngine  # imports vLLM

    prefix, turn, reply = (_range(o, t) for o, t in (("--prefix-tokens", args.prefix_tokens),
                                                      ("--turn-tokens", args.turn_tokens),
                                                      ("--reply-tokens", args.reply_tokens)))
    for name in ("instances", "conversations", "turns", "system_prompts", "gpu_blocks"):
        if getattr(args, name) < 1:
            raise SystemExit(f"pegaflow-bench vllm-workload: --{name.replace('_', '-')} {getattr(args, name)}; "
                             "expected >= 1")
    rnd = random.Random(args.seed)

    def tokens(n_range):
        return [rnd.randrange(3, 1000) for _ in range(rnd.randint(*n_range))]

    server = None
    endpoint = args.endpoint
    tmp = tempfile.TemporaryDirectory(prefix="pegaflow-run-")
    if endpoint is None:
        server = start_server(Path(tmp.name) / "pool", pool_size=args.pool)
        endpoint = server.endpoint
    engines = []
    try:
        t_start = time.perf_counter()
        engines = [SimEngine(f"vllm-{i}", {"mode": "server", "endpoint": endpoint}, num_blocks=args.gpu_blocks,
                             block_size=args.block_tokens, verify=True, max_num_seqs=args.concurrency)
                   for i in range(args.instances)]
        setup_s = time.perf_counter() - t_start
        bs = args.block_tokens
        systems = [tokens(prefix) for _ in range(args.system_prompts)]
        convs = [list(systems[rnd.randrange(len(systems))]) for _ in range(args.conversations)]
        seen: set[bytes] = set()  # every full block computed anywhere so far: the perfect cache
        queryable = ideal = requests = prompt_tokens = 0
        wall0 = time.perf_counter()
        for t in range(args.turns):
            placed = []
            for c, conv in enumerate(convs):
                conv.extend(tokens(turn))
                engine = engines[(c + t) % len(engines)]
                rid = f"c{c}-t{t}"
                req = engine.add(rid, list(conv), max_tokens=rnd.randint(*reply))
                q = (len(conv) - 1) // bs
                hit = 0
                while hit < q and req.block_hashes[hit] in seen:
                    hit += 1
                seen.update(req.block_hashes)  # its prompt's blocks, for the requests after it
                queryable += q * bs
                ideal += hit * bs
                prompt_tokens += len(conv)
                requests += 1
                placed.append((conv, engine, rid, req))
            # all instances step side by side until this round is done
            while any(e.scheduler.requests or e.scheduler.has_unfinished_requests() for e in engines):
                progressed = False
                for e in engines:
                    if e.scheduler.has_unfinished_requests() or e.scheduler.requests:
                        before = e.stats.scheduled_tokens
                        e.step()
                        progressed |= e.stats.scheduled_tokens != before
                if not progressed:
                    time.sleep(0.0005)  # only transfers in flight
            for conv, engine, rid, req in placed:
                seen.update(req.block_hashes)
                conv.extend(engine.outputs[rid])
        wall = time.perf_counter() - wall0
        stats = engines[0].ranks[0].connector._link.stats()  # the server's counters
        for e in engines:
            e.assert_drained()
    finally:
        for e in engines:
            e.close()
        from pegaflow.connector import _runtime

        _runtime.close_all()
        if server is not None:
            server.stop()
        tmp.cleanup()

    lookups = sorted(ns for e in engines for ns in e.stats.lookup_ns)

    def pct(p: float) -> float:
        return lookups[min(len(lookups) - 1, max(0, int(p * len(lookups) + 0.999999) - 1))] / 1000 if lookups else 0.0

    def rate(a: int, b: int) -> float:
        return a / b if b else 0.0

    external = sum(e.stats.external_tokens for e in engines)
    local = sum(e.stats.local_hit_tokens for e in engines)
    computed = sum(e.stats.scheduled_tokens for e in engines)
    return {
        "mode": "server",
        "front": "vllm-0.33 scheduler + PegaKVConnector",
        "transfer": "host",
        "instances": args.instances,
        "requests": requests,
        "prompt_tokens": prompt_tokens,
        "queryable_tokens": queryable,
        "hit_rate": rate(external + local, queryable),
        "store_hit_rate": rate(external, queryable),
        "local_prefix_cache_hit_rate": rate(local, queryable),
        "ideal_hit_rate": rate(ideal, queryable),
        "tokens_loaded_from_store": external,
        "tokens_from_local_prefix_cache": local,
        "tokens_computed": computed,
        "blocks_saved": stats["pegaflow_save_blocks_total"],
        "blocks_loaded": stats["pegaflow_load_blocks_total"],
        "save_bytes": stats["pegaflow_save_bytes_total"],
        "load_bytes": stats["pegaflow_load_bytes_total"],
        "save_gbps": rate(stats["pegaflow_save_bytes_total"], stats["pegaflow_save_transfer_nanoseconds_total"]),
        "load_gbps": rate(stats["pegaflow_load_bytes_total"], stats["pegaflow_load_transfer_nanoseconds_total"]),
        "evictions": stats["pegaflow_cache_block_evictions_total"],
        "save_failures": stats["pegaflow_save_failures_total"],
        "invalid_blocks": sum(e.stats.invalid_blocks for e in engines),
        "preemptions": sum(e.stats.preemptions for e in engines),
        "lookup_p50_us": pct(0.50),
        "lookup_p99_us": pct(0.99),
        "lookups": len(lookups),
        "verified_blocks": sum(e.stats.verified_blocks for e in engines),
        "verify_failures": sum(e.stats.verify_failures for e in engines),
        "pool_bytes": stats["pegaflow_pool_capacity_bytes"],
        "engine_steps": sum(e.stats.steps for e in engines),
        "setup_seconds": setup_s,
        "wall_seconds": wall,
        "workload": {
            "conversations": args.conversations, "turns": args.turns, "system_prompts": args.system_prompts,
            "prefix_tokens": args.prefix_tokens, "turn_tokens": args.turn_tokens, "reply_tokens": args.reply_tokens,
            "gpu_blocks_per_instance": args.gpu_blocks, "block_tokens": args.block_tokens, "seed": args.seed,
            "geometry": "tiny Llama config: 2 layers x 2 kv heads x 16 head dim, fp16, LBNHC",
        },
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pegaflow-bench vllm-workload", description=__doc__.split("\n\n")[0])
    p.add_argument("--instances", type=int, default=2, help="vLLM instances sharing the server (default 2)")
    p.add_argument("--conversations", type=int, default=24)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-prompts", type=int, default=4)
    p.add_argument("--prefix-tokens", default="160-320", help="system prompt length range (tokens)")
    p.add_argument("--turn-tokens", default="24-96", help="user turn length range")
    p.add_argument("--reply-tokens", default="4-16", help="reply length range")
    p.add_argument("--gpu-blocks", type=int, default=160, help="KV blocks per instance (small: vLLM forgets)")
    p.add_argument("--block-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=16, help="vLLM max_num_seqs per instance")
    p.add_argument("--pool", default="64mb", help="pool of the server started for the run")
    p.add_argument("--endpoint", default=None, help="use a running pegaflow-server instead of starting one")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", default=None, help="write the report here")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    report = run(args)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(f"PegaFlow-JVM through vLLM {report['front']}: {report['requests']} requests on {report['instances']} "
          f"instances sharing one pegaflow-server (pool {report['pool_bytes'] >> 20} MiB)")
    print(f"  hit rate {100 * report['hit_rate']:.1f}% of queryable tokens (store {100 * report['store_hit_rate']:.1f}%, "
          f"vLLM's own cache {100 * report['local_prefix_cache_hit_rate']:.1f}%; ideal "
          f"{100 * report['ideal_hit_rate']:.1f}%); computed {report['tokens_computed']} of "
          f"{report['prompt_tokens']} prompt tokens")
    print(f"  saved {report['blocks_saved']} blocks at {report['save_gbps']:.2f} GB/s, loaded {report['blocks_loaded']} "
          f"at {report['load_gbps']:.2f} GB/s; {report['evictions']} evictions, {report['invalid_blocks']} failed "
          f"block loads")
    print(f"  lookup p50 {report['lookup_p50_us']:.0f} us, p99 {report['lookup_p99_us']:.0f} us over "
          f"{report['lookups']} lookups; verified {report['verified_blocks']} blocks, {report['verify_failures']} "
          f"mismatches; {report['wall_seconds']:.1f} s")
    return 0 if report["verify_failures"] == 0 and report["requests"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
