"""Shared by the bridge tests: a small KV cache in ctypes memory laid out like vLLM's."""

from __future__ import annotations

import ctypes
import os

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
