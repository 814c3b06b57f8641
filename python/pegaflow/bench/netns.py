"""Hosts made of network namespaces on one machine (root): each gets an address on a bridge in
a namespace of its own, so traffic runs only between them. Used by the cluster tier and
``pegaflow-bench cluster``; everything made is removed on exit."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


@contextlib.contextmanager
def hosts(addrs: dict[str, str], prefix: str | None = None):
    """Yields ``{host: namespace}`` for hosts named by ``addrs`` ({host: "10.77.0.1"}, one /24)."""
    prefix = prefix or f"pf{os.getpid() % 100000}"
    switch = f"{prefix}-sw"
    made = []
    try:
        _sh("ip", "netns", "add", switch)
        made.append(switch)
        _sh("ip", "netns", "exec", switch, "ip", "link", "add", "br0", "type", "bridge")
        _sh("ip", "netns", "exec", switch, "ip", "link", "set", "br0", "up")
        names = {}
        for host, addr in addrs.items():
            ns, link = f"{prefix}-{host}", f"{prefix}{host}"
            _sh("ip", "netns", "add", ns)
            made.append(ns)
            _sh("ip", "link", "add", link, "type", "veth", "peer", "name", link + "s")
            _sh("ip", "link", "set", link, "netns", ns)
            _sh("ip", "link", "set", link + "s", "netns", switch)
            _sh("ip", "netns", "exec", switch, "ip", "link", "set", link + "s", "master", "br0", "up")
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", link)
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", link, "up")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            names[host] = ns
        yield names
    finally:
        for name in reversed(made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)  # removes its links too


def redis_server(ns: str, addr: str, port: int, workdir: Path | None = None, timeout: float = 10.0) -> subprocess.Popen:
    """Starts redis-server (no persistence) in namespace ``ns`` on ``addr:port`` and returns once
    it accepts connections; the caller kills it."""
    from pegaflow._server import in_netns

    argv = ["ip", "netns", "exec", ns, shutil.which("redis-server") or "redis-server", "--bind", addr, "--port", str(port),
            "--save", "", "--appendonly", "no", "--protected-mode", "no"]
    if workdir is not None:
        argv += ["--dir", str(workdir)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with in_netns(ns), socket.create_connection((addr, port), timeout=1):
                return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"redis-server in {ns} on {addr}:{port} did not start (exit {proc.poll()})")
            time.sleep(0.05)
