"""The store's block events as vLLM KV events (scheduler side).

KV-aware routers place a request where its prefix is cached. vLLM publishes its own GPU
cache's events through ``--kv-events-config`` (ZMQ); a connector adds its own through
``take_events``, which the scheduler calls every step. This feed reads the store's events of
the instance's namespaces (``link_kv_events``: a block sealed into host memory, evicted or
cleared from it, written to or dropped from SSD, advertised to or withdrawn from the
cluster) and hands them to vLLM as ``BlockStored`` / ``BlockRemoved`` with the tier as the
medium (``CPU``, ``SSD``, ``REMOTE``) and the KV-cache group's index.

- Only while vLLM publishes events (``kv_events_config.enable_kv_cache_events``): otherwise
  the scheduler's calls cost nothing.
- At most one read per group every ``interval_s`` (0.1 s): in server mode a read is one RPC,
  and steps come every few milliseconds.
- Bounded: a read returns at most ``MAX_READ`` events; the store keeps a ring of them and a
  feed that fell behind is told (a gap), which is logged and counted, never waited for.
- The hashes are the store's keys: vLLM's block hashes where they agree across processes, the
  engine's own chain over the token ids where they do not (``_keys``).
- Events carry no token ids (block_size 0, as vLLM's own offloading connector sends for
  blocks whose request it did not see): the store learns of evictions and of other
  instances' saves without their tokens.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from ..errors import PegaflowError

log = logging.getLogger("pegaflow.connector")

MAX_READ = 1000
_LINE_BYTES = 160  # "S REMOTE <hex of a key of up to 64 bytes>\n" with room to spare


def enabled(vllm_config) -> bool:
    """Whether vLLM publishes KV events (its scheduler then forwards what ``take_events`` gives)."""
    cfg = getattr(vllm_config, "kv_events_config", None)
    return bool(cfg is not None and getattr(cfg, "enable_kv_cache_events", False))


def parse(text: str) -> tuple[int, bool, list[tuple[bool, str, bytes]]]:
    """``link_kv_events``'s text: (next, gap, [(stored, tier, key), ...])."""
    lines = text.splitlines()
    head = dict(part.split("=", 1) for part in lines[0].split())
    rows = []
    for line in lines[1:]:
        kind, tier, key = line.split(" ")
        rows.append((kind == "S", tier, bytes.fromhex(key)))
    return int(head["next"]), head["gap"] == "1", rows


def _vllm_event_classes():
    from vllm.distributed.kv_events import BlockRemoved, BlockStored

    return BlockStored, BlockRemoved


def _hash_converter() -> Callable[[bytes], object]:
    """vLLM's form of a block hash in events (bytes, or an int with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)."""
    try:
        from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
    except ImportError:  # older minors publish the bytes
        return lambda key: key
    return maybe_convert_block_hash


def _make(cls, **fields):
    """An event of ``cls`` with the fields this vLLM's event class has (they grew over minors)."""
    names = getattr(cls, "__struct_fields__", None)
    if names is not None:
        fields = {k: v for k, v in fields.items() if k in names}
    return cls(**fields)


class EventFeed:
    """One scheduler-side connector's feed: ``groups`` are (group index, store instance id)."""

    def __init__(self, link, groups: Sequence[tuple[int, str]], interval_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic):
        self._link = link
        self._groups = list(groups)
        self._after = {g: 0 for g, _ in self._groups}
        self._interval = interval_s
        self._clock = clock
        self._next_read = 0.0
        self._convert = _hash_converter()
        self._stored, self._removed = _vllm_event_classes()
        self.published = 0  # events handed to vLLM
        self.gaps = 0  # reads that found events dropped from the store's ring before them
        self._warned_unavailable = False

    def take(self) -> list:
        now = self._clock()
        if now < self._next_read:
            return []
        self._next_read = now + self._interval
        out: list = []
        for group, instance_id in self._groups:
            try:
                text = self._link.kv_events(instance_id, self._after[group], MAX_READ, MAX_READ * _LINE_BYTES + 64)
            except PegaflowError as e:  # no store bound (server down): events resume with it
                if not self._warned_unavailable:
                    self._warned_unavailable = True
                    log.warning("KV events: the store's events are not readable now (%s); they resume when it answers", e)
                continue
            self._warned_unavailable = False
            nxt, gap, rows = parse(text)
            if gap:
                self.gaps += 1
                log.warning("KV events: the store dropped events of instance %s before this feed read them (its "
                            "ring is full); routers may hold stale placements until the blocks change again",
                            instance_id)
            self._after[group] = nxt
            out.extend(self._events(group, rows))
        self.published += len(out)
        return out

    def _events(self, group: int, rows: list[tuple[bool, str, bytes]]) -> list:
        """One BlockStored per stored block (vLLM's chain semantics: several hashes in one event are
        consecutive blocks); consecutive removals from one tier coalesced into one BlockRemoved."""
        out: list = []
        removed: list = []
        removed_tier = None
        for stored, tier, key in rows:
            if removed and (stored or tier != removed_tier):
                out.append(_make(self._removed, block_hashes=removed, medium=removed_tier, group_idx=group))
                removed = []
            if stored:
                out.append(_make(self._stored, block_hashes=[self._convert(key)], parent_block_hash=None, token_ids=[],
                                 block_size=0, lora_id=None, medium=tier, lora_name=None, group_idx=group))
            else:
                removed.append(self._convert(key))
                removed_tier = tier
        if removed:
            out.append(_make(self._removed, block_hashes=removed, medium=removed_tier, group_idx=group))
        return out
