"""``PegaEngine``: the embedded Java engine from Python.

Thin by design: arguments become plain ints, bytes and addresses, and every call goes
straight to the engine's C ABI (``pegaflow._bridge``). Errors arrive as the typed
exceptions of ``pegaflow.errors`` carrying the Java message. Any thread may call; calls
release the GIL.
"""

from __future__ import annotations

import array
import ctypes
import json
import struct
from ctypes import c_int32, c_int64
from dataclasses import dataclass
from typing import Iterable, Sequence

from pegaflow import _bridge
from pegaflow.errors import InvalidArgumentError, TransferFailedError, from_code

LEASE_BYTES = 16
LAYOUTS = {"split_kv": 0, "combined": 1, "mla": 2}
TRANSFERS = {"host": 0, "cuda": 1}
DEFAULT_SSD_CAPACITY = "512gb"  # as pegaflow-server's --ssd-cache-capacity


def ssd_lines(paths: Sequence[str], capacity: str) -> bytes:
    """An SSD tier as the bridge takes it (b"" for none)."""
    if isinstance(paths, (str, bytes)):
        raise InvalidArgumentError(f"ssd_cache_paths {paths!r}; expected a list of directories")
    for p in paths:
        if not p or "\n" in str(p):
            raise InvalidArgumentError(f"ssd cache path {p!r}; expected a directory")
    if not paths:
        return b""
    return ("".join(f"ssd_cache_path={p}\n" for p in paths) + f"ssd_cache_capacity={capacity}\n").encode()


def _policy_lines(admission: str, eviction: str) -> bytes:
    """The policies as engine_create's settings lines (checked by the engine, which names a bad one)."""
    for name, value in (("admission", admission), ("eviction", eviction)):
        if not isinstance(value, str) or "\n" in value:
            raise InvalidArgumentError(f"{name} {value!r}; expected a policy name (docs/engine.md)")
    return f"admission={admission}\neviction={eviction}\n".encode()


@dataclass(frozen=True)
class LayerRegion:
    """One layer's KV cache: segment ``s`` of block ``b`` is at
    ``base_address + b * block_stride + s * segment_offset`` and is ``segment_bytes`` long.
    ``layout``: ``split_kv`` (2 segments, K and V), ``combined`` or ``mla`` (1 segment)."""

    name: str
    layout: str
    base_address: int
    region_bytes: int
    num_blocks: int
    block_stride: int
    segment_bytes: int
    segment_offset: int = 0

    def params(self) -> list[int]:
        if self.layout not in LAYOUTS:
            raise InvalidArgumentError(
                f"layer '{self.name}': layout '{self.layout}'; expected one of {sorted(LAYOUTS)}"
            )
        return [
            LAYOUTS[self.layout], self.base_address, self.region_bytes, self.num_blocks,
            self.block_stride, self.segment_bytes, self.segment_offset,
        ]


@dataclass(frozen=True)
class QueryResult:
    """Leading resident blocks and the lease pinning them (None when nothing hit).

    ``pending_blocks > 0`` means "not yet": that many blocks after the prefix are being read
    back from the SSD tier; no lease was issued; query again.
    """

    hit_blocks: int
    lease: bytes | None
    pending_blocks: int = 0


@dataclass(frozen=True)
class TransferResult:
    blocks: int
    skipped_blocks: int
    bytes: int


