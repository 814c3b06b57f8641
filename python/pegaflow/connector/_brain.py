"""ctypes calls into the connector's brain in Java (``io.pegaflow.connector``): plain data
in, plain data out. The state machines live there; this file only marshals. Both brains are
created on a store link handle (``_runtime.Link``), which gives them the current engine."""

from __future__ import annotations

import array
import ctypes
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from ctypes import c_int32, c_int64

from .. import _bridge
from ..engine import _hashes, _ids
from ..errors import InvalidArgumentError


FULL, SLIDING, RECURRENT = 0, 1, 2  # KV-cache group kinds (io.pegaflow.connector.CacheGroup)


@dataclass(frozen=True)
class Group:
    """One KV-cache group as the brains see it: its store instance, kind and (sliding) window."""

    instance_id: str
    kind: int = FULL
    window: int = 0


def _groups_text(groups: Sequence[Group]) -> bytes:
    return "\n".join(f"{g.kind} {g.window} {g.instance_id}" for g in groups).encode()


def _tables(tables: Sequence[Sequence[int]]) -> tuple[array.array, array.array, int]:
    """Block tables of every group as sched_after_alloc / sched_schedule take them."""
    ids = array.array("q")
    for t in tables:
        ids.extend(t)
    return ids, array.array("q", (len(t) for t in tables)), len(tables)


class CountersDue:
    """Whether a side's counters are worth reading from the JVM: after something that may have
    moved them (``mark``), or once ``EVERY_NS`` passed since the last read all the same (copies
    end on the store's threads); a decode step that loads and saves nothing reads none."""

    EVERY_NS = 250_000_000

    def __init__(self):
        self.due, self.at = True, 0

    def mark(self) -> None:
        self.due = True

    def take(self) -> bool:
        """True (and the next read is not due) when a read is due now."""
        now = time.monotonic_ns()
        if not self.due and now - self.at < self.EVERY_NS:
            return False
        self.due, self.at = False, now
        return True


