"""This process's handle on its store link.

The link itself is Java (``io.pegaflow.client.StoreLink``): it owns the mode, the embedded
engine or the pegaflow-server client, every registration and the reconnects (detach while
the server does not answer, re-attach, replay registrations on a restarted server, register
again an instance the server forgot), checked by a Java thread every ``health_interval_s``.
One link per process and settings, shared by the scheduler-side and worker-side connectors
living there; they are created on it and read its current engine at every call.
"""

from __future__ import annotations

import ctypes
import json
import threading
from collections.abc import Sequence
from ctypes import c_int64

from .. import _bridge
from ..engine import TRANSFERS, LayerRegion, _regions, text_out
from .settings import Settings

__all__ = ["Link", "Settings", "close_all", "link_for"]


class Link:
    """This process's store link for one set of settings (a handle on the Java object)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._api = _bridge.api()
        out = c_int64()
        self._api.call("link_open", settings.mode.encode(), settings.endpoint.encode(), settings.pool_size.encode(),
                       settings.copy_threads, settings.deadline_ms, int(settings.health_interval_s * 1000),
                       settings.ssd_lines(), ctypes.byref(out))
        self.handle: int = out.value
        self.mode: str = self.status()["mode"]  # embedded | server

    def status(self) -> dict[str, str]:
        """mode, generation, detached, engine, server_id, registrations (as text)."""
        return dict(line.split("=", 1) for line in text_out("link_status", self.handle).splitlines())

    def stats(self) -> dict[str, int]:
        """The bound store's counters (the server's in server mode)."""
        return json.loads(text_out("link_stats", self.handle))

    def register_worker(self, instance_id: str, namespace: str, tp_size: int, world_size: int, worker_rank: int,
                        tp_rank: int, regions: list[LayerRegion], transfer: str, device: int) -> None:
        names, params = _regions(regions)
        self._api.call("link_register_worker", self.handle, instance_id.encode(), namespace.encode(), tp_size,
                       world_size, worker_rank, tp_rank, TRANSFERS[transfer], device, len(regions), names,
                       params.buffer_info()[0])

    def unregister_instance(self, instance_id: str) -> None:
        self._api.call("link_unregister_instance", self.handle, instance_id.encode())

    def reset_cache(self, instance_id: str) -> tuple[int, int]:
        """vLLM's reset_cache on the bound store: (blocks dropped from the pool, SSD records forgotten)."""
        out = (c_int64 * 2)()
        self._api.call("link_reset_cache", self.handle, instance_id.encode(), out)
        return out[0], out[1]

    def kv_events(self, instance_id: str, after: int, max_events: int, size_hint: int = 65536) -> str:
        """The bound store's block events of the instance's namespace after ``after``, as
        ``link_kv_events``'s text (``_events.parse``)."""
        return text_out("link_kv_events", self.handle, instance_id.encode(), after, max_events, size_hint=size_hint)

    def demote(self, instance_id: str, hashes: Sequence[bytes]) -> int:
        """A request's retention hint "low": these blocks go first when the pool needs room; how
        many the store held."""
        if not hashes:
            return 0
        length = len(hashes[0])
        out = ctypes.c_int32()
        self._api.call("link_demote", self.handle, instance_id.encode(), b"".join(hashes), len(hashes), length,
                       ctypes.byref(out))
        return out.value

    def close(self) -> None:
        handle, self.handle = self.handle, 0
        if handle:
            self._api.call("link_close", handle)


_links: dict[tuple, Link] = {}
_links_lock = threading.Lock()


def link_for(settings: Settings) -> Link:
    """This process's link for ``settings`` (created on first use; ``auto`` decided by
    ``_private.resolve_mode`` as for an in-process executor)."""
    key = (settings.mode, settings.endpoint, settings.pool_size, settings.ssd_cache_paths, settings.ssd_cache_capacity)
    with _links_lock:
        if key not in _links:
            if settings.mode == "auto":
                from . import _private

                settings = _private.resolve_mode(settings, None)
            _links[key] = Link(settings)
        return _links[key]


def close_all() -> None:
    with _links_lock:
        for link in _links.values():
            link.close()
        _links.clear()
