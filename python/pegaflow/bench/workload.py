"""The engine alone (``make run-engine``): multi-turn conversations through ``PegaEngine``, as vLLM drives it.

Conversations share system prompts; each turn's prompt is the conversation so far plus a new
user turn. Per request, like vLLM with a KV connector: hash the prompt's full blocks (chained
SHA-256 over token ids, like vLLM's prefix-cache hashes), query the longest cached prefix
(leaving at least the last prompt token to compute), load the hit blocks into freshly
allocated, scattered "GPU" block ids and check their bytes, "compute" the rest by writing
content derived from each block's hash, and save every new full block of prompt and reply.
The "GPU" KV cache is host memory laid out as vLLM's per-layer ``[2, blocks, 16, heads,
dim]`` tensors. A perfect cache replayed over the same trace gives ``ideal_hit_rate``.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import mmap
import random
import sys
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from pegaflow import _bridge
from pegaflow.engine import LayerRegion, PegaEngine
from pegaflow.errors import PegaflowError, PoolExhaustedError
from pegaflow.bench import range_option

MASK64 = (1 << 64) - 1
ROOT_HASH = bytes(32)


def _range(option: str, text: str) -> tuple[int, int]:
    return range_option("workload", option, text)


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


@dataclass
class Conversation:
    system: list[int]
    turns: list[tuple[list[int], list[int]]]
    tokens: list[int] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)
    turn: int = 0

    def __post_init__(self) -> None:
        self.tokens = list(self.system)

    def total_tokens(self) -> int:
        return len(self.system) + sum(len(u) + len(r) for u, r in self.turns)

    def block_hashes(self, block_tokens: int) -> list[bytes]:
        """Chained hashes of every full block so far: SHA-256(parent || token ids)."""
        for b in range(len(self.hashes), len(self.tokens) // block_tokens):
            parent = self.hashes[-1] if self.hashes else ROOT_HASH
            chunk = array("i", self.tokens[b * block_tokens: (b + 1) * block_tokens]).tobytes()
            self.hashes.append(hashlib.sha256(parent + chunk).digest())
        return self.hashes


class GpuCache:
    """vLLM's per-layer KV tensors in host memory, with content derived from block hashes."""

    def __init__(self, layers: int, blocks: int, segment: int):
        self.layers, self.blocks, self.segment = layers, blocks, segment
        self.layer_bytes = 2 * blocks * segment
        self.memory = mmap.mmap(-1, layers * self.layer_bytes)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.memory))

    def regions(self) -> list[LayerRegion]:
        return [
            LayerRegion(f"model.layers.{l}.self_attn.attn", "split_kv", self.base + l * self.layer_bytes,
                        self.layer_bytes, self.blocks, self.segment, self.segment, self.blocks * self.segment)
            for l in range(self.layers)
        ]

    def _pieces(self, block: int, digest: bytes):
        seed = int.from_bytes(digest[:8], "little")
        for l in range(self.layers):
            for s in range(2):
                yield self.base + l * self.layer_bytes + (s * self.blocks + block) * self.segment, _mix((seed + l * 2 + s) & MASK64)

    def fill(self, block: int, digest: bytes) -> None:
        """'Computes' a block: every K and V piece gets a fill byte and two tag words."""
        seg = self.segment
        for addr, tag in self._pieces(block, digest):
            ctypes.memset(addr, tag & 0xFF, seg)
            ctypes.c_uint64.from_address(addr).value = tag
            ctypes.c_uint64.from_address(addr + seg - 8).value = ~tag & MASK64

    def holds(self, block: int, digest: bytes, full: bool) -> bool:
        seg = self.segment
        for addr, tag in self._pieces(block, digest):
            if (ctypes.c_uint64.from_address(addr).value != tag
                    or ctypes.c_uint64.from_address(addr + seg - 8).value != ~tag & MASK64
                    or ctypes.c_uint8.from_address(addr + seg // 2).value != tag & 0xFF):
                return False
            if full and ctypes.string_at(addr + 8, seg - 16) != bytes([tag & 0xFF]) * (seg - 16):
                return False
        return True


def run(args: argparse.Namespace) -> dict:
    prefix, turn, reply = (_range(o, t) for o, t in
                           (("--prefix-tokens", args.prefix_tokens), ("--turn-tokens", args.turn_tokens),
                            ("--reply-tokens", args.reply_tokens)))
    for name in ("conversations", "turns", "system_prompts", "concurrency", "layers", "block_tokens"):
        if getattr(args, name) < 1:
            raise SystemExit(f"pegaflow-bench workload: --{name.replace('_', '-')} {getattr(args, name)}; expected >= 1")
    bt = args.block_tokens
    segment = bt * args.kv_heads * args.head_dim * args.dtype_bytes
    rnd = random.Random(args.seed)

    def tokens(n_range: tuple[int, int]) -> list[int]:
        return [rnd.randrange(128_000) for _ in range(rnd.randint(*n_range))]

    systems = [tokens(prefix) for _ in range(args.system_prompts)]
    convs = [Conversation(systems[rnd.randrange(len(systems))], [(tokens(turn), tokens(reply)) for _ in range(args.turns)])
             for _ in range(args.conversations)]
    gpu_blocks = max(c.total_tokens() for c in convs) // bt + 2
    gpu = GpuCache(args.layers, gpu_blocks, segment)

    query_ns: list[int] = []
    queryable = hit_total = ideal_total = prompt_tokens = refused = verified = failures = requests = 0
    namespace = f"sim-{args.layers}x{args.kv_heads}x{args.head_dim}x{args.dtype_bytes}-b{bt}"
    _bridge.api()  # start the JVM first: the prefault time below is the pool's alone
    t0 = time.perf_counter()
    engine = PegaEngine(pool_size=args.pool, copy_threads=args.copy_threads, prefault=args.prefault,
                        ssd_cache_paths=[str(p) for p in args.ssd_path], ssd_cache_capacity=args.ssd_capacity,
                        admission=args.admission, eviction=args.eviction)
    wait_ns: list[int] = []
    not_yet = 0
    prefault_seconds = time.perf_counter() - t0
    wall_start = time.perf_counter()
    with engine:
        engine.register_instance("workload", namespace, 1, 1)
        engine.register_worker("workload", 0, 0, gpu.regions())
        ideal_cache: set[bytes] = set()
        free = list(range(gpu_blocks))
        active: list[Conversation] = []
        pending = iter(convs)
        remaining = len(convs)
        while remaining or active:
            while len(active) < args.concurrency and remaining:
                active.append(next(pending))
                remaining -= 1
            conv = rnd.choice(active)
            user, answer = conv.turns[conv.turn]
            conv.tokens.extend(user)
            prompt_len = len(conv.tokens)
            conv.tokens.extend(answer)
            conv.turn += 1
            hashes = conv.block_hashes(bt)
            q = (prompt_len - 1) // bt
            full = len(conv.tokens) // bt
            ideal = 0
            while ideal < q and hashes[ideal] in ideal_cache:
                ideal += 1

            t0 = time.perf_counter_ns()
            result = engine.query("workload", hashes[:q])
            query_ns.append(time.perf_counter_ns() - t0)
            if result.pending_blocks:
                # "not yet": the prefix continues on SSD and is being read back; vLLM would
                # ask again at its next scheduler step
                while result.pending_blocks:
                    not_yet += 1
                    if time.perf_counter_ns() - t0 > 60e9:
                        raise SystemExit(f"pegaflow-bench workload: request {requests} still 'not yet' after 60 s "
                                         f"(hit {result.hit_blocks}, pending {result.pending_blocks} of {q}): "
                                         f"{engine.stats()}")
                    time.sleep(0.0002)
                    result = engine.query("workload", hashes[:q])
                wait_ns.append(time.perf_counter_ns() - t0)
            rnd.shuffle(free)  # vLLM hands out scattered block ids
            ids = free[: (len(conv.tokens) + bt - 1) // bt]
            h = result.hit_blocks
            if h:
                engine.load("workload", 0, result.lease, ids[:h]).wait()
                if args.verify != "none":
                    for i in range(h):
                        verified += 1
                        failures += not gpu.holds(ids[i], hashes[i], args.verify == "full")
            for i in range(h, full):
                gpu.fill(ids[i], hashes[i])
            if full > h:
                try:
                    engine.save("workload", 0, ids[h:full], hashes[h:full]).wait()
                except PoolExhaustedError:
                    refused += 1
            ideal_cache.update(hashes[:full])
            requests += 1
            queryable += q
            hit_total += h
            ideal_total += ideal
            prompt_tokens += prompt_len
            if conv.turn == len(conv.turns):
                active.remove(conv)
        stats = engine.stats()
    wall = time.perf_counter() - wall_start
    wait_ns.sort()

    query_ns.sort()

    def pct(p: float) -> float:
        return query_ns[min(len(query_ns) - 1, max(0, int(p * len(query_ns) + 0.999999) - 1))] / 1000 if query_ns else 0.0

    def rate(a: int, b: int) -> float:
        return a / b if b else 0.0

    return {
        "mode": "embedded",
        "front": "python",
        "transfer": "host",
        "hit_rate": rate(hit_total, queryable),
        "ideal_hit_rate": rate(ideal_total, queryable),
        "blocks_saved": stats["pegaflow_save_blocks_total"],
        "blocks_loaded": stats["pegaflow_load_blocks_total"],
        "evictions": stats["pegaflow_cache_block_evictions_total"],
        "load_gbps": rate(stats["pegaflow_load_bytes_total"], stats["pegaflow_load_transfer_nanoseconds_total"]),
        "save_gbps": rate(stats["pegaflow_save_bytes_total"], stats["pegaflow_save_transfer_nanoseconds_total"]),
        "query_p50_us": pct(0.50),
        "query_p99_us": pct(0.99),
        "requests": requests,
        "prompt_tokens": prompt_tokens,
        "queryable_blocks": queryable,
        "hit_blocks": hit_total,
        "ideal_hit_blocks": ideal_total,
        "save_skipped_blocks": stats["pegaflow_save_skipped_blocks_total"],
        "save_not_admitted_blocks": stats["pegaflow_save_not_admitted_blocks_total"],
        "admission": args.admission,
        "eviction": args.eviction,
        "saves_refused_pool_exhausted": refused,
        "load_bytes": stats["pegaflow_load_bytes_total"],
        "save_bytes": stats["pegaflow_save_bytes_total"],
        "pool_bytes": stats["pegaflow_pool_capacity_bytes"],
        "pool_used_bytes_at_end": stats["pegaflow_pool_used_bytes"],
        "block_bytes": args.layers * 2 * segment,
        "gpu_blocks": gpu_blocks,
        "tier_hit_blocks": {"dram": stats["pegaflow_cache_tier_dram_blocks_total"],
                            "ssd": stats["pegaflow_cache_tier_ssd_blocks_total"]},
        "ssd": None if not args.ssd_path else {
            "paths": [str(p) for p in args.ssd_path], "capacity": args.ssd_capacity,
            "blocks_on_ssd_at_end": stats["pegaflow_ssd_blocks"],
            "written_blocks": stats["pegaflow_ssd_write_blocks_total"],
            "read_blocks": stats["pegaflow_ssd_read_blocks_total"],
            "write_queue_full": stats["pegaflow_ssd_write_queue_full_total"],
            "write_skipped": stats["pegaflow_ssd_write_skipped_total"],
            "checksum_failures": stats["pegaflow_ssd_checksum_failures_total"],
            "not_yet_answers": not_yet,
            "requests_that_waited": len(wait_ns),
            "wait_ms_p50": wait_ns[len(wait_ns) // 2] / 1e6 if wait_ns else 0.0,
            "wait_ms_max": wait_ns[-1] / 1e6 if wait_ns else 0.0,
        },
        "verify": args.verify,
        "verified_blocks": verified,
        "verify_failures": failures,
        "pool_prefault_seconds": prefault_seconds if args.prefault else 0.0,
        "wall_seconds": wall,
        "workload": {
            "conversations": args.conversations, "turns": args.turns, "system_prompts": args.system_prompts,
            "prefix_tokens": args.prefix_tokens, "turn_tokens": args.turn_tokens, "reply_tokens": args.reply_tokens,
            "concurrency": args.concurrency, "seed": args.seed,
            "geometry": f"{args.layers} layers x {args.kv_heads} kv heads x {args.head_dim} x {args.dtype_bytes} B, "
                        f"{bt}-token blocks",
        },
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pegaflow-bench workload", description=__doc__.split("\n\n")[0])
    p.add_argument("--pool", default="2gb", help="host pool size (default 2gb: small enough to evict)")
    p.add_argument("--conversations", type=int, default=64)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--system-prompts", type=int, default=8)
    p.add_argument("--prefix-tokens", default="1024-2048")
    p.add_argument("--turn-tokens", default="200-800")
    p.add_argument("--reply-tokens", default="50-300")
    p.add_argument("--concurrency", type=int, default=8, help="conversations active at once")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype-bytes", type=int, default=2)
    p.add_argument("--block-tokens", type=int, default=16)
    p.add_argument("--copy-threads", type=int, default=2)
    p.add_argument("--prefault", action=argparse.BooleanOptionalAction, default=True,
                   help="commit pool pages before the run, as pinning does on a GPU host (reported apart)")
    p.add_argument("--ssd-path", type=Path, action="append", default=[],
                   help="directory of an SSD tier below the pool (repeatable; default: none)")
    p.add_argument("--ssd-capacity", default="64gb", help="disk space of the SSD tier (default 64gb)")
    p.add_argument("--admission", default="all", help="all, or seen:N: save a block once lookups asked for it N times")
    p.add_argument("--eviction", default="lru", help="lru, or lfu: the least asked for of the least recently used")
    p.add_argument("--verify", choices=["none", "sample", "full"], default="sample")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=Path, default=Path("out/run-report.json"))
    return p


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        report = run(args)
    except PegaflowError as e:
        print(f"pegaflow-bench workload: {e}", file=sys.stderr)
        return 2
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"PegaFlow-JVM workload (embedded engine, Python front): {report['requests']} requests from "
          f"{args.conversations} conversations x {args.turns} turns, pool {_size(report['pool_bytes'])}")
    print(f"  hit rate {100 * report['hit_rate']:.1f}% of queryable blocks (ideal {100 * report['ideal_hit_rate']:.1f}%), "
          f"{report['evictions']} evictions, {report['saves_refused_pool_exhausted']} refused saves")
    print(f"  saved {report['blocks_saved']} blocks ({_size(report['save_bytes'])}) at {report['save_gbps']:.1f} GB/s, "
          f"loaded {report['blocks_loaded']} blocks ({_size(report['load_bytes'])}) at {report['load_gbps']:.1f} GB/s")
    print(f"  query p50 {report['query_p50_us']:.1f} us, p99 {report['query_p99_us']:.1f} us; verified "
          f"{report['verified_blocks']} loaded blocks ({args.verify}), {report['verify_failures']} mismatches; "
          f"{report['wall_seconds']:.1f} s")
    print(f"  report: {args.json}")
    return 0 if report["verify_failures"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
