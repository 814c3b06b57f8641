"""Host-to-device copy rate by how the host memory was had and how the copy is cut, on one GPU:
``python -m pegaflow.bench.h2d_patterns --json OUT [--mib 1024]``. Stdlib and the CUDA driver
(``libcuda.so.1``) only: no torch, no JVM.

Why: a staged 8K load reaches the line only at about 97% and the copy engine's own loads of
scattered blocks at 91-92% (docs/benchmarks/README.md), while one large copy from the same pool
reaches it. Whether the rest is the pool's pages (4 KiB pages of ``/dev/shm`` in server mode,
transparent huge pages asked for in embedded mode, what the driver allocates for a
``cudaHostAlloc`` line) or the copy's shape (a layer of each block: 64 KiB rows 2 MiB apart) is
what this tells, each case beside the others in one process.

Memory (``--mib`` each, pinned with ``cuMemHostRegister`` unless the driver allocated it):
``host_alloc`` (``cuMemHostAlloc``: the line as ``torch`` measures it), ``anon_thp`` (anonymous,
``MADV_HUGEPAGE``: the embedded pool), ``anon_4k`` (anonymous, ``MADV_NOHUGEPAGE``), ``shm``
(a ``/dev/shm`` file mapped shared: the server-mode pool), ``hugetlb`` (``MAP_HUGETLB``, only
where the host has huge pages reserved). Shapes over the same bytes, as blocks of 2 MiB holding
32 layers of 64 KiB: ``one_copy`` (one call), ``blocks`` (one call per 2 MiB block),
``layers_pitched`` (one pitched call per layer: the block's 64 KiB rows 2 MiB apart, back to
back on the device: the staging's and the bounce path's shape), ``layers_rows_contiguous`` (the
same calls over rows that lie back to back in the host: the pitched call without the stride),
``pieces`` (one call per 64 KiB row). Each figure is the median of ``--repeat`` timed runs after
one untimed, in GB/s; the host's huge-page settings and what each mapping got are reported.

``--streams 1,2`` also times each shape with every call cut into N parts by rows (a plain
call by bytes), part k on stream k, so N of the GPU's copy engines share the link (keys
``<shape>_s<N>_gbps``): whether one engine's gaps between calls, or its rate, leave part of the
line unused that a second engine's copies would fill.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import statistics
import sys
import time
from pathlib import Path

BLOCK = 2 << 20
ROW = 64 << 10
MEMORIES = ("host_alloc", "anon_thp", "anon_4k", "shm", "hugetlb")
SHAPES = ("one_copy", "blocks", "layers_pitched", "layers_rows_contiguous", "pieces")
_MAP_HUGETLB = 0x40000


class _Memcpy2D(ctypes.Structure):
    _fields_ = [("srcXInBytes", ctypes.c_size_t), ("srcY", ctypes.c_size_t), ("srcMemoryType", ctypes.c_int),
                ("srcHost", ctypes.c_void_p), ("srcDevice", ctypes.c_uint64), ("srcArray", ctypes.c_void_p),
                ("srcPitch", ctypes.c_size_t), ("dstXInBytes", ctypes.c_size_t), ("dstY", ctypes.c_size_t),
                ("dstMemoryType", ctypes.c_int), ("dstHost", ctypes.c_void_p), ("dstDevice", ctypes.c_uint64),
                ("dstArray", ctypes.c_void_p), ("dstPitch", ctypes.c_size_t), ("WidthInBytes", ctypes.c_size_t),
                ("Height", ctypes.c_size_t)]


def plan(shape: str, nbytes: int) -> list[tuple[int, int, int, int, int]]:
    """The calls of ``shape`` over ``nbytes`` (whole 2 MiB blocks) as (host offset, device
    offset, row bytes, rows, host pitch); one row is one plain copy. Every byte once."""
    if nbytes <= 0 or nbytes % BLOCK:
        raise ValueError(f"{nbytes} bytes; expected a positive multiple of {BLOCK} (whole 2 MiB blocks)")
    blocks, layers = nbytes // BLOCK, BLOCK // ROW
    if shape == "one_copy":
        return [(0, 0, nbytes, 1, nbytes)]
    if shape == "blocks":
        return [(b * BLOCK, b * BLOCK, BLOCK, 1, BLOCK) for b in range(blocks)]
    if shape == "layers_pitched":  # layer l of every block, rows BLOCK apart in the host, back to back on the device
        return [(l * ROW, l * blocks * ROW, ROW, blocks, BLOCK) for l in range(layers)]
    if shape == "layers_rows_contiguous":  # the same calls over rows that lie back to back in the host
        return [(l * blocks * ROW, l * blocks * ROW, ROW, blocks, ROW) for l in range(layers)]
    if shape == "pieces":
        return [(i * ROW, i * ROW, ROW, 1, ROW) for i in range(nbytes // ROW)]
    raise ValueError(f"shape {shape!r}; expected one of {', '.join(SHAPES)}")


def split(h: int, d: int, width: int, rows: int, pitch: int, parts: int) -> list[tuple[int, int, int, int]]:
    """One call (host offset, device offset, row bytes, rows; host rows ``pitch`` apart, device
    rows back to back) cut into at most ``parts`` calls over the same bytes: by rows where it has
    several, else by bytes (in 4 KiB multiples), as (host offset, device offset, row bytes, rows)."""
    if parts <= 1:
        return [(h, d, width, rows)]
    out = []
    if rows > 1:
        step = -(-rows // parts)
        for r in range(0, rows, step):
            n = min(step, rows - r)
            out.append((h + r * pitch, d + r * width, width, n))
        return out
    step = (-(-width // parts) + 4095) // 4096 * 4096 if width >= parts * 4096 else width
    for o in range(0, width, step):
        out.append((h + o, d + o, min(step, width - o), 1))
    return out


class _Driver:
    def __init__(self, device: int):
        try:
            self.cu = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise SystemExit(f"h2d_patterns: no CUDA driver here (libcuda.so.1: {e}); run it on the GPU machine")
        self.check("cuInit", 0)
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self.check("cuDeviceGet", ctypes.byref(dev), device)
        self.check("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        self.check("cuCtxSetCurrent", ctx)
        name = ctypes.create_string_buffer(256)
        self.check("cuDeviceGetName", name, 256, dev)
        self.name = name.value.decode()
        self.streams: list = []
        self.stream = self.stream_at(0)

    def stream_at(self, k: int):
        while len(self.streams) <= k:
            s = ctypes.c_void_p()
            self.check("cuStreamCreate", ctypes.byref(s), 1)  # CU_STREAM_NON_BLOCKING
            self.streams.append(s)
        return self.streams[k]

    def check(self, fn: str, *args) -> None:
        rc = getattr(self.cu, fn)(*args)
        if rc != 0:
            raise RuntimeError(f"{fn} failed with CUresult {rc}")

    def copy(self, calls, host: int, dev: int, streams: int = 1) -> None:
        m = _Memcpy2D()
        m.srcMemoryType, m.dstMemoryType = 1, 2  # CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE
        for h, d, width, rows, pitch in calls:
            for k, (h2, d2, w2, r2) in enumerate(split(h, d, width, rows, pitch, streams)):
                stream = self.stream_at(k)
                if r2 == 1:
                    self.check("cuMemcpyHtoDAsync_v2", ctypes.c_uint64(dev + d2), ctypes.c_void_p(host + h2),
                               ctypes.c_size_t(w2), stream)
                else:
                    m.srcHost, m.srcPitch, m.dstDevice, m.dstPitch = host + h2, pitch, dev + d2, w2
                    m.WidthInBytes, m.Height = w2, r2
                    self.check("cuMemcpy2DAsync_v2", ctypes.byref(m), stream)

    def sync(self) -> None:
        for s in self.streams:
            self.check("cuStreamSynchronize", s)


def _huge_kib() -> dict:
    out = {}
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            key = line.split(":")[0]
            if key in ("AnonHugePages", "ShmemPmdMapped", "FilePmdMapped", "Shared_Hugetlb", "Private_Hugetlb"):
                out[key] = int(line.split()[1])
    except OSError:
        pass
    return out


def host_settings() -> dict:
    out = {}
    for name in ("enabled", "shmem_enabled", "defrag"):
        try:
            out[f"thp_{name}"] = Path(f"/sys/kernel/mm/transparent_hugepage/{name}").read_text().strip()
        except OSError as e:
            out[f"thp_{name}"] = f"unreadable: {e.strerror}"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(("HugePages_Total", "HugePages_Free", "Hugepagesize")):
                out[line.split(":")[0]] = line.split(":")[1].strip()
    except OSError:
        pass
    return out


def _reserved_huge_bytes() -> int:
    """Free bytes of the host's reserved huge pages (/proc/meminfo), 0 where it says nothing."""
    info = host_settings()
    try:
        return int(info.get("HugePages_Free", "0")) * int(info.get("Hugepagesize", "0 kB").split()[0]) * 1024
    except ValueError:
        return 0


