"""Where the store lives for each executor layout (``connector._private``, the one place the
mode is decided), without vLLM: in-process executors turn ``auto`` into server mode when a
server answers, else embedded; multiprocess ones turn it into server mode (the configured
server when it answers, else a private one) and refuse ``embedded``, naming the executor."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
from types import SimpleNamespace

import pytest

from pegaflow.connector import _private
from pegaflow.connector.settings import Settings


def config(backend, tp=1, pp=1):
    return SimpleNamespace(parallel_config=SimpleNamespace(distributed_executor_backend=backend,
                                                           tensor_parallel_size=tp, pipeline_parallel_size=pp))


@pytest.mark.parametrize("backend", ["uni", "external_launcher"])
def test_in_process_executors_decide_auto_and_keep_explicit_modes(backend):
    assert _private.workers_elsewhere(config(backend)) is None
    closed = Settings(mode="auto", endpoint="127.0.0.1:1")
    assert _private.resolve_settings(closed, config(backend), "i").mode == "embedded", "no server: embedded"
    for mode in ("embedded", "server"):
        s = Settings(mode=mode, endpoint="127.0.0.1:1")
        assert _private.resolve_settings(s, config(backend), "i") is s


@pytest.mark.parametrize("backend,tp", [("mp", 1), ("mp", 2), ("ray", 4)])
def test_embedded_across_processes_is_refused_naming_the_executor(backend, tp):
    with pytest.raises(ValueError) as e:
        _private.resolve_settings(Settings(mode="embedded"), config(backend, tp), "inst")
    text = str(e.value)
    assert f"executor is '{backend}'" in text and f"tensor_parallel_size={tp}" in text and "'inst'" in text
    assert ("CPU platform" in text) == (tp == 1)  # at TP = 1 the cause is vLLM's choice, not parallelism


class Listener:
    """A TCP listener on a free loopback port; ``settings_frame``: it answers a connection the
    way an HTTP/2 (gRPC) server does, with a SETTINGS frame; else it accepts and stays silent,
    as another service on the port (vLLM's torch.distributed store, gloo) would."""

    def __init__(self, settings_frame: bool):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.endpoint = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.settings_frame = settings_frame
        self.accepted = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)
            if self.settings_frame:
                conn.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")

    def close(self):
        self.sock.close()
        for c in self.accepted:
            c.close()


@pytest.mark.parametrize("backend", ["mp", "uni"])
def test_auto_uses_a_grpc_server_that_answers_in_or_across_processes(backend):
    listener = Listener(settings_frame=True)
    try:
        resolved = _private.resolve_settings(Settings(mode="auto", endpoint=listener.endpoint), config(backend), "i")
    finally:
        listener.close()
    assert (resolved.mode, resolved.endpoint) == ("server", listener.endpoint)


def test_auto_across_processes_treats_another_service_on_the_port_as_no_server(monkeypatch, tmp_path):
    """Accepting TCP is not being a server: the instance starts its own instead of waiting for good."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(_private, "private_server", lambda instance_id, pool_size, extra=None: "127.0.0.1:4242")
    listener = Listener(settings_frame=False)
    try:
        assert not _private.answers(listener.endpoint, timeout=0.3)
        resolved = _private.resolve_settings(Settings(mode="auto", endpoint=listener.endpoint), config("mp"), "i")
    finally:
        listener.close()
    assert (resolved.mode, resolved.endpoint) == ("server", "127.0.0.1:4242")


def test_server_mode_is_kept_across_processes():
    s = Settings(mode="server", endpoint="127.0.0.1:1")
    assert _private.resolve_settings(s, config("mp"), "i") is s


def test_auto_across_processes_without_a_server_starts_a_private_one(monkeypatch, tmp_path):
    started = []
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))

    def fake_private(instance_id, pool_size, extra=None):
        started.append((instance_id, pool_size, extra))
        return "127.0.0.1:4242"

    monkeypatch.setattr(_private, "private_server", fake_private)
    resolved = _private.resolve_settings(Settings(mode="auto", endpoint="127.0.0.1:1", pool_size="64mb"),
                                         config("mp"), "inst")
    assert (resolved.mode, resolved.endpoint) == ("server", "127.0.0.1:4242")
    assert started == [("inst", "64mb", [])]
    # an SSD tier in the settings becomes the private server's flags
    _private.resolve_settings(Settings(mode="auto", endpoint="127.0.0.1:1", pool_size="64mb",
                                       ssd_cache_paths=("/nvme/pf",), ssd_cache_capacity="10gb"), config("mp"), "inst2")
    assert started[-1] == ("inst2", "64mb", ["--ssd-cache-path=/nvme/pf", "--ssd-cache-capacity=10gb"])


def test_the_runtime_dir_is_private(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    path = _private.runtime_dir()
    assert path == tmp_path / "pegaflow" and (path.stat().st_mode & 0o777) == 0o700
    os.chmod(path, 0o755)
    with pytest.raises(PermissionError, match="0700"):
        _private.runtime_dir()


def test_a_live_recorded_server_is_reused_not_restarted(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    root = _private.runtime_dir()
    listener = Listener(settings_frame=True)
    try:
        key = hashlib.sha256(b"inst").hexdigest()[:16]
        (root / f"auto-{key}.json").write_text(json.dumps({"endpoint": listener.endpoint, "pid": os.getpid()}))
        assert _private.private_server("inst", "32mb") == listener.endpoint
    finally:
        listener.close()