class Completion:
    """An asynchronous save or load. ``wait()`` returns its result or raises its error
    (``TransferFailedError.block_ids`` lists the blocks to recompute) and frees it."""

    def __init__(self, handle: int):
        self._handle = handle
        self._result: TransferResult | None = None
        self._error: Exception | None = None

    def done(self) -> bool:
        if self._result is not None or self._error is not None:
            return True
        out = c_int32()
        _bridge.api().call("poll", self._handle, ctypes.byref(out))
        return bool(out.value)

    def wait(self, timeout: float | None = None) -> TransferResult:
        if self._result is not None:
            return self._result
        if self._error is not None:
            raise self._error
        api = _bridge.api()
        values = (c_int64 * 3)()
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        rc = api.fns["wait"](self._handle, ms, values)
        if rc == 11:  # TIMEOUT: still in flight, keep the handle
            raise from_code(rc, api.last_error())
        try:
            if rc != 0:
                error = from_code(rc, api.last_error())
                if isinstance(error, TransferFailedError):
                    error.block_ids = self._failed_blocks(api)
                self._error = error
                raise error
            self._result = TransferResult(values[0], values[1], values[2])
            return self._result
        finally:
            api.call("completion_free", self._handle)

    def _failed_blocks(self, api) -> list[int]:
        count = c_int32()
        api.call("failed_blocks", self._handle, None, 0, ctypes.byref(count))
        out = (c_int64 * count.value)()
        api.call("failed_blocks", self._handle, out, count.value, ctypes.byref(count))
        return list(out)


def _ids(block_ids: Iterable[int]) -> tuple[array.array, int, int]:
    """int64 array, its address and length, for a block id argument (list, array, numpy)."""
    arr = block_ids if isinstance(block_ids, array.array) and block_ids.typecode == "q" else array.array("q", block_ids)
    address, n = arr.buffer_info()
    return arr, address, n


def _hashes(hashes: Sequence[bytes]) -> tuple[bytes, int, int]:
    if not hashes:
        return b"", 0, 0
    length = len(hashes[0])
    if any(len(h) != length for h in hashes):
        raise InvalidArgumentError(
            f"hashes have lengths {sorted({len(h) for h in hashes})}; expected one length per call"
        )
    return b"".join(hashes), len(hashes), length


