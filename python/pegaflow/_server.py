"""Starting pegaflow-server as a child process and waiting for it to be ready (tests, ``pegaflow-bench rpc``)."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Server:
    proc: subprocess.Popen
    grpc_port: int
    http_port: int
    pool_path: Path
    start_seconds: float
    log: collections.deque = field(default_factory=lambda: collections.deque(maxlen=200))
    netns: str | None = None  # the network namespace it runs in (the cluster tier's hosts)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def token(self) -> str:
        """The server's secret (the 0600 file it wrote beside the pool)."""
        return Path(f"{self.pool_path}.token").read_text().strip()

    def http(self, path: str, authorized: bool = False) -> tuple[int, str]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.http_port}{path}")
        if authorized:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with in_netns(self.netns):
                with urllib.request.urlopen(request, timeout=5) as r:
                    return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    @property
    def operator_token(self) -> str:
        """The operator's secret (Shutdown, /admin): ``<pool>.operator-token``, 0600."""
        return Path(f"{self.pool_path}.operator-token").read_text().strip()

    def admin(self, path: str, body: dict | bytes | None = None, token: str | None = "operator") -> tuple[int, dict]:
        """An operator's call: ``GET /admin/<path>`` without a body, else a POST of ``body`` (a dict
        is sent as JSON); ``token`` "operator" (default), "tenant", None or a literal. The status and
        the JSON answer."""
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.http_port}/admin/{path}", data=data,
                                         method="GET" if data is None else "POST")
        secret = {"operator": self.operator_token, "tenant": self.token}.get(token, token) if token else None
        if secret:
            request.add_header("Authorization", f"Bearer {secret}")
        try:
            with in_netns(self.netns):
                with urllib.request.urlopen(request, timeout=10) as r:
                    return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def instances(self) -> list[str]:
        """Instance ids (asked with the token; without it the server shows their hashes)."""
        return json.loads(self.http("/instances", authorized=True)[1])["instances"]

    def metric(self, name: str) -> float:
        for line in self.http("/metrics")[1].splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def stop(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            if kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            self.proc.wait(timeout=30)


@contextlib.contextmanager
def in_netns(name: str | None):
    """Runs the block with this thread in network namespace ``name`` (``ip netns``; None: where it
    is). Sockets made inside stay in that namespace; the thread comes back when the block ends."""
    if name is None:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    clone_newnet = 0x40000000
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(target, clone_newnet) != 0:
            raise OSError(ctypes.get_errno(), f"setns into network namespace {name}")
        try:
            yield
        finally:
            if libc.setns(home, clone_newnet) != 0:
                raise OSError(ctypes.get_errno(), "setns back to this thread's network namespace")
    finally:
        os.close(target)
        os.close(home)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_argv(pool_path: Path, grpc_port: int = 0, pool_size: str = "32mb", grace_ms: int = 500,
                extra: list[str] | None = None) -> list[str]:
    """The ``pegaflow-server`` command line of this environment; a server's pool, socket and lock
    files live at ``pool_path`` (+ ``.sock``, ``.lock``, ``.token``), so servers running together need their own."""
    script = Path(sys.executable).parent / "pegaflow-server"
    # without the console script (the package on PYTHONPATH, e.g. the GPU machine): the same entry point
    launcher = [str(script)] if script.exists() else [sys.executable, "-c",
                                                       "import sys; from pegaflow.cli import server_main; sys.exit(server_main())"]
    return [*launcher, "--addr", f"127.0.0.1:{grpc_port}", "--http-addr", "127.0.0.1:0", "--pool-size", pool_size,
            "--pool-path", str(pool_path), "--session-grace-ms", str(grace_ms), *(extra or [])]


def start_server(pool_path: Path, grpc_port: int = 0, pool_size: str = "32mb", grace_ms: int = 500,
                 extra: list[str] | None = None, netns: str | None = None) -> Server:
    start = time.perf_counter()
    proc = subprocess.Popen(
        (["ip", "netns", "exec", netns] if netns else []) + server_argv(pool_path, grpc_port, pool_size, grace_ms, extra),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines = []
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("pegaflow-server exited before it was ready:\n" + "".join(lines))
        lines.append(line)
        m = re.search(r"ready grpc=127\.0\.0\.1:(\d+) http=127\.0\.0\.1:(\d+)", line)
        if m:
            server = Server(proc, int(m.group(1)), int(m.group(2)), pool_path, time.perf_counter() - start, netns=netns)
            server.log.extend(lines)
            # keep reading its output so a chatty server never blocks on a full pipe
            threading.Thread(target=_drain, args=(proc, server.log), daemon=True).start()
            return server
        if time.perf_counter() - start > 30:
            proc.kill()
            raise RuntimeError("pegaflow-server not ready after 30 s:\n" + "".join(lines))


def _drain(proc: subprocess.Popen, log: collections.deque) -> None:
    for line in proc.stdout:
        log.append(line)
