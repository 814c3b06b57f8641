"""Shared by the bridge tests: a small KV cache in ctypes memory laid out like vLLM's."""

from __future__ import annotations

import ctypes
import os
import time

from pegaflow import LayerRegion

SEG = 4096
BLOCKS = 16


class Cache:
    """Per layer one [2, BLOCKS, SEG] buffer (K of every block, then V)."""

    def __init__(self, layers: int = 2):
        self.buffers = [ctypes.create_string_buffer(2 * BLOCKS * SEG) for _ in range(layers)]

    def regions(self, prefix: str = "model.layers") -> list[LayerRegion]:
        return [
            LayerRegion(f"{prefix}.{i}.attn", "split_kv", ctypes.addressof(b), 2 * BLOCKS * SEG, BLOCKS, SEG, SEG, BLOCKS * SEG)
            for i, b in enumerate(self.buffers)
        ]

    def block(self, block: int) -> bytes:
        return b"".join(
            b.raw[(s * BLOCKS + block) * SEG: (s * BLOCKS + block + 1) * SEG] for b in self.buffers for s in range(2)
        )

    def fill(self, block: int) -> bytes:
        for b in self.buffers:
            for s in range(2):
                ctypes.memmove(ctypes.addressof(b) + (s * BLOCKS + block) * SEG, os.urandom(SEG), SEG)
        return self.block(block)


def hashes(n: int) -> list[bytes]:
    return [os.urandom(32) for _ in range(n)]


def wait_until(condition, what: str, timeout: float = 10.0) -> None:
    """Polls ``condition()`` until it is true; fails naming ``what`` after ``timeout`` seconds."""
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"{what}: not after {timeout} s"
        time.sleep(0.005)


def settle(engine, instance_id: str, hashes: list[bytes], expect_not_yet: int, timeout: float = 10.0):
    """Queries until the answer is not "not yet" (a prefix read back from SSD) and returns it.
    The first answer must be "not yet" for ``expect_not_yet`` blocks, with no lease and no hit."""
    q = engine.query(instance_id, hashes)
    assert (q.pending_blocks, q.lease, q.hit_blocks) == (expect_not_yet, None, 0), q
    deadline = time.time() + timeout
    while q.pending_blocks:
        assert time.time() < deadline, f"still 'not yet' after {timeout} s: {q}"
        time.sleep(0.005)
        q = engine.query(instance_id, hashes)
    return q
