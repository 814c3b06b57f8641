"""The main job (``make run``): multi-turn conversations on real vLLM engines sharing one
pegaflow-server, against the same prompts without the connector.

Two engine instances (real ``vllm.LLM`` engines of the installed vLLM, the CPU build here, on
the tiny local model of ``pegaflow.models.tiny``) save to and load from one pegaflow-server
started for the run; a third engine without the connector answers the same prompts. The
conversations share system prompts (text tokenized by the model's own tokenizer); each turn's
prompt is the conversation so far plus a new user turn, turns move between the instances, and
each instance's KV cache is small, so vLLM's own prefix cache forgets and the store serves.
The server's pool is small too, so the store evicts.

Reported (``--json``): outputs identical (token ids of every answer, with and without the
store), tokens served by the store, TTFT p50 with and without the store (vLLM's own
``first_token_latency``, same prompts, same run), the store's hits, evictions and bytes, and the
hit rate against a perfect cache replayed over the same trace (``ideal_hit_rate``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from pegaflow._server import start_server
from pegaflow._vllm_version import installed_vllm

from . import range_option
from .engine_proc import EngineProc, EngineSpec


def _text(rnd: random.Random, words: int) -> str:
    from pegaflow.models.tiny import _WORDS

    return " ".join(rnd.choice(_WORDS) for _ in range(words)).capitalize() + "."


def run(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from pegaflow.models.tiny import build

    t0 = time.perf_counter()
    model = str(build(args.model))
    tok = AutoTokenizer.from_pretrained(model)
    rnd = random.Random(args.seed)
    bs = args.block_tokens
    systems = [tok.encode(_text(rnd, rnd.randint(*args.system_words)), add_special_tokens=False)
               for _ in range(args.system_prompts)]
    tmp = tempfile.TemporaryDirectory(prefix="pegaflow-run-")
    server = start_server(Path(tmp.name) / "pool", pool_size=args.pool)
    names = [f"vllm-{i}" for i in range(args.instances)]
    procs = [EngineProc(n) for n in names] + [EngineProc("no-store")]
    try:
        common = dict(model=model, block_size=bs, kv_cache_bytes=args.kv_cache_blocks * _block_bytes(model, bs),
                      max_model_len=args.max_model_len)
        for name, p in zip(names, procs):
            p.send("open", EngineSpec(**common, engine_id=name, connector={"mode": "server",
                                                                           "endpoint": server.endpoint}))
        procs[-1].send("open", EngineSpec(**common))
        start_s = [p.wait("open") for p in procs]
        # Warm-up on prompts of their own (token ids outside the tokenizer's words, so they share no
        # block with the workload): JIT-compiles the connector's and the server's paths, as a
        # running deployment has, on every engine alike; then every cache is emptied.
        warm = random.Random(args.seed + 1)
        for _ in range(args.warmup):
            prompt = [warm.randrange(900, 1000) for _ in range(warm.randint(200, 600))]
            for p in procs:
                p.generate([prompt], 4, 0)
                p.generate([prompt + [warm.randrange(900, 1000)]], 4, 0)
        for p in procs:
            p.reset_prefix_cache()
        counted = ("pegaflow_load_blocks_total", "pegaflow_save_blocks_total", "pegaflow_load_bytes_total",
                   "pegaflow_save_bytes_total", "pegaflow_cache_block_evictions_total", "pegaflow_save_failures_total")
        warm_stats = {k: server.metric(k) for k in counted}  # the run's figures exclude the warm-up's
        setup_s = time.perf_counter() - t0

        convs = [list(systems[rnd.randrange(len(systems))]) for _ in range(args.conversations)]
        seen: set[tuple] = set()  # every full block (as its token prefix) computed so far: the perfect cache
        rows = []
        wall0 = time.perf_counter()
        for t in range(args.turns):
            for c, conv in enumerate(convs):
                conv.extend(tok.encode(" " + _text(rnd, rnd.randint(*args.turn_words)), add_special_tokens=False))
                prompt = list(conv)
                q = (len(prompt) - 1) // bs
                hit = 0
                while hit < q and tuple(prompt[: (hit + 1) * bs]) in seen:
                    hit += 1
                max_tokens = rnd.randint(*args.reply_tokens)
                inst = (c + t) % args.instances
                store = procs[inst].generate([prompt], max_tokens, 0)[0]
                base = procs[-1].generate([prompt], max_tokens, 0)[0]
                # the perfect cache keeps every full block whose KV was computed: the prompt's and the
                # reply's but its last token (which no forward has consumed yet)
                written = prompt + store.token_ids[:-1]
                seen.update(tuple(written[: (b + 1) * bs]) for b in range(len(written) // bs))
                rows.append(dict(conv=c, turn=t, instance=names[inst], prompt_tokens=len(prompt), queryable=q * bs,
                                 ideal=hit * bs, store=store, base=base))
                conv.extend(store.token_ids)
        wall = time.perf_counter() - wall0
        metric = server.metric
        stats = {k: metric(k) - warm_stats[k] for k in counted}
    finally:
        for p in procs:
            p.exit()
        server.stop()
        tmp.cleanup()

    def p50(xs):
        return round(1000 * statistics.median(xs), 2) if xs else 0.0

    def rate(a, b):
        return round(a / b, 4) if b else 0.0

    queryable = sum(r["queryable"] for r in rows)
    mismatches = [f"conv {r['conv']} turn {r['turn']}" for r in rows if r["store"].token_ids != r["base"].token_ids]
    store_tokens = int(stats["pegaflow_load_blocks_total"]) * bs
    cached_store = sum(min(r["store"].cached_tokens, r["queryable"]) for r in rows)
    cached_base = sum(min(r["base"].cached_tokens, r["queryable"]) for r in rows)
    dist, version = installed_vllm()
    return {
        "front": f"vLLM {version} ({dist}) engines, PegaKVConnector in server mode",
        "vllm_version": version,
        "vllm_distribution": dist,
        "instances": args.instances,
        "requests": len(rows),
        "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
        "queryable_tokens": queryable,
        "outputs_identical": not mismatches,
        "mismatches": mismatches[:20],
        "store_tokens": store_tokens,
        "hit_rate": rate(cached_store, queryable),
        "hit_rate_no_store": rate(cached_base, queryable),
        "store_hit_rate": rate(store_tokens, queryable),
        "ideal_hit_rate": rate(sum(r["ideal"] for r in rows), queryable),
        "ttft_p50_ms_store": p50([r["store"].ttft_s for r in rows]),
        "ttft_p50_ms_no_store": p50([r["base"].ttft_s for r in rows]),
        "ttft_p50_ms_store_turns_2_plus": p50([r["store"].ttft_s for r in rows if r["turn"] > 0]),
        "ttft_p50_ms_no_store_turns_2_plus": p50([r["base"].ttft_s for r in rows if r["turn"] > 0]),
        "blocks_saved": int(stats["pegaflow_save_blocks_total"]),
        "blocks_loaded": int(stats["pegaflow_load_blocks_total"]),
        "save_bytes": int(stats["pegaflow_save_bytes_total"]),
        "load_bytes": int(stats["pegaflow_load_bytes_total"]),
        "evictions": int(stats["pegaflow_cache_block_evictions_total"]),
        "save_failures": int(stats["pegaflow_save_failures_total"]),
        "engine_start_seconds": [round(s, 2) for s in start_s],
        # per request: [conv, turn, instance, prompt tokens, cached with the store, TTFT ms with the store,
        #               cached without, TTFT ms without]
        "requests_detail": [[r["conv"], r["turn"], r["instance"], r["prompt_tokens"], r["store"].cached_tokens,
                             round(1000 * r["store"].ttft_s, 1), r["base"].cached_tokens,
                             round(1000 * r["base"].ttft_s, 1)] for r in rows],
        "setup_seconds": round(setup_s, 1),
        "wall_seconds": round(wall, 1),
        "workload": {
            "warmup_requests_per_engine": 2 * args.warmup,
            "conversations": args.conversations, "turns": args.turns, "system_prompts": args.system_prompts,
            "system_words": args.system_words, "turn_words": args.turn_words, "reply_tokens": args.reply_tokens,
            "kv_cache_blocks_per_instance": args.kv_cache_blocks, "block_tokens": bs, "pool": args.pool,
            "seed": args.seed, "model": "tiny random-weight Llama (pegaflow.models.tiny): 2 layers, 2 KV heads x 32",
        },
    }


def _block_bytes(model: str, block_tokens: int) -> int:
    """KV bytes of one block of the model (K and V, every layer, float32 as EngineSpec runs it)."""
    cfg = json.loads((Path(model) / "config.json").read_text())
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * block_tokens * 4


def _range(option: str, text: str) -> tuple[int, int]:
    return range_option("vllm-run", option, text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pegaflow-bench vllm-run", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="out/tiny-llama", help="tiny model folder (built there when missing)")
    p.add_argument("--instances", type=int, default=2, help="engine instances sharing the server (default 2)")
    p.add_argument("--conversations", type=int, default=16)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-prompts", type=int, default=3)
    p.add_argument("--system-words", default="250-400", help="system prompt length range (words)")
    p.add_argument("--turn-words", default="20-60", help="user turn length range (words)")
    p.add_argument("--reply-tokens", default="8-24", help="reply length range (tokens)")
    p.add_argument("--kv-cache-blocks", type=int, default=96, help="each engine's KV cache (small: vLLM forgets)")
    p.add_argument("--block-tokens", type=int, default=32, help="vLLM block size (the CPU backend wants n x 32)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--pool", default="16mb", help="pool of the server started for the run (smaller than the run's blocks: the store evicts)")
    p.add_argument("--warmup", type=int, default=6, help="warm-up prompt pairs per engine before the run")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", default=None, help="write the report here")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    for name in ("system_words", "turn_words", "reply_tokens"):
        setattr(args, name, _range("--" + name.replace("_", "-"), getattr(args, name)))
    for name in ("instances", "conversations", "turns", "system_prompts", "kv_cache_blocks"):
        if getattr(args, name) < 1:
            raise SystemExit(f"pegaflow-bench vllm-run: --{name.replace('_', '-')} {getattr(args, name)}; "
                             "expected >= 1")
    report = run(args)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(f"PegaFlow-JVM on {report['front']}: {report['requests']} requests on {report['instances']} instances "
          f"sharing one pegaflow-server (pool {args.pool})")
    print(f"  outputs identical to no connector: {report['outputs_identical']}; store served {report['store_tokens']} "
          f"tokens ({100 * report['store_hit_rate']:.1f}% of queryable)")
    print(f"  hit rate {100 * report['hit_rate']:.1f}% with the store, {100 * report['hit_rate_no_store']:.1f}% "
          f"without (ideal {100 * report['ideal_hit_rate']:.1f}%); store evictions {report['evictions']}")
    print(f"  TTFT p50 {report['ttft_p50_ms_store']} ms with the store, {report['ttft_p50_ms_no_store']} ms without")
    return 0 if report["outputs_identical"] else 1
