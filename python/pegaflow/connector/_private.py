"""A private pegaflow-server for one vLLM instance (``mode: auto`` across processes).

When vLLM runs its workers in processes other than the scheduler's (its multiprocessing
executor: tensor or pipeline parallelism, and always on the CPU platform), an embedded store
cannot serve both sides. If no server answers at the configured endpoint, the first process of
the instance to get here starts one for the instance, and every other process of it finds the
same one:

- rendezvous: ``<runtime dir>/auto-<key>.json`` (endpoint, pid), under an ``flock`` on
  ``auto-<key>.lock``; the key hashes the instance id, so two vLLM instances never share one;
  the runtime dir is ``$XDG_RUNTIME_DIR/pegaflow`` or ``/tmp/pegaflow-<uid>``, mode 0700;
- ownership: the server is started with ``--owner-pid`` (the starting process) and stops when
  that process exits; the starter also stops it at exit. Its pool, socket and token files live
  in ``/dev/shm`` (the pool is memory) and are removed by the server when it stops;
- the server's token is found as for any server (its Health names the 0600 token file).
"""

from __future__ import annotations

import atexit
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import socket
import tempfile
from pathlib import Path

from .settings import Settings

log = logging.getLogger("pegaflow.connector")

_started: list = []  # servers this process started (stopped at exit)


def runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(base) / "pegaflow" if base else Path(tempfile.gettempdir()) / f"pegaflow-{os.getuid()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_uid != os.getuid() or path.stat().st_mode & 0o077:
        raise PermissionError(f"{path} must belong to uid {os.getuid()} with mode 0700 (it holds server secrets); "
                              "fix or remove it")
    return path


# An HTTP/2 client's connection preface with an empty SETTINGS frame (RFC 9113 section 3.4).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def answers(endpoint: str, timeout: float = 2.0) -> bool:
    """Whether a gRPC server answers at HOST:PORT: it accepts the connection and replies to an
    HTTP/2 preface with its SETTINGS frame (the link then asks it for Health). Accepting TCP is
    not enough: another listener can hold the port (vLLM's own torch.distributed store and gloo
    take free ports too), and treating it as a server would serve without the cache for good."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(_H2_PREFACE)
            head = b""
            while len(head) < 9:
                chunk = s.recv(9 - len(head))
                if not chunk:
                    return False
                head += chunk
            return head[3] == 0x04  # frame type SETTINGS
    except (OSError, ValueError):
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def private_server(instance_id: str, pool_size: str, extra: list[str] | None = None) -> str:
    """The endpoint of instance ``instance_id``'s private server, started here when it has none."""
    from .._server import start_server

    key = hashlib.sha256(instance_id.encode()).hexdigest()[:16]
    root = runtime_dir()
    info = root / f"auto-{key}.json"
    with open(root / f"auto-{key}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if info.exists():
                known = json.loads(info.read_text())
                if _alive(int(known["pid"])) and answers(known["endpoint"]):
                    return known["endpoint"]
            shm = Path("/dev/shm")  # the pool is memory: tmpfs, not the disk under /tmp
            pool = shm / f"pegaflow-{os.getuid()}-auto-{key}.pool" if shm.is_dir() else root / f"auto-{key}.pool"
            server = start_server(pool, pool_size=pool_size, grace_ms=2000,
                                  extra=["--owner-pid", str(os.getpid()), *(extra or [])])
            tmp = info.with_suffix(".tmp")
            tmp.write_text(json.dumps({"endpoint": server.endpoint, "pid": server.proc.pid, "instance": instance_id}))
            os.chmod(tmp, 0o600)
            tmp.replace(info)
            _started.append((server, info))
            log.info("PegaKVConnector: no pegaflow-server answered, so this vLLM instance started its own at %s "
                     "(pid %d, pool %s); it stops with this process", server.endpoint, server.proc.pid, pool_size)
            return server.endpoint
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@atexit.register
def _stop_started() -> None:
    while _started:
        server, info = _started.pop()
        try:
            info.unlink(missing_ok=True)
            server.stop()
        except Exception as e:  # at exit: report, never raise
            log.debug("stopping the private pegaflow-server: %s", e)


def workers_elsewhere(vllm_config) -> str | None:
    """Why this instance's workers run in processes other than its scheduler's, or None when
    they share its process (vLLM's in-process executor)."""
    pc = vllm_config.parallel_config
    backend = pc.distributed_executor_backend
    name = backend if isinstance(backend, str) or backend is None else getattr(backend, "__name__", str(backend))
    if name in ("uni", "external_launcher"):
        return None
    tp, pp = int(pc.tensor_parallel_size), int(pc.pipeline_parallel_size)
    why = f"vLLM's executor is '{name}' (tensor_parallel_size={tp}, pipeline_parallel_size={pp})"
    if tp * pp == 1:
        why += ("; at TP = PP = 1 that is vLLM's choice for this platform or front end (the CPU platform always "
                "uses 'mp' unless VLLM_ENABLE_V1_MULTIPROCESSING=0)")
    return why


def resolve_settings(settings: Settings, vllm_config, instance_id: str) -> Settings:
    """The connector's mode, decided here alone (the store link takes ``embedded`` or ``server``):
    ``auto`` is the server at the endpoint when one answers, else, with the workers in this
    process, an embedded engine, and with them in other processes a private server this
    instance starts for itself. Embedded mode with the workers elsewhere is refused, naming the
    cause."""
    return resolve_mode(settings, workers_elsewhere(vllm_config), instance_id)


def resolve_mode(settings: Settings, elsewhere: str | None, instance_id: str = "") -> Settings:
    """``resolve_settings`` given why the workers run in other processes (None: they share this
    one); the settings as they are unless their mode is ``auto`` or ``embedded`` across processes."""
    if settings.mode == "auto" and elsewhere is None:
        if answers(settings.endpoint):
            return dataclasses.replace(settings, mode="server")
        log.info("PegaKVConnector: no pegaflow-server at %s: using an embedded engine (pool %s) in this process",
                 settings.endpoint, settings.pool_size)
        return dataclasses.replace(settings, mode="embedded")
    if elsewhere is None:
        return settings
    if settings.mode == "embedded":
        raise ValueError(
            f"PegaKVConnector mode 'embedded' keeps the cache inside one process, but {elsewhere}, so the workers of "
            f"instance '{instance_id}' run in their own processes. Use mode 'auto' (a private pegaflow-server is "
            "started for this instance when none answers) or 'server' with a running pegaflow-server"
        )
    if settings.mode == "auto":
        endpoint = settings.endpoint if answers(settings.endpoint) else private_server(
            instance_id, settings.pool_size, settings.ssd_flags())
        return dataclasses.replace(settings, mode="server", endpoint=endpoint)
    return settings