class SchedulerBrain:
    def __init__(self, link_handle: int, groups: Sequence[Group], block_size: int, load_enabled: bool,
                 wait_full_prefix: bool = False, in_step: bool = False, at_alloc: bool = False,
                 warm_up: bool = False, begin_at_lookup: bool = True):
        out = c_int64()
        self._api = _bridge.api()
        mode = (2 if wait_full_prefix else 1) if load_enabled else 0  # sched_create's load mode (pegaflow.h)
        # loads inside the step: one KV-cache group only (the Java side keeps the others asynchronous)
        self.in_step = bool(in_step and load_enabled and len(groups) == 1)
        mode |= 4 if self.in_step else 0
        # ...started where vLLM allocates their blocks, when this process holds the worker too
        mode |= 8 if self.in_step and at_alloc else 0
        # the JVM compiles the per-request path on a scratch engine first (LookupWarmUp), once per process
        mode |= 16 if warm_up else 0
        # a load asks for its plan itself rather than taking the one its lookup began
        mode |= 0 if begin_at_lookup else 32
        try:
            self._api.call("sched_create", link_handle, _groups_text(groups), block_size, mode, ctypes.byref(out))
        except InvalidArgumentError:
            if not mode & (16 | 32):
                raise
            # an engine jar from before the warm-up's bit (or bit 32) refuses it: the side serves the
            # same without (such a jar plans every load at the load)
            self._api.call("sched_create", link_handle, _groups_text(groups), block_size, mode & ~(16 | 32),
                           ctypes.byref(out))
        self.handle: int | None = out.value
        self._buf = ctypes.create_string_buffer(1 << 16)
        # Whether a call since the last build_plan / stats may have changed what they return:
        # without one, a decode step's plan is empty and the counters are as they were, and the
        # step makes neither call into the JVM (docs/benchmarks/README.md, "Calls into the JVM
        # per step"; the counters are read now and then all the same: CountersDue).
        self._plan_due = True
        self._counts = CountersDue()

    def lookup(self, req_id: str, hashes: Sequence[bytes], num_tokens: int, num_computed: int,
               tail_tokens: Sequence[int] | None = None) -> int:
        """The hit in tokens (-1: "not yet"). ``tail_tokens``: the prompt's tokens after its full
        blocks ``hashes``, for P/D's tail flow (the brain derives the tail's key and answers
        every prompt token but the last when the hit reaches it)."""
        self._changed()
        packed, n, length = _hashes(hashes)
        out = c_int64()
        if tail_tokens is None:
            self._api.call("sched_lookup", self.handle, req_id.encode(), packed, n, length, num_tokens, num_computed,
                           ctypes.byref(out))
        else:
            tail = array.array("i", tail_tokens)
            self._api.call("sched_lookup_tail", self.handle, req_id.encode(), packed, n, length, tail.buffer_info()[0],
                           len(tail), num_tokens, num_computed, ctypes.byref(out))
        return out.value

    STATS = ("lookups", "not_yet", "hit_requests", "hit_tokens", "lookup_ns", "lookup_failures", "wait_timeouts",
             "prefix_waits", "hit_shrinks", "begun_at_lookup", "stagings", "staging_busy", "staging_too_large",
             "staging_failed", "staging_unavailable", "begin_no_worker", "begin_declined", "staging_starts",
             "staging_to_thread_ns", "staging_layout_ns", "staging_to_first_ns", "staging_landed",
             "staging_to_landed_ns", "staging_paced_groups", "staging_paced_gap_ns")

    def _changed(self) -> None:
        self._plan_due = True
        self._counts.mark()

    def stats(self) -> dict[str, int]:
        """The brain's counters since the last call (``STATS``, SchedulerSide.STAT_* order); none once
        closed, and none without a call into the JVM while no call since the last one could have
        changed them (lookups, allocations, schedules, ends; ``CountersDue``)."""
        if self.handle is None or not self._counts.take():
            return {}
        buf, count = (c_int64 * len(self.STATS))(), c_int32()
        self._api.call("sched_stats", self.handle, buf, len(buf), ctypes.byref(count))
        return dict(zip(self.STATS, buf[: count.value]))

    def after_alloc(self, req_id: str, tables: Sequence[Sequence[int]], num_external_tokens: int) -> None:
        """``tables``: the request's block table of each KV-cache group."""
        self._changed()
        ids, counts, n = _tables(tables)
        self._api.call("sched_after_alloc", self.handle, req_id.encode(), ids.buffer_info()[0], counts.buffer_info()[0],
                       n, num_external_tokens)

    def schedule(self, req_id: str, hashes: Sequence[bytes], hash_offset: int, new_block_ids: Sequence[Sequence[int]],
                 resumed: bool, num_computed: int, num_scheduled: int) -> None:
        """``new_block_ids``: each KV-cache group's new block ids (its whole table when resumed)."""
        self._changed()
        packed, n, length = _hashes(hashes)
        ids, counts, n_groups = _tables(new_block_ids)
        self._api.call("sched_schedule", self.handle, req_id.encode(), packed, n, length, hash_offset,
                       ids.buffer_info()[0], counts.buffer_info()[0], n_groups, int(resumed), num_computed, num_scheduled)

    def preempted(self, req_id: str) -> None:
        self._changed()
        self._api.call("sched_preempted", self.handle, req_id.encode())

    def build_plan(self) -> bytes:
        """This step's plan for the workers; empty, without a call into the JVM, when no call since
        the last plan could have added to it (a decode step inside a block)."""
        if not self._plan_due:
            return b""
        self._plan_due = False
        size = c_int64()
        try:
            self._api.call("sched_build_plan", self.handle, self._buf, len(self._buf), ctypes.byref(size))
        except InvalidArgumentError:
            if size.value <= len(self._buf):
                raise
            self._buf = ctypes.create_string_buffer(size.value * 2)
            self._api.call("sched_build_plan", self.handle, self._buf, len(self._buf), ctypes.byref(size))
        return self._buf.raw[: size.value]

    def request_finished(self, req_id: str) -> bool:
        self._changed()
        hold = c_int32()
        self._api.call("sched_request_finished", self.handle, req_id.encode(), ctypes.byref(hold))
        return bool(hold.value)

    def failed_blocks(self, block_ids: Iterable[int]) -> None:
        ids, address, n = _ids(block_ids)
        if n:
            self._changed()
            self._api.call("sched_failed_blocks", self.handle, address, n)

    def finished(self, sending: Iterable[str] | None, recving: Iterable[str] | None,
                 failed: Iterable[str] | None = None) -> None:
        s, r, f = ("\n".join(ids or ()) for ids in (sending, recving, failed))
        if s or r or f:
            self._changed()
            self._api.call("sched_finished", self.handle, s.encode(), r.encode(), f.encode())

    def close(self) -> None:
        if self.handle is not None:
            handle, self.handle = self.handle, None
            self._api.call("sched_close", handle)


