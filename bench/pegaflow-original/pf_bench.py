#!/usr/bin/env python3
"""Standalone save/load benchmark of the ORIGINAL PegaFlow (pegaflow-llm-cu13 0.25.1).

Run on a CUDA machine (one GPU is enough):

    bash install.sh /tmp/pfsite            # unzip the wheel (no network needed)
    PYTHONPATH=/tmp/pfsite python3 pf_bench.py --json OUT.json

If `pegaflow` is not importable the script unzips the wheel lying next to it
into $TMPDIR/pfsite by itself.

Why one file past 600 lines: it is copied alone onto the GPU machine beside the original's
wheel and runs in that wheel's environment, with no import from this project.

What it does, mirroring PegaFlow's own vLLM connector (pegaflow/connector/worker.py):
  * starts `pegaflow-server-py` (the binary behind the `pegaflow-server` console
    script) in its own process group with pegaflow._bin_utils.binary_env(),
    --pool-size (default 60gb), --devices <gpu>, loopback addresses;
  * allocates Llama-3.1-8B shaped KV caches on cuda:0:
      - per-layer: 32 x [2, NB, 16, 8, 128] bf16 (KV-first; 32 KiB per K or V
        per block per layer, 2 MiB per block over all layers);
      - cross-layer: one int8 tensor [NB, 32, 64 KiB] (what vLLM's
        allocate_uniform_kv_caches hands to register_cross_layers_kv_cache;
        PegaFlow registers it as layer "ALL_LAYERS", blocks-first, 2 MiB/block);
  * registers them with EngineRpcClient.register_context_batch using pickled
    pegaflow.ipc_wrapper.CudaIPCWrapper handles (CUDA IPC), exactly like
    WorkerConnector.register_kv_caches;
  * per variant (layout x transfer_backend in {direct, kernel}) times
      save  = EngineRpcClient.save(...)  (returns after the D2H copy finished)
      load  = EngineRpcClient.load(...) + polling PyLoadState until ready
    for 2048 and 256 scattered (seeded random) block ids, fresh hashes per
    save, several reps (medians), and verifies the bytes that come back into
    other (zeroed) block ids;
  * measures the "line": 2 GiB pinned host <-> device copies with torch.

Always writes the JSON (incrementally, and from a watchdog on overrun).
GB/s here = 1e9 bytes/s.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import pickle
import random
import signal
import site
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
import zlib

T0 = time.time()
BLOCK_SIZE_TOKENS = 16
NUM_LAYERS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
ELEM = 2  # bf16
SEG_BYTES = BLOCK_SIZE_TOKENS * NUM_KV_HEADS * HEAD_DIM * ELEM  # 32 KiB (K or V, one layer)
BLOCK_BYTES = 2 * NUM_LAYERS * SEG_BYTES  # 2 MiB (all layers, K+V)
CROSS_KEY = "ALL_LAYERS"  # pegaflow.connector.worker._CROSS_LAYER_KEY

RESULT: dict = {"errors": []}
_OUT_PATH: str | None = None
_WRITE_LOCK = threading.Lock()
_SERVER: "ServerProc | None" = None


def log(msg: str) -> None:
    print(f"[pf_bench {time.time() - T0:7.1f}s] {msg}", flush=True)


def err(msg: str) -> None:
    log("ERROR: " + msg)
    RESULT["errors"].append(msg)
    write_json()


def write_json() -> None:
    if not _OUT_PATH:
        return
    with _WRITE_LOCK:
        RESULT["elapsed_s"] = round(time.time() - T0, 2)
        tmp = _OUT_PATH + ".tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(RESULT, f, indent=2, sort_keys=True, default=str)
            os.replace(tmp, _OUT_PATH)
        except Exception as e:  # never let reporting kill the run
            print(f"[pf_bench] could not write json: {e}", flush=True)


# ----------------------------------------------------------------------------
# pegaflow import (unzip the wheel next to this script if needed)
# ----------------------------------------------------------------------------


def import_pegaflow():
    try:
        import pegaflow.pegaflow  # noqa: F401
    except ImportError as first:
        here = os.path.dirname(os.path.abspath(__file__))
        tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
        wheels = sorted(glob.glob(os.path.join(here, f"pegaflow_llm_cu13-*-{tag}-*.whl")))
        if not wheels:
            raise ImportError(f"pegaflow not importable ({first}) and no {tag} wheel next to script")
        import zipfile

        dest = os.path.join(tempfile.gettempdir(), "pfsite")
        log(f"pegaflow not importable; unzipping {os.path.basename(wheels[-1])} into {dest}")
        with zipfile.ZipFile(wheels[-1]) as z:
            z.extractall(dest)
        for name in ("pegaflow-server-py", "pegaflow-metaserver-py"):
            p = os.path.join(dest, "pegaflow", name)
            if os.path.exists(p):
                os.chmod(p, 0o755)
        sys.path.insert(0, dest)
        os.environ["PYTHONPATH"] = dest + os.pathsep + os.environ.get("PYTHONPATH", "")
        for m in [m for m in sys.modules if m == "pegaflow" or m.startswith("pegaflow.")]:
            del sys.modules[m]
        import pegaflow.pegaflow  # noqa: F401
    import pegaflow
    import pegaflow.pegaflow as native
    return pegaflow, native


# ----------------------------------------------------------------------------
# Server process
# ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cuda_lib_dirs(cuda_major: int = 13) -> list[str]:
    """Dirs holding libcudart / libnvrtc for the server (cudarc dlopens them: the
    startup preflight needs a CUDA >= 13.0 runtime, the kernel backend compiles its
    copy kernel with NVRTC). Prefers the pip CUDA wheels torch uses. A shim dir with
    unversioned names (libcudart.so, libnvrtc.so) pointing at the matching major is
    put first, so an older toolkit's unversioned libcudart.so on the default
    LD_LIBRARY_PATH cannot win cudarc's name search."""
    dirs: list[str] = []
    roots = list(site.getsitepackages()) + [site.getusersitepackages()] + sys.path
    seen = set()
    for root in roots:
        if not root or root in seen or not os.path.isdir(root):
            continue
        seen.add(root)
        for pat in ("nvidia/cu*/lib", "nvidia/*/lib", "nvidia/*/lib64"):
            for d in sorted(glob.glob(os.path.join(root, pat))):
                if os.path.isdir(d) and d not in dirs:
                    dirs.append(d)
    shim = None
    for base in ("libcudart.so", "libnvrtc.so"):
        for d in dirs:
            hits = sorted(glob.glob(os.path.join(d, f"{base}.{cuda_major}*")))
            if hits:
                if shim is None:
                    shim = tempfile.mkdtemp(prefix="pfcudashim")
                for name in (base, f"{base}.{cuda_major}"):
                    link = os.path.join(shim, name)
                    if not os.path.exists(link):
                        os.symlink(hits[0], link)
                break
    if not dirs:
        for d in ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"):
            if os.path.isdir(d):
                dirs.append(d)
    return ([shim] if shim else []) + dirs