class PegaEngine:
    """The embedded engine: a host pool of ``pool_size`` and the operations on it.

    ``transfer="cuda"`` pins the pool on ``device`` and moves blocks with the CUDA copy
    engine; the default moves host memory (CPU tests, the workload). ``prefault`` commits
    the pool's pages at once (pinning does that anyway on a GPU host)."""

    _handle: int | None = None

    def __init__(
        self,
        pool_size: str = "1gb",
        copy_threads: int = 2,
        lease_ttl_s: float | None = None,
        transfer: str = "host",
        device: int = 0,
        prefault: bool = False,
        ssd_cache_paths: Sequence[str] = (),
        ssd_cache_capacity: str = DEFAULT_SSD_CAPACITY,
        admission: str = "all",
        eviction: str = "lru",
    ):
        """``admission``: ``all``, or ``seen:N`` (a block is saved once lookups asked for it N
        times); ``eviction``: ``lru``, or ``lfu`` (of the least recently used blocks, the least
        asked for leaves first). See docs/engine.md, "Policies"."""
        if transfer not in TRANSFERS:
            raise InvalidArgumentError(f"transfer '{transfer}'; expected one of {sorted(TRANSFERS)}")
        api = _bridge.api()
        out = c_int64()
        ttl_ms = 0 if lease_ttl_s is None else int(lease_ttl_s * 1000)
        api.call(
            "engine_create", str(pool_size).encode(), copy_threads, ttl_ms, TRANSFERS[transfer], device, int(prefault),
            ssd_lines(ssd_cache_paths, ssd_cache_capacity) + _policy_lines(admission, eviction), ctypes.byref(out),
        )
        self._handle: int | None = out.value

    def _h(self) -> int:
        if self._handle is None:
            raise from_code(8, "engine is closed")
        return self._handle

    def register_instance(self, instance_id: str, namespace: str, tp_size: int = 1, world_size: int = 1) -> None:
        _bridge.api().call("register_instance", self._h(), instance_id.encode(), namespace.encode(), tp_size, world_size)

    def register_worker(
        self, instance_id: str, worker_rank: int, tp_rank: int, layers: Sequence[LayerRegion], device_id: int = 0
    ) -> None:
        """Registers a worker's KV regions (raw addresses) for its copies.

        CHECKED: with ``transfer="cuda"`` every region must lie in CUDA device memory; one
        ending past its allocation or at none raises :class:`InvalidArgumentError` with the
        numbers, and nothing is registered. With host copies every region must lie in memory
        this process may read and write (its ``/proc/self/maps``), else
        :class:`InvalidArgumentError` names the first address not covered; the caller keeps it
        mapped until ``unregister_instance``. The connector derives regions from torch tensors
        and checks them against the tensor's storage first."""
        names, params = _regions(layers)
        _bridge.api().call(
            "register_worker", self._h(), instance_id.encode(), worker_rank, tp_rank, device_id, len(layers),
            names, params.buffer_info()[0],
        )

    def unregister_instance(self, instance_id: str) -> None:
        _bridge.api().call("unregister_instance", self._h(), instance_id.encode())

    def save(
        self,
        instance_id: str,
        worker_rank: int,
        block_ids: Iterable[int],
        hashes: Sequence[bytes],
        layer_names: Sequence[str] | None = None,
        wait_stream: int = 0,
    ) -> Completion:
        ids, address, n = _ids(block_ids)
        packed, count, length = _hashes(hashes)
        if count != n:
            raise InvalidArgumentError(f"save: {n} block ids but {count} hashes; expected equal lengths")
        layers = None if layer_names is None else "\n".join(layer_names).encode()
        out = c_int64()
        _bridge.api().call(
            "save", self._h(), instance_id.encode(), worker_rank, n, address, packed, length, layers, wait_stream,
            ctypes.byref(out),
        )
        return Completion(out.value)

    def query(self, instance_id: str, hashes: Sequence[bytes]) -> QueryResult:
        packed, count, length = _hashes(hashes)
        out = (c_int32 * 2)()
        lease = ctypes.create_string_buffer(LEASE_BYTES)
        _bridge.api().call("query", self._h(), instance_id.encode(), count, packed, length, out, lease)
        return QueryResult(out[0], lease.raw if out[0] > 0 else None, out[1])

    def load(self, instance_id: str, worker_rank: int, lease: bytes, dst_block_ids: Iterable[int]) -> Completion:
        ids, address, n = _ids(dst_block_ids)
        out = c_int64()
        _bridge.api().call("load", self._h(), instance_id.encode(), worker_rank, _lease(lease), n, address, ctypes.byref(out))
        return Completion(out.value)

    def release(self, instance_id: str, lease: bytes) -> None:
        """Drops a lease this instance got from ``query`` (another instance's is refused)."""
        _bridge.api().call("release", self._h(), instance_id.encode(), _lease(lease))

    def flush(self, timeout_ms: int = 5000) -> None:
        """The visibility barrier: every save started before it has ended and is visible to
        local and other hosts' queries (TimeoutError-like ``PegaflowError`` when not in time)."""
        _bridge.api().call("flush", self._h(), timeout_ms)

    def stats(self) -> dict[str, int]:
        return json.loads(text_out("stats", self._h()))

    def close(self) -> None:
        """Waits for copies in flight and frees the pool; later calls raise EngineClosedError."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            _bridge.api().call("engine_close", handle)

    def __enter__(self) -> PegaEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class EngineClient(PegaEngine):
    """The same operations, with pegaflow-server as the control plane (``endpoint`` is
    ``HOST:PORT``). This process maps the server's shared pool and does its own copies; each
    call to the server is bounded by ``deadline_s`` and an unreachable server raises
    ``ServerUnavailableError`` within it. Closing (or this process dying) ends the client's
    session: the server then releases its leases and unregisters its instances."""

    def __init__(
        self,
        endpoint: str = "127.0.0.1:50055",
        copy_threads: int = 2,
        transfer: str = "host",
        device: int = 0,
        deadline_s: float = 5.0,
    ):
        if transfer not in TRANSFERS:
            raise InvalidArgumentError(f"transfer '{transfer}'; expected one of {sorted(TRANSFERS)}")
        api = _bridge.api()
        out = c_int64()
        api.call(
            "engine_connect", endpoint.encode(), copy_threads, TRANSFERS[transfer], device, int(deadline_s * 1000),
            ctypes.byref(out),
        )
        self._handle = out.value
        self.endpoint = endpoint
        #: the server process this client talks to; it changes on every server start
        self.server_id = text_out("engine_server_id", self._handle)


def _regions(layers: Sequence[LayerRegion]) -> tuple[bytes, array.array]:
    """register_worker's layer arguments: the names ('\\n'-separated) and 7 int64 per layer
    (keep the array alive for the call)."""
    return "\n".join(layer.name for layer in layers).encode(), array.array("q", [v for layer in layers for v in layer.params()])


def text_out(name: str, handle: int, *args, size_hint: int = 8192) -> str:
    """Calls ``name(handle, *args, buf, cap, &len)`` (a text export that changes nothing) with a
    buffer that fits: one that was too small is called again with the size it asked for, and
    room to spare for text that grew between the calls."""
    api = _bridge.api()
    size = c_int32()
    buf = ctypes.create_string_buffer(size_hint)
    try:
        api.call(name, handle, *args, buf, len(buf), ctypes.byref(size))
    except InvalidArgumentError:
        if size.value < len(buf):
            raise
        buf = ctypes.create_string_buffer(size.value + 1 + size.value // 4)
        api.call(name, handle, *args, buf, len(buf), ctypes.byref(size))
    return buf.value.decode()


def _lease(lease: bytes) -> bytes:
    if not isinstance(lease, (bytes, bytearray)) or len(lease) != LEASE_BYTES:
        raise InvalidArgumentError(
            f"lease {lease!r:.60}; expected {LEASE_BYTES} bytes from PegaEngine.query"
        )
    return bytes(lease)


def noop() -> None:
    """One call across the boundary that does nothing (for the bridge benchmark)."""
    _bridge.api().call("noop")


def _int32s(tokens: Sequence[int]) -> tuple[bytes, int]:
    """The token ids as native 32-bit ints for the C ABI, and their count: ``struct.pack`` (a
    scheduling-step cost: a prompt's ids are packed at its first lookup; it packs a list faster
    than ``array.array``). An id out of range or not an integer is refused naming it."""
    tokens = tokens if isinstance(tokens, (list, tuple)) else list(tokens)
    try:
        return struct.pack(f"={len(tokens)}i", *tokens), len(tokens)
    except struct.error:
        bad = next((t for t in tokens if not isinstance(t, int) or not -(1 << 31) <= t < 1 << 31), None)
        raise InvalidArgumentError(f"token id {bad!r:.40}; expected integers from 0 to {(1 << 31) - 1}") from None


def vllm_block_hashes(tokens: Sequence[int], block_size: int, algo: str = "sha256", seed: str | None = None,
                      parent: bytes | None = None) -> list[bytes]:
    """vLLM's prefix-caching hashes of the full blocks of ``tokens`` (the engine's Java hasher,
    C ABI ``block_hashes``): what ``hash_block_tokens`` gives a request without extra keys,
    for vLLM's ``algo`` (sha256, sha256_cbor, xxhash, xxhash_cbor) and the ``seed`` its
    processes run with (``PYTHONHASHSEED``; None: vLLM's default, SHA-256 algorithms only)."""
    toks, n_tokens = _int32s(tokens)
    count, hash_len = ctypes.c_int32(), ctypes.c_int32()
    n = n_tokens // block_size if block_size > 0 else 0
    out = ctypes.create_string_buffer(max(1, n * 32))
    _bridge.api().call("block_hashes", algo.encode(), None if seed is None else seed.encode(), parent or b"",
                       len(parent or b""), toks, n_tokens, block_size, out, len(out),
                       ctypes.byref(count), ctypes.byref(hash_len))
    raw = out.raw
    return [raw[i * hash_len.value:(i + 1) * hash_len.value] for i in range(count.value)]


def tail_key(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The store's key of a prompt's partial last block (P/D's tail flow), derived in Java (C ABI
    ``tail_key``, ``VllmBlockHasher.tailKey``) from the last full block's key ``parent`` and the
    tail's token ids: the same on the prefill and the decode side."""
    toks, n_tokens = _int32s(tokens)
    out = ctypes.create_string_buffer(max(1, len(parent)))
    _bridge.api().call("tail_key", parent, len(parent), toks, n_tokens, out)
    return out.raw[: len(parent)]
