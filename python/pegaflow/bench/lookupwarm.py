"""The connector's warm-ups against none, through vLLM's lookup hook in fresh processes side by side.

``python -m pegaflow.bench.lookupwarm [--processes N] [--tokens T] [--mode embedded|server] > report.json``:
N fresh processes of each arm in turn: ``none`` (``PEGAFLOW_WARM_UP=0``), ``keys`` (the block-key
warm-up alone, ``BlockKeys.warm_up``) and ``all`` (the default: the keys' and the lookup path's,
``LookupWarmUp`` in the JVM); ``--arms`` picks others, among them ``nomemo`` (``all`` with every
lookup hashing its tokens: ``BlockKeys``' memo of this process's keys off). Each process is a vLLM engine on CPU (``pegaflow.bench.sim``: vLLM's
own scheduler, requests and block hasher; the connector keyed by its own chain, as vLLM 0.26
without ``PYTHONHASHSEED`` makes it) whose store is embedded or, with ``--mode server``, a fresh
``pegaflow-server`` of its own. It saves ``--prompts`` prompts of T tokens (each a miss first: the
cold lookups), then answers ``--lookups`` new requests over them through the connector's
``get_num_new_matched_tokens`` (the warm lookups the ``pegaflow-bench ttft`` requests make, a
process's first few), each ended by ``request_finished``. Nothing waits for the warm-ups: the
first prompt arrives as soon as the engine is built, as a benchmark's first request can, and the
warm lookups come after the saves (several seconds here), as in ``pegaflow-bench ttft``. Prints each
process's figures (the hook's time, the Java scheduler side's ``lookup_ns``, the block keys' time,
per lookup) and per arm the medians over processes of each process's median. Needs the engine jar
(``PEGAFLOW_JAR`` or the built one).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from . import child_report, fresh_process

ARMS = ("none", "keys", "all", "nomemo")
DEFAULT_ARMS = ("none", "keys", "all")
POOL = "256mb"  # the tiny model's blocks are 4 KiB: room for the prompts of any --tokens the model takes


def child(arm: str, tokens: int, prompts: int, lookups: int, endpoint: str | None) -> dict:
    os.environ["PEGAFLOW_WARM_UP"] = "0" if arm == "none" else "1"
    os.environ.pop("PEGAFLOW_KEY_WARM_UP", None)  # its former name, which would turn both off
    os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")  # the tiny model's config says 8K
    from pegaflow.connector import _compat, _keys

    _compat.none_hash_is_reproducible = lambda algo: False  # the own chain, whatever vLLM is installed
    _keys.LOOKUP_WARM_UP = arm in ("all", "nomemo")
    if arm == "nomemo":
        _keys.MEMO_BLOCKS = 0  # every lookup hashes its tokens, as before the keys' memo
    from vllm import SamplingParams
    from vllm.v1.request import Request

    from pegaflow.bench.sim import SimEngine

    keys_ns: list[int] = []
    of = _keys.BlockKeys.of

    def timed_of(self, request):
        t = time.perf_counter_ns()
        try:
            return of(self, request)
        finally:
            keys_ns.append(time.perf_counter_ns() - t)

    _keys.BlockKeys.of = timed_of
    extra = {"mode": "server", "endpoint": endpoint} if endpoint else {"mode": "embedded", "pool_size": POOL}
    block = 16
    e = SimEngine("lookupwarm", extra, num_blocks=tokens // block + 64, max_model_len=tokens + 64,
                  max_num_batched_tokens=8192)
    try:
        rng = random.Random(1)
        texts = [[rng.randrange(1, 30000) for _ in range(tokens)] for _ in range(prompts)]
        for i, p in enumerate(texts):
            e.add(f"save-{i}", p + [7], max_tokens=1)
            e.run()
        cold = [round(ns / 1e6, 3) for ns in e.stats.lookup_ns]
        e.scheduler.reset_prefix_cache()
        conn = e.scheduler.connector
        brain = conn._scheduler.brain
        brain.stats()  # counted from here
        hook, java, keys = [], [], []
        for k in range(lookups):
            r = Request(f"warm-{k}", texts[k % prompts] + [9], SamplingParams(max_tokens=1), None, block_hasher=e._hasher)
            del keys_ns[:]
            t = time.perf_counter_ns()
            n, _ = conn.get_num_new_matched_tokens(r, 0)
            hook.append(round((time.perf_counter_ns() - t) / 1e6, 3))
            java.append(round(brain.stats()["lookup_ns"] / 1e6, 3))
            keys.append(round(sum(keys_ns) / 1e6, 3))
            conn.request_finished(r, [])
            if n != tokens:
                raise RuntimeError(f"warm lookup {k} answered {n} tokens; expected the stored {tokens}")
    finally:
        e.close()
    return {"arm": arm, "cold_hook_ms": cold, "warm_hook_ms": hook, "warm_java_lookup_ms": java, "warm_keys_ms": keys}


def summary(rows: list[dict]) -> dict:
    def med(name: str) -> float:
        return round(statistics.median(statistics.median(r[name]) for r in rows), 3)

    return {"processes": len(rows), "warm_hook_ms_median": med("warm_hook_ms"),
            "warm_java_lookup_ms_median": med("warm_java_lookup_ms"), "warm_keys_ms_median": med("warm_keys_ms"),
            "first_warm_hook_ms_median": round(statistics.median(r["warm_hook_ms"][0] for r in rows), 3),
            "cold_hook_ms_median": med("cold_hook_ms")}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m pegaflow.bench.lookupwarm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=3, help="fresh processes per arm (default 3)")
    ap.add_argument("--tokens", type=int, default=16384, help="tokens of each prompt, a multiple of 16 (default 16384)")
    ap.add_argument("--prompts", type=int, default=2, help="prompts saved per process (default 2)")
    ap.add_argument("--lookups", type=int, default=15, help="warm lookups timed per process (default 15)")
    ap.add_argument("--mode", choices=("embedded", "server"), default="embedded",
                    help="the store: embedded, or a fresh pegaflow-server per process")
    ap.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                    help=f"arms, in turn in each round (default {','.join(DEFAULT_ARMS)}; nomemo: all, every lookup "
                         "hashing its tokens, without the keys' memo)")
    ap.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for name in ("processes", "prompts", "lookups"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} {getattr(args, name)}: expected 1 or more")
    if args.tokens < 16 or args.tokens % 16:
        ap.error(f"--tokens {args.tokens}: expected a positive multiple of 16 (the block size)")
    if args.child:
        child_report(child(args.child, args.tokens, args.prompts, args.lookups, args.endpoint))
        return 0
    arms = [a for a in args.arms.split(",") if a]
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms:
        ap.error(f"--arms {args.arms}: expected some of {','.join(ARMS)}")
    rows: dict[str, list] = {arm: [] for arm in arms}
    for _ in range(args.processes):
        for arm in arms:
            argv_child = ["pegaflow.bench.lookupwarm", "--child", arm, "--tokens", str(args.tokens),
                          "--prompts", str(args.prompts), "--lookups", str(args.lookups)]
            if args.mode == "embedded":
                rows[arm].append(fresh_process(argv_child, f"lookupwarm's {arm} process"))
                continue
            from pegaflow._server import start_server

            with tempfile.TemporaryDirectory(prefix="pegaflow-lookupwarm-") as d:
                server = start_server(Path(d) / "pool", pool_size=POOL)
                try:
                    rows[arm].append(fresh_process(argv_child + ["--endpoint", server.endpoint],
                                                   f"lookupwarm's {arm} process"))
                finally:
                    server.stop()
    json.dump({"command": "python -m pegaflow.bench.lookupwarm " + " ".join(argv),
               **{arm: summary(rows[arm]) for arm in arms}, "runs": rows}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
