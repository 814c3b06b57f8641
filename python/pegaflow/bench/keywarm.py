"""The block-key warm-up against none, in fresh processes side by side (``BlockKeys.warm_up``).

``python -m pegaflow.bench.keywarm [--processes N] [--tokens T] > report.json``: N fresh
processes with the warm-up and N without, in turn. Each keys blocks by the connector's own chain
(as vLLM 0.26 without ``PYTHONHASHSEED`` makes it), starts the JVM as the connector's start does,
runs the warm-up to its end where asked (vLLM's own start takes far longer), then computes the
chains the ``pegaflow-bench ttft`` requests compute before its first warm 16K answer (ten of 512
blocks, five of 1,024) and times five more of 1,024. Prints each process's figures and the
medians over processes: the first 8K chain (a fresh process's first request), the median of the
chains before, the median 16K chain after. Needs the engine jar (``PEGAFLOW_JAR`` or the built one).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

from . import child_report, fresh_process


def child(warm: bool, tokens: int) -> dict:
    from pegaflow.connector import _compat, _keys
    from pegaflow.engine import vllm_block_hashes

    _compat.none_hash_is_reproducible = lambda algo: False  # the own chain, whatever vLLM is installed
    seed = _compat.none_hash_seed()
    vllm_block_hashes([1] * 16, 16, "sha256", seed)  # the JVM started, as the connector's start does
    _keys.WARM_UP_TOKENS = tokens
    warm_s = None
    if warm:
        t = time.perf_counter()
        _keys.BlockKeys("sha256", 16).warm_up().join()
        warm_s = round(time.perf_counter() - t, 3)
    rng = random.Random(3)

    def chain(n_blocks: int) -> float:
        tokens = [rng.randrange(128000) for _ in range(n_blocks * 16)]
        t = time.perf_counter()
        vllm_block_hashes(tokens, 16, "sha256", seed)
        return round((time.perf_counter() - t) * 1e3, 3)

    first = chain(512)
    before = [chain(512) for _ in range(9)] + [chain(1024) for _ in range(5)]
    after = [chain(1024) for _ in range(5)]
    return {"warm_up": warm, "warm_up_tokens": tokens if warm else 0, "warm_up_s": warm_s, "first_8k_chain_ms": first,
            "chains_before_ms": before, "next_16k_chains_ms": after}


def summary(rows: list[dict]) -> dict:
    def med(xs):
        return round(statistics.median(xs), 3)

    return {"processes": len(rows),
            "first_8k_chain_ms_median": med([r["first_8k_chain_ms"] for r in rows]),
            "chains_before_ms_median": med([statistics.median(r["chains_before_ms"]) for r in rows]),
            "next_16k_chain_ms_median": med([statistics.median(r["next_16k_chains_ms"]) for r in rows]),
            "warm_up_s_median": med([r["warm_up_s"] for r in rows]) if rows and rows[0]["warm_up_s"] is not None else None}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m pegaflow.bench.keywarm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=6, help="fresh processes per mode (default 6)")
    ap.add_argument("--tokens", type=int, default=None, help="token ids the warm-up's chains cover (default: the connector's)")
    ap.add_argument("--child", choices=("warm", "none"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.processes < 1:
        ap.error(f"--processes {args.processes}: expected 1 or more")
    from pegaflow.connector import _keys

    tokens = args.tokens if args.tokens is not None else _keys.WARM_UP_TOKENS
    if tokens < 1:
        ap.error(f"--tokens {tokens}: expected 1 or more")
    if args.child:
        child_report(child(args.child == "warm", tokens))
        return 0
    rows: dict[str, list] = {"none": [], "warm": []}
    for _ in range(args.processes):
        for mode in ("none", "warm"):
            rows[mode].append(fresh_process(["pegaflow.bench.keywarm", "--child", mode, "--tokens", str(tokens)],
                                            f"keywarm's {mode} process"))
    json.dump({"command": "python -m pegaflow.bench.keywarm " + " ".join(argv),
               "none": summary(rows["none"]), "warm_up": summary(rows["warm"]), "runs": rows}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
