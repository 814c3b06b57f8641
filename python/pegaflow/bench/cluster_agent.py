"""One host's vLLM-side work in the cluster tier and ``pegaflow-bench cluster``, run inside that host's network namespace
(``ip netns exec``): save a prefix with content derived from its hashes, or fetch one and check
every byte. Prints one JSON line. Hashes and bytes follow from (--seed, block index) alone, so
the saving and the fetching host agree without talking."""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import sys
import time

from pegaflow import EngineClient, LayerRegion

SEG = 16384
BLOCKS = 64
LAYERS = 2  # the tests' default: 64 KiB blocks; pegaflow-bench cluster asks for 8 (256 KiB)


def block_hashes(seed: str, n: int) -> list[bytes]:
    return [hashlib.sha256(f"{seed}/{i}".encode()).digest() for i in range(n)]


def content(h: bytes, layer: int, s: int) -> bytes:
    unit = hashlib.sha256(h + bytes([layer, s])).digest()
    return unit * (SEG // len(unit))


class Cache:
    def __init__(self, layers: int = LAYERS):
        self.buffers = [ctypes.create_string_buffer(2 * BLOCKS * SEG) for _ in range(layers)]

    def regions(self):
        return [LayerRegion(f"model.layers.{i}.attn", "split_kv", ctypes.addressof(b), 2 * BLOCKS * SEG, BLOCKS, SEG, SEG,
                            BLOCKS * SEG) for i, b in enumerate(self.buffers)]

    def write(self, block: int, h: bytes):
        for li, b in enumerate(self.buffers):
            for s in range(2):
                ctypes.memmove(ctypes.addressof(b) + (s * BLOCKS + block) * SEG, content(h, li, s), SEG)

    def holds(self, block: int, h: bytes) -> bool:
        return all(b.raw[(s * BLOCKS + block) * SEG:(s * BLOCKS + block + 1) * SEG] == content(h, li, s)
                   for li, b in enumerate(self.buffers) for s in range(2))


def _fetch(c: EngineClient, cache: Cache, a, instance: str, hashes: list[bytes]) -> dict:
    start = time.perf_counter()
    not_yet = 0
    q = c.query(instance, hashes)
    while q.pending_blocks:
        not_yet += 1
        if time.perf_counter() - start > a.timeout:
            return {"error": f"still 'not yet' after {a.timeout} s"}
        time.sleep(0.005)
        q = c.query(instance, hashes)
    seconds = time.perf_counter() - start
    ok = True
    if q.hit_blocks and a.no_load:
        c.release(instance, q.lease)
    elif q.hit_blocks:
        assert q.hit_blocks <= BLOCKS // 2, "load at most 32 blocks; use --no-load for longer prefixes"
        dst = list(range(BLOCKS // 2, BLOCKS // 2 + q.hit_blocks))
        assert c.load(instance, 0, q.lease, dst).wait().blocks == q.hit_blocks
        ok = all(cache.holds(d, hashes[k]) for k, d in enumerate(dst))
    return {"hit": q.hit_blocks, "not_yet": not_yet, "identical": ok, "seconds": round(seconds, 4)}


def _rounds(a):
    """(seed, blocks) of each round: from the flags, or read from standard input as it comes."""
    if not a.stdin:
        yield from (((a.seed if a.rounds == 1 else f"{a.seed}{r}"), a.blocks) for r in range(a.rounds))
        return
    for line in sys.stdin:
        if line.strip():
            seed, blocks = line.split()
            yield seed, int(blocks)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("op", choices=["save", "fetch"])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--instance", required=True)
    p.add_argument("--ns", default="ns-cluster")
    p.add_argument("--seed", required=True)
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--layers", type=int, default=LAYERS, help=f"layers of {2 * SEG >> 10} KiB per block (default {LAYERS})")
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--flush", action="store_true", help="save: end with the flush barrier (visible to other hosts)")
    p.add_argument("--no-load", action="store_true", help="fetch: release the lease instead of loading (prefixes > 32 blocks)")
    p.add_argument("--rounds", type=int, default=1,
                   help="more than 1: one prefix per round, seeded SEED0, SEED1, ... (one JSON line each), from this one "
                        "process: a vLLM scheduler is long-lived, and a fresh process per round would time its JIT warm-up")
    p.add_argument("--pause", type=float, default=0.5, help="fetch rounds: seconds between rounds (each starts on a quiet host)")
    p.add_argument("--stdin", action="store_true",
                   help="rounds from standard input, one 'SEED BLOCKS' line each, answered as they come (the bench "
                        "decides between fetch rounds when the warm-up is over); --seed, --blocks, --rounds unused")
    a = p.parse_args()
    cache = Cache(a.layers)
    with EngineClient(a.endpoint) as c:
        c.register_instance(a.instance, a.ns, 1, 1)
        c.register_worker(a.instance, 0, 0, cache.regions())
        for r, (seed, blocks) in enumerate(_rounds(a)):
            hashes = block_hashes(seed, blocks)
            if a.op == "save":
                saved = 0
                for at in range(0, blocks, BLOCKS):  # the device cache holds BLOCKS at a time
                    batch = hashes[at:at + BLOCKS]
                    for i, h in enumerate(batch):
                        cache.write(i, h)
                    saved += c.save(a.instance, 0, list(range(len(batch))), batch).wait().blocks
                if a.flush:
                    c.flush()
                print(json.dumps({"saved": saved}), flush=True)
                continue
            if r:
                time.sleep(a.pause)
            got = _fetch(c, cache, a, a.instance, hashes)
            print(json.dumps(got), flush=True)
            if "error" in got:
                return 1
        return 0


if __name__ == "__main__":
    sys.exit(main())