def _map(kind: str, nbytes: int, drv: _Driver):
    """(address, release, how it is pinned) of ``nbytes`` of ``kind``, touched and pinned."""
    if kind == "host_alloc":
        p = ctypes.c_void_p()
        drv.check("cuMemHostAlloc", ctypes.byref(p), ctypes.c_size_t(nbytes), 0)
        return p.value, lambda: drv.check("cuMemFreeHost", p), "cuMemHostAlloc"
    path = None
    if kind == "shm":
        path = f"/dev/shm/pegaflow-h2d-{os.getpid()}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            m = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)
    else:
        if kind == "hugetlb" and _reserved_huge_bytes() < nbytes:
            raise ValueError(f"{_reserved_huge_bytes()} bytes of huge pages free; {nbytes} needed (none reserved: root's to do)")
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (_MAP_HUGETLB if kind == "hugetlb" else 0)
        m = mmap.mmap(-1, nbytes, flags=flags)
        if kind in ("anon_thp", "anon_4k"):
            m.madvise(mmap.MADV_HUGEPAGE if kind == "anon_thp" else mmap.MADV_NOHUGEPAGE)
    view = [(ctypes.c_char * nbytes).from_buffer(m)]  # the only reference: dropped before the mapping closes
    addr = ctypes.addressof(view[0])
    ctypes.memset(addr, 1, nbytes)  # touched, as a pool is before it is pinned
    drv.check("cuMemHostRegister_v2", ctypes.c_void_p(addr), ctypes.c_size_t(nbytes), 1)  # PORTABLE

    def release():
        drv.check("cuMemHostUnregister", ctypes.c_void_p(addr))
        view.clear()
        m.close()
        if path:
            os.unlink(path)

    return addr, release, "cuMemHostRegister"