class ServerProc:
    def __init__(self, pegaflow_pkg, args, device_id: int, log_path: str):
        from pegaflow import _bin_utils

        self.port = args.port or free_port()
        self.http_port = args.http_port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.http = f"http://127.0.0.1:{self.http_port}"
        binary = _bin_utils.find_binary("pegaflow-server-py")
        if not os.path.isfile(binary):
            raise RuntimeError(f"pegaflow-server-py not found (got {binary!r})")
        if not os.access(binary, os.X_OK):
            try:
                os.chmod(binary, 0o755)
            except OSError:
                import shutil

                tmpbin = os.path.join(tempfile.mkdtemp(prefix="pfbin"), "pegaflow-server-py")
                shutil.copy2(binary, tmpbin)
                os.chmod(tmpbin, 0o755)
                binary = tmpbin
        # Same environment as the `pegaflow-server` console script
        # (pegaflow._server.main -> binary_env()), plus what PegaFlow's own test
        # harness (python/tests/conftest.py) adds for the embedded interpreter,
        # plus the CUDA runtime/NVRTC library dirs of the pip CUDA wheels.
        env = _bin_utils.binary_env()
        env.setdefault("PYO3_PYTHON", sys.executable)
        env.setdefault("PYTHONHOME", sys.base_prefix)
        extra_pp = [p for p in sys.path if p and os.path.isdir(p)]
        env["PYTHONPATH"] = os.pathsep.join(
            [env.get("PYTHONPATH", "")] + extra_pp
        ).strip(os.pathsep)
        try:
            import torch

            cuda_major = int(str(torch.version.cuda or "13").split(".")[0])
        except Exception:
            cuda_major = 13
        libdirs = cuda_lib_dirs(cuda_major)
        if libdirs:
            # shim + pip CUDA dirs first, then python LIBDIR (binary_env) and the rest
            env["LD_LIBRARY_PATH"] = os.pathsep.join(
                libdirs + [env.get("LD_LIBRARY_PATH", "")]
            ).strip(os.pathsep)
        if os.environ.get("CUDA_VISIBLE_DEVICES"):
            # The connector sends the *global* device id (see _resolve_device_id),
            # so the server must see all GPUs.
            env.pop("CUDA_VISIBLE_DEVICES", None)
        env.setdefault("RUST_BACKTRACE", "1")
        self.cmd = [
            binary,
            "--addr", f"127.0.0.1:{self.port}",
            "--http-addr", f"127.0.0.1:{self.http_port}",
            "--pool-size", args.pool_size,
            "--devices", str(device_id),
            "--log-level", args.server_log_level,
        ]
        self.log_path = log_path
        self._log = open(log_path, "wb")
        log("starting server: " + " ".join(self.cmd))
        RESULT["server_cmd"] = " ".join(self.cmd)
        RESULT["server_ld_library_path_extra"] = libdirs
        self.t_start = time.perf_counter()
        self.proc = subprocess.Popen(
            self.cmd,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=tempfile.gettempdir(),
            start_new_session=True,
        )

    def tail(self, n: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as f:
                data = f.read()[-20000:]
            return "\n".join(data.decode("utf-8", "replace").splitlines()[-n:])
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, native, timeout: float):
        deadline = time.perf_counter() + timeout
        last = None
        n = 0
        while time.perf_counter() < deadline:
            if not self.alive():
                raise RuntimeError(
                    f"server exited rc={self.proc.returncode} during startup; log tail:\n{self.tail()}"
                )
            try:
                client = native.EngineRpcClient(self.endpoint)
                ok, msg = client.health()
                if ok:
                    return client, time.perf_counter() - self.t_start
                last = msg
            except Exception as e:  # PegaFlowError: transport error while starting
                last = str(e)
            n += 1
            if n % 20 == 0:
                log(f"  waiting for server health ({time.perf_counter() - self.t_start:.0f}s): {last}")
            time.sleep(0.5)
        raise RuntimeError(f"server not healthy after {timeout:.0f}s (last: {last}); log tail:\n{self.tail()}")

    def cleanup_memory(self) -> str:
        """POST /cache/memory/cleanup: evict resident blocks (keeps runs independent)."""
        req = urllib.request.Request(self.http + "/cache/memory/cleanup", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read(400).decode("utf-8", "replace")

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except OSError:
                pass
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        try:
            self._log.close()
        except Exception:
            pass


def kill_server_now():
    s = _SERVER
    if s is not None and s.proc.poll() is None:
        try:
            os.killpg(s.proc.pid, signal.SIGKILL)
        except OSError:
            pass


# ----------------------------------------------------------------------------
# Helpers mirroring pegaflow.connector
# ----------------------------------------------------------------------------


def resolve_device_id(torch) -> int:
    """pegaflow.connector._resolve_device_id: global id under CUDA_VISIBLE_DEVICES."""
    local_id = torch.cuda.current_device()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return local_id
    slots = [s.strip() for s in visible.split(",") if s.strip()]
    try:
        return int(slots[local_id])
    except (IndexError, ValueError):
        return local_id


def infer_registration(t) -> tuple[int, int, int, int]:
    """pegaflow.connector.worker._infer_kv_cache_registration (non-MLA path).
    Returns (num_blocks, bytes_per_block, kv_stride_bytes, segments)."""
    shape, stride, el = tuple(t.shape), tuple(t.stride()), t.element_size()
    if len(shape) >= 2 and shape[0] == 2:  # KV-first
        return shape[1], stride[1] * el, stride[0] * el, 2
    return shape[0], stride[0] * el, 0, 1  # blocks-first


def register(client, CudaIPCWrapper, instance_id, namespace, device_id, layers: dict, backend: str):
    names, wrappers, nbs, bpbs, kvs, segs = [], [], [], [], [], []
    for name, t in layers.items():
        w = CudaIPCWrapper(t)
        names.append(name)
        wrappers.append(pickle.dumps(w))
        nb, bpb, kvst, sg = infer_registration(t)
        nbs.append(int(nb))
        bpbs.append(int(bpb))
        kvs.append(int(kvst))
        segs.append(int(sg))
    ok, msg = client.register_context_batch(
        instance_id,
        namespace,
        0,  # effective tp_rank
        0,  # pp_rank
        1,  # effective tp_size
        1,  # effective world_size
        int(device_id),
        names,
        wrappers,
        nbs,
        bpbs,
        kvs,
        segs,
        backend,
        False,  # page_first: only MLA uses it
        layer_group_ids=[0] * len(names),
    )
    if not ok:
        raise RuntimeError(f"register_context_batch failed: {msg}")
    return names, (nbs[0], bpbs[0], kvs[0], segs[0])


def make_hashes(tag: str, n: int) -> list[bytes]:
    return [hashlib.sha256(f"{tag}:{i}".encode()).digest() for i in range(n)]


def gbps(nbytes: int, seconds: float | None) -> float | None:
    if not seconds or seconds <= 0:
        return None
    return round(nbytes / seconds / 1e9, 3)


# ----------------------------------------------------------------------------
# Line (torch pinned <-> device)
# ----------------------------------------------------------------------------


def measure_line(torch, dev, nbytes: int, reps: int):
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    host.fill_(7)
    d = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    s = torch.cuda.Stream(device=dev)
    res = {}
    for name, fn in (
        ("h2d", lambda: d.copy_(host, non_blocking=True)),
        ("d2h", lambda: host.copy_(d, non_blocking=True)),
    ):
        times = []
        with torch.cuda.stream(s):
            for i in range(reps + 1):
                e0 = torch.cuda.Event(enable_timing=True)
                e1 = torch.cuda.Event(enable_timing=True)
                e0.record(s)
                fn()
                e1.record(s)
                e1.synchronize()
                if i > 0:  # first is warm-up
                    times.append(e0.elapsed_time(e1) / 1e3)
        res[name] = times
    del host, d
    torch.cuda.synchronize(dev)
    return res


# ----------------------------------------------------------------------------
# One variant (layout x backend)
# ----------------------------------------------------------------------------


class Variant:
    def __init__(self, name, layout, backend, layers: dict, dev, torch):
        self.name, self.layout, self.backend = name, layout, backend
        self.layers = layers
        self.dev = dev
        self.torch = torch

    # --- GPU-side helpers (outside the timed regions) ---
    def zero_blocks(self, idx):
        for t in self.layers.values():
            if self.layout == "perlayer":
                t.index_fill_(1, idx, 0)
            else:
                t.index_fill_(0, idx, 0)

    def verify(self, src, dst, chunk=256) -> bool:
        torch = self.torch
        for t in self.layers.values():
            if self.layout == "perlayer":
                v = t.view(torch.int16)  # bit-exact compare (bf16 NaN != NaN)
                for i in range(0, src.numel(), chunk):
                    if not torch.equal(
                        v.index_select(1, src[i:i + chunk]), v.index_select(1, dst[i:i + chunk])
                    ):
                        return False
            else:
                for i in range(0, src.numel(), chunk):
                    if not torch.equal(
                        t.index_select(0, src[i:i + chunk]), t.index_select(0, dst[i:i + chunk])
                    ):
                        return False
        torch.cuda.synchronize(self.dev)
        return True


def run_variant(args, native, client, server, CudaIPCWrapper, device_id, var: Variant, deadline):
    torch = var.torch
    name = var.name
    instance_id = f"pfbench-{name}-{os.getpid()}"
    namespace = f"pfbench-ns-{name}-{os.getpid()}-{int(time.time())}"
    t = time.perf_counter()
    layer_names, reg = register(client, CudaIPCWrapper, instance_id, namespace, device_id, var.layers, var.backend)
    reg_s = time.perf_counter() - t
    log(f"[{name}] registered {len(layer_names)} layer(s) backend={var.backend} "
        f"(num_blocks, bytes_per_block, kv_stride_bytes, segments)={reg} in {reg_s:.2f}s")
    RESULT.setdefault("details", {})[name] = det = {
        "register_s": round(reg_s, 3),
        "registration": {"layers": len(layer_names), "num_blocks": reg[0], "bytes_per_block": reg[1],
                         "kv_stride_bytes": reg[2], "segments": reg[3]},
    }
    layer_groups = [list(layer_names)]
    num_blocks = reg[0]
    rng = random.Random(args.seed * 1000003 + zlib.crc32(name.encode()))
    all_ok = True
    nonce = f"{os.getpid()}-{time.time_ns()}"

    def one_rep(n, rep_tag):
        nonlocal all_ok
        ids = rng.sample(range(1, num_blocks), 2 * n)  # block 0 is vLLM's null block
        src, dst = ids[:n], ids[n:]
        hashes = make_hashes(f"{nonce}:{name}:{rep_tag}", n)
        src_t = torch.tensor(src, dtype=torch.long, device=var.dev)
        dst_t = torch.tensor(dst, dtype=torch.long, device=var.dev)
        saves = [(ln, src, hashes) for ln in layer_names]
        torch.cuda.synchronize(var.dev)  # connector syncs before save
        t0 = time.perf_counter()
        ok, msg = client.save(instance_id, 0, 0, int(device_id), saves)
        t_save = time.perf_counter() - t0
        if not ok:
            raise RuntimeError(f"save failed: {msg}")
        # Inserts into the cache are asynchronous (insert worker); wait until
        # the whole prefix is visible, as the scheduler would see it.
        tq0 = time.perf_counter()
        lease = None
        last = None
        while time.perf_counter() - tq0 < args.query_timeout:
            tq = time.perf_counter()
            r = client.query_prefetch(instance_id, hashes, f"pfbench-{rep_tag}-{nonce}")
            tq = time.perf_counter() - tq
            if isinstance(r, native.QueryReady):
                last = r.num_hit_blocks
                if r.num_hit_blocks == n:
                    lease = r.lease
                    break
                if r.lease:
                    client.release(r.lease)
            else:
                last = "loading"
            time.sleep(0.002)
        if lease is None:
            raise RuntimeError(f"query never saw all {n} saved blocks (last hit={last})")
        t_visible = time.perf_counter() - tq0
        var.zero_blocks(dst_t)
        torch.cuda.synchronize(var.dev)
        state = native.PyLoadState()
        t0 = time.perf_counter()
        ok, msg = client.load(instance_id, 0, int(device_id), state.shm_name(), layer_groups,
                              [(lease, [dst])])
        if not ok:
            raise RuntimeError(f"load failed: {msg}")
        lim = t0 + args.load_timeout
        while not state.is_ready():
            if time.perf_counter() > lim:
                raise RuntimeError(f"load not ready after {args.load_timeout}s")
        t_load = time.perf_counter() - t0
        st = state.get_state()
        if st < 0:
            raise RuntimeError(f"load finished with error state {st}")
        good = var.verify(src_t, dst_t) if args.verify else None
        if good is False:
            all_ok = False
            err(f"[{name}] VERIFY FAILED n={n} rep={rep_tag}")
        return t_save, t_load, tq, t_visible, good

    try:
        # warm-up (not timed): first use spins up worker pools / streams
        try:
            ws, wl, _, _, wg = one_rep(args.warmup_blocks, "warmup")
            det["warmup"] = {"save_s": round(ws, 4), "load_s": round(wl, 4), "verified": wg}
            log(f"[{name}] warm-up {args.warmup_blocks} blocks: save {ws*1e3:.1f} ms load {wl*1e3:.1f} ms verified={wg}")
        except Exception as e:
            err(f"[{name}] warm-up failed: {e}")
            raise

        for n in args.sizes:
            saves, loads, queries, visible, oks = [], [], [], [], []
            for rep in range(args.reps):
                if time.time() > deadline:
                    err(f"[{name}] time budget exhausted at n={n} rep={rep}")
                    break
                try:
                    s, l, q, v, g = one_rep(n, f"n{n}r{rep}")
                except Exception as e:
                    err(f"[{name}] n={n} rep={rep}: {e}")
                    if server is not None and not server.alive():
                        raise RuntimeError(f"server died; tail:\n{server.tail()}")
                    continue
                saves.append(s); loads.append(l); queries.append(q); visible.append(v); oks.append(g)
                log(f"[{name}] n={n} rep={rep}: save {s*1e3:8.2f} ms ({gbps(n*BLOCK_BYTES, s)} GB/s)  "
                    f"load {l*1e3:8.2f} ms ({gbps(n*BLOCK_BYTES, l)} GB/s)  query {q*1e3:.2f} ms  verified={g}")
            suffix = "" if n == 2048 else f"_{n}"
            nbytes = n * BLOCK_BYTES
            if saves:
                ms, ml = statistics.median(saves), statistics.median(loads)
                RESULT[f"{name}_save_gbps{suffix}"] = gbps(nbytes, ms)
                RESULT[f"{name}_load_gbps{suffix}"] = gbps(nbytes, ml)
                det[f"n{n}"] = {
                    "bytes": nbytes,
                    "save_ms": [round(x * 1e3, 3) for x in saves],
                    "load_ms": [round(x * 1e3, 3) for x in loads],
                    "query_ms": [round(x * 1e3, 3) for x in queries],
                    "save_to_visible_ms": [round(x * 1e3, 3) for x in visible],
                    "save_ms_median": round(ms * 1e3, 3),
                    "load_ms_median": round(ml * 1e3, 3),
                    "verified": oks,
                }
            write_json()
    finally:
        try:
            ok, msg = client.unregister_context(instance_id)
            if not ok:
                err(f"[{name}] unregister_context: {msg}")
        except Exception as e:
            err(f"[{name}] unregister_context raised: {e}")
        try:
            det["cache_cleanup"] = server.cleanup_memory()
        except Exception as e:
            det["cache_cleanup"] = f"failed: {e}"
    return all_ok


# ----------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True, help="output JSON path")
    p.add_argument("--pool-size", default="60gb", help="server --pool-size (default 60gb)")
    p.add_argument("--num-blocks", type=int, default=8192, help="KV blocks per layer on the GPU")
    p.add_argument("--sizes", default="2048,256", help="blocks per save/load")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup-blocks", type=int, default=256)
    p.add_argument("--backends", default="direct,kernel")
    p.add_argument("--layouts", default="perlayer,crosslayer")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--no-verify", dest="verify", action="store_false")
    p.add_argument("--line-gib", type=float, default=2.0)
    p.add_argument("--line-reps", type=int, default=5)
    p.add_argument("--budget", type=float, default=300.0,
                   help="seconds; no new rep starts after this, watchdog hard-stops at budget+30s")
    p.add_argument("--server-start-timeout", type=float, default=150.0)
    p.add_argument("--query-timeout", type=float, default=20.0)
    p.add_argument("--load-timeout", type=float, default=30.0)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--http-port", type=int, default=0)
    p.add_argument("--server-log-level", default="info")
    a = p.parse_args()
    a.sizes = [int(x) for x in a.sizes.split(",") if x.strip()]
    a.backends = [x.strip() for x in a.backends.split(",") if x.strip()]
    a.layouts = [x.strip() for x in a.layouts.split(",") if x.strip()]
    return a


def watchdog(hard_deadline: float):
    while True:
        rem = hard_deadline - time.time()
        if rem <= 0:
            break
        time.sleep(min(rem, 1.0))
    try:
        RESULT["errors"].append(f"watchdog: hard time limit reached at {time.time() - T0:.0f}s; aborting")
        if _SERVER is not None:
            RESULT["server_log_tail"] = _SERVER.tail(60)
        finalize()
        write_json()
        print("[pf_bench] watchdog abort", flush=True)
    finally:
        kill_server_now()
        os._exit(3)


def finalize():
    best_s = [v for k, v in RESULT.items() if k.endswith("_save_gbps") and k.startswith(("perlayer", "crosslayer")) and v]
    best_l = [v for k, v in RESULT.items() if k.endswith("_load_gbps") and k.startswith(("perlayer", "crosslayer")) and v]
    RESULT["pegaflow_best_save_gbps"] = max(best_s) if best_s else None
    RESULT["pegaflow_best_load_gbps"] = max(best_l) if best_l else None


def main():
    global _OUT_PATH, _SERVER
    args = parse_args()
    _OUT_PATH = os.path.abspath(args.json)
    os.makedirs(os.path.dirname(_OUT_PATH) or ".", exist_ok=True)
    RESULT.update({
        "pegaflow_version": None, "line_h2d_gbps": None, "line_d2h_gbps": None,
        "pegaflow_best_save_gbps": None, "pegaflow_best_load_gbps": None,
        "server_start_s": None, "verified": None,
        "block_bytes": BLOCK_BYTES, "units": "GB/s = 1e9 bytes/s of KV payload (blocks x 2 MiB); medians over reps",
        "variants": {
            "perlayer_<backend>": "32 tensors [2, NB, 16, 8, 128] bf16 (KV-first), registered per layer "
                                  "(bytes_per_block=32 KiB, segments=2), as vLLM's default per-layer KV cache",
            "crosslayer_<backend>": "one int8 tensor [NB, 32, 65536] registered as 'ALL_LAYERS' "
                                    "(blocks-first, bytes_per_block=2 MiB), as vLLM's cross-layer KV cache",
            "backends": "transfer_backend passed to register_context_batch: direct (cuMemcpyAsync per "
                        "coalesced range) / kernel (one copy kernel over mapped pinned memory)",
            "save": "EngineRpcClient.save wall time (returns after the D2H copy)",
            "load": "EngineRpcClient.load + PyLoadState poll until ready (query_prefetch lease taken before)",
        },
        "args": {k: v for k, v in vars(args).items()},
    })
    for lay in args.layouts:
        for be in args.backends:
            for n in args.sizes:
                suffix = "" if n == 2048 else f"_{n}"
                RESULT.setdefault(f"{lay}_{be}_save_gbps{suffix}", None)
                RESULT.setdefault(f"{lay}_{be}_load_gbps{suffix}", None)
    write_json()
    deadline = T0 + args.budget
    threading.Thread(target=watchdog, args=(T0 + args.budget + 30,), daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *a: (RESULT["errors"].append("SIGTERM"), finalize(),
                                              write_json(), kill_server_now(), os._exit(4)))

    try:
        pegaflow_pkg, native = import_pegaflow()
        RESULT["pegaflow_version"] = getattr(native, "__version__", None) or pegaflow_pkg.__version__
        RESULT["pegaflow_path"] = os.path.dirname(pegaflow_pkg.__file__)
        log(f"pegaflow {RESULT['pegaflow_version']} from {RESULT['pegaflow_path']}")
        import torch

        from pegaflow.ipc_wrapper import CudaIPCWrapper  # same class the server unpickles

        RESULT["torch_version"] = torch.__version__
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA not available to torch")
        dev = torch.device("cuda:0")
        torch.cuda.set_device(dev)
        device_id = resolve_device_id(torch)
        RESULT["gpu"] = torch.cuda.get_device_name(dev)
        RESULT["device_id"] = device_id
        try:
            with open("/proc/meminfo") as f:
                mi = {l.split(":")[0]: int(l.split()[1]) * 1024 for l in f if l.split()[1:2]}
            RESULT["host_mem_total_gib"] = round(mi["MemTotal"] / 2**30, 1)
            RESULT["host_mem_available_gib"] = round(mi.get("MemAvailable", 0) / 2**30, 1)
        except Exception:
            pass

        # ---- line ----
        try:
            nbytes = int(args.line_gib * 2**30)
            line = measure_line(torch, dev, nbytes, args.line_reps)
            RESULT["line_h2d_gbps"] = gbps(nbytes, statistics.median(line["h2d"]))
            RESULT["line_d2h_gbps"] = gbps(nbytes, statistics.median(line["d2h"]))
            RESULT["line_detail_ms"] = {k: [round(x * 1e3, 3) for x in v] for k, v in line.items()}
            log(f"line: H2D {RESULT['line_h2d_gbps']} GB/s  D2H {RESULT['line_d2h_gbps']} GB/s")
        except Exception as e:
            err(f"line measurement failed: {e}")
        write_json()

        # ---- server ----
        try:  # keep the pinned pool feasible on this host (pool + ~24 GiB headroom)
            units = {"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}
            ps = args.pool_size.strip().lower()
            want = float(ps[:-2]) * units[ps[-2:]] if ps[-2:] in units else float(ps)
            avail = RESULT.get("host_mem_available_gib")
            if avail and want > (avail - 24) * 2**30:
                new_gb = max(4, int((avail - 24) * 2**30 / 1e9))
                note = f"pool {args.pool_size} > MemAvailable {avail} GiB - 24 GiB headroom; using {new_gb}gb"
                log("NOTE: " + note)
                RESULT.setdefault("notes", []).append(note)
                args.pool_size = f"{new_gb}gb"
        except Exception as e:
            log(f"pool size check skipped: {e}")
        RESULT["pool_size"] = args.pool_size
        log_path = _OUT_PATH + ".server.log"
        RESULT["server_log"] = log_path
        _SERVER = ServerProc(pegaflow_pkg, args, device_id, log_path)
        client, start_s = _SERVER.wait_ready(native, args.server_start_timeout)
        RESULT["server_start_s"] = round(start_s, 2)
        log(f"server healthy after {start_s:.2f}s at {_SERVER.endpoint}")
        write_json()

        # ---- KV caches ----
        g = torch.Generator(device=dev)
        g.manual_seed(args.seed)
        tensors = {}

        def get_layout(lay):
            if lay in tensors:
                return tensors[lay]
            t = time.perf_counter()
            if lay == "perlayer":
                d = {}
                for i in range(NUM_LAYERS):
                    x = torch.empty((2, args.num_blocks, BLOCK_SIZE_TOKENS, NUM_KV_HEADS, HEAD_DIM),
                                    dtype=torch.bfloat16, device=dev)
                    x.view(torch.int16).random_(generator=g)
                    d[f"model.layers.{i}.self_attn.attn"] = x
            elif lay == "crosslayer":
                x = torch.empty((args.num_blocks, NUM_LAYERS, BLOCK_BYTES // NUM_LAYERS),
                                dtype=torch.int8, device=dev)
                x.random_(generator=g)
                d = {CROSS_KEY: x}
            else:
                raise ValueError(f"unknown layout {lay}")
            torch.cuda.synchronize(dev)
            log(f"allocated+filled {lay} KV cache ({args.num_blocks} blocks, "
                f"{args.num_blocks * BLOCK_BYTES / 2**30:.1f} GiB) in {time.perf_counter() - t:.2f}s")
            tensors[lay] = d
            return d

        for lay in args.layouts:
            for be in args.backends:
                name = f"{lay}_{be}"
                if time.time() > deadline:
                    err(f"[{name}] skipped: time budget exhausted")
                    continue
                if not _SERVER.alive():
                    err(f"[{name}] skipped: server not running; tail:\n{_SERVER.tail()}")
                    continue
                try:
                    var = Variant(name, lay, be, get_layout(lay), dev, torch)
                    run_variant(args, native, client, _SERVER, CudaIPCWrapper, device_id, var, deadline)
                except Exception as e:
                    err(f"[{name}] failed: {e}")
                    log(traceback.format_exc())
                finally:
                    finalize()
                    write_json()
    except Exception as e:
        err(f"fatal: {e}")
        log(traceback.format_exc())
    finally:
        checks = [
            v for d in RESULT.get("details", {}).values() if isinstance(d, dict)
            for k, blk in d.items() if isinstance(blk, dict)
            for v in (blk.get("verified", []) if isinstance(blk.get("verified"), list) else [blk.get("verified")])
            if v is not None
        ]
        if checks:
            RESULT["verified"] = bool(all(checks))
        RESULT["verify_checks"] = len(checks)
        finalize()
        if _SERVER is not None:
            RESULT["server_log_tail"] = _SERVER.tail(40)
            try:
                _SERVER.stop()
            except Exception as e:
                RESULT["errors"].append(f"server stop: {e}")
        write_json()
        log(f"done; wrote {_OUT_PATH}")
        for k in sorted(RESULT):
            if k.endswith("gbps") or "_gbps_" in k or k in ("server_start_s", "verified", "pegaflow_version"):
                log(f"  {k} = {RESULT[k]}")
        if RESULT["errors"]:
            log(f"  errors: {len(RESULT['errors'])} (see json)")


if __name__ == "__main__":
    main()