class WorkerBrain:
    def __init__(self, link_handle: int, groups: Sequence[Group], worker_rank: int):
        out = c_int64()
        self._api = _bridge.api()
        self._api.call("worker_create", link_handle, _groups_text(groups), worker_rank, ctypes.byref(out))
        self.handle: int | None = out.value
        self._text = ctypes.create_string_buffer(1 << 14)
        self._errors = (c_int64 * 1024)()
        self._stats = (c_int64 * len(self.STATS))()
        self.idle = False  # the last get_finished's "I" line: nothing left for a later call (WorkerSide.idle)

    def warm_up(self, block_size: int) -> bool:
        """Starts the process's warm-up of the request path (lookups, plans, in-step loads) on a
        scratch engine in the JVM, once per process (``sched_create``'s bit 16 starts the same in
        the scheduler's process): True if this call started it. For a worker in a process of its
        own (vLLM's workers with several GPUs), whose first in-step loads would run cold. False
        too where the engine jar predates ``warm_up`` (an ABI 9 jar built before it)."""
        if not self._api.has("warm_up"):
            return False
        out = c_int32()
        self._api.call("warm_up", block_size, ctypes.byref(out))
        return bool(out.value)

    def start_loads(self, plan: bytes) -> int:
        """Starts the plan's loads; returns how many run inside this step (see ``wait_layer``)."""
        out = c_int32()
        self._api.call("worker_start_step_loads", self.handle, plan, len(plan), ctypes.byref(out))
        return out.value

    def wait_layer(self, layer: int, stream: int) -> None:
        """CUDA ``stream`` (0: this thread) waits for registered region ``layer`` of the step's in-step loads."""
        self._api.call("worker_wait_layer", self.handle, layer, stream)

    def submit_saves(self, plan: bytes, stream: int) -> None:
        self._api.call("worker_submit_saves", self.handle, plan, len(plan), stream)

    def await_preempted(self, plan: bytes) -> None:
        self._api.call("worker_await_preempted", self.handle, plan, len(plan))

    def get_finished(self, finished_ids: Iterable[str]) -> tuple[set[str], set[str], set[str]]:
        """(saves done, loads done, loads of those that failed in some group)."""
        ids = "\n".join(finished_ids).encode()
        size = c_int32()
        try:
            self._api.call("worker_get_finished", self.handle, ids, self._text, len(self._text), ctypes.byref(size))
        except InvalidArgumentError:
            if size.value < len(self._text):
                raise
            self._text = ctypes.create_string_buffer(size.value * 2 + 1)  # the results were kept for this call
            self._api.call("worker_get_finished", self.handle, b"", self._text, len(self._text), ctypes.byref(size))
        out: dict[str, set[str]] = {"S": set(), "R": set(), "F": set(), "I": set()}
        for line in self._text.value.decode().splitlines():
            out.setdefault(line[0], set()).add(line[2:])
        # "I": nothing is left for a later call to report (WorkerSide.idle); a jar without the
        # line never says so, and every step asks
        self.idle = bool(out["I"])
        return out["S"], out["R"], out["F"]

    def load_errors(self) -> set[int]:
        count = c_int32()
        try:
            self._api.call("worker_load_errors", self.handle, self._errors, len(self._errors), ctypes.byref(count))
        except InvalidArgumentError:
            if count.value <= len(self._errors):
                raise
            self._errors = (c_int64 * (count.value * 2))()  # the ids were kept for this call
            self._api.call("worker_load_errors", self.handle, self._errors, len(self._errors), ctypes.byref(count))
        return set(self._errors[: count.value])

    STATS = ("loaded_blocks", "loaded_bytes", "saved_blocks", "saved_bytes", "load_failed_blocks", "save_failures",
             "in_step_loads", "in_step_plan_ns", "in_step_load_ns", "in_step_wait_ns", "in_step_step_ns",
             "in_step_hop_ns", "in_step_store_ns", "in_step_at_alloc", "in_step_build_ns", "in_step_submit_ns",
             "in_step_first_copy_ns", "loads_staged")

    def stats(self) -> dict[str, int]:
        """Counters since the last call (``STATS``; vLLM's connector stats)."""
        count = c_int32()
        self._api.call("worker_stats", self.handle, self._stats, len(self._stats), ctypes.byref(count))
        return dict(zip(self.STATS, self._stats[: count.value]))

    def close(self) -> None:
        if self.handle is not None:
            handle, self.handle = self.handle, None
            self._api.call("worker_close", handle)