def measure(drv: _Driver, kind: str, nbytes: int, dev: int, repeat: int, streams: tuple[int, ...] = (1,)) -> dict:
    before = _huge_kib()
    try:
        host, release, pinned = _map(kind, nbytes, drv)
    except (OSError, RuntimeError, ValueError) as e:
        return {"skipped": f"{type(e).__name__}: {e}"}
    try:
        got = {k: v - before.get(k, 0) for k, v in _huge_kib().items() if v - before.get(k, 0)}
        row = {"pinned_by": pinned, "huge_kib_mapped": got}
        for n in streams:
            for shape in SHAPES:
                calls = plan(shape, nbytes)
                times = []
                for r in range(repeat + 1):
                    t = time.perf_counter()
                    drv.copy(calls, host, dev, n)
                    drv.sync()
                    if r:
                        times.append(time.perf_counter() - t)
                row[f"{shape}{'' if n == 1 else f'_s{n}'}_gbps"] = round(nbytes / statistics.median(times) / 1e9, 2)
        row["calls"] = {shape: len(plan(shape, nbytes)) for shape in SHAPES}
        return row
    finally:
        release()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pegaflow.bench.h2d_patterns", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--mib", type=int, default=1024, help="bytes of each memory, MiB (a multiple of 2)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--memories", default=",".join(MEMORIES))
    ap.add_argument("--streams", default="1", help="comma-separated stream counts each shape is timed with (1: one stream)")
    args = ap.parse_args(argv)
    try:
        streams = tuple(int(x) for x in args.streams.split(",") if x)
    except ValueError:
        streams = ()
    if not streams or any(n < 1 or n > 8 for n in streams):
        raise SystemExit(f"h2d_patterns: --streams {args.streams}; expected comma-separated counts from 1 to 8")
    if args.mib <= 0 or args.mib % 2:
        raise SystemExit(f"h2d_patterns: --mib {args.mib}; expected a positive multiple of 2 (whole 2 MiB blocks)")
    if args.repeat < 1:
        raise SystemExit(f"h2d_patterns: --repeat {args.repeat}; expected 1 or more")
    kinds = [k for k in args.memories.split(",") if k]
    unknown = [k for k in kinds if k not in MEMORIES]
    if unknown:
        raise SystemExit(f"h2d_patterns: --memories {','.join(unknown)}; expected some of {','.join(MEMORIES)}")
    nbytes = args.mib << 20
    drv = _Driver(args.device)
    dev = ctypes.c_uint64()
    drv.check("cuMemAlloc_v2", ctypes.byref(dev), ctypes.c_size_t(nbytes))
    try:
        report = {"gpu": drv.name, "bytes": nbytes, "repeat": args.repeat, "host": host_settings(),
                  "streams": list(streams),
                  "memories": {k: measure(drv, k, nbytes, dev.value, args.repeat, streams) for k in kinds}}
    finally:
        drv.check("cuMemFree_v2", dev)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
