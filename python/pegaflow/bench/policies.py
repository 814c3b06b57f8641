"""``pegaflow-bench policies``: the pool's admission and eviction policies side by side on the
engine workload trace (``pegaflow-bench workload``, the trace of ``make run-engine``), each
pool size with every policy in one run and the same seed, so every row sees the same requests:
hit rate against the ideal (an unbounded cache), bytes written to the pool, evictions.

Why these numbers: admission trades hits for writes (a block asked for once is never written,
so a prefix that comes back loses its first hit), frequency-aware eviction trades recency for
popularity (shared system prompts outlive one-off histories). Which wins depends on the trace
and the pool: the JSON says for this trace and these pools (docs/engine.md, "Policies").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pegaflow.bench import workload
from pegaflow.errors import PegaflowError

POLICIES = [("all", "lru"), ("all", "lfu"), ("seen:2", "lru"), ("seen:2", "lfu")]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="pegaflow-bench policies", description=__doc__.split("\n\n")[0])
    p.add_argument("--pools", default="2gb,4gb", help="pool sizes, comma-separated (default 2gb,4gb)")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--json", type=Path, default=Path("out/policies.json"))
    args, rest = p.parse_known_args(argv)
    rows = []
    try:
        for pool in [x.strip() for x in args.pools.split(",") if x.strip()]:
            for admission, eviction in POLICIES:
                run = workload.parser().parse_args(["--pool", pool, "--layers", str(args.layers), "--admission", admission,
                                                    "--eviction", eviction, "--verify", "sample", *rest])
                r = workload.run(run)
                if r["verify_failures"]:
                    print(f"pegaflow-bench policies: {r['verify_failures']} loaded blocks held wrong bytes "
                          f"({pool}, {admission}, {eviction})", file=sys.stderr)
                    return 1
                rows.append({k: r[k] for k in ("pool_bytes", "admission", "eviction", "hit_rate", "ideal_hit_rate",
                                               "hit_blocks", "ideal_hit_blocks", "queryable_blocks", "save_bytes",
                                               "blocks_saved", "save_not_admitted_blocks", "evictions",
                                               "verified_blocks", "wall_seconds")})
                print(f"pool {pool:>6} admission {admission:<7} eviction {eviction}: hit rate {100 * r['hit_rate']:.1f}% "
                      f"(ideal {100 * r['ideal_hit_rate']:.1f}%), wrote {r['save_bytes'] / 2**30:.1f} GiB, "
                      f"{r['evictions']} evictions", flush=True)
    except PegaflowError as e:
        print(f"pegaflow-bench policies: {e}", file=sys.stderr)
        return 2
    report = {"trace": r["workload"], "block_bytes": r["block_bytes"], "runs": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"report: {args.json}")
    return 0
