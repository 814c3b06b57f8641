"""Settings and the per-process link to the store (embedded engine or pegaflow-server).

One :class:`Link` per process and settings, shared by the scheduler-side and worker-side
connectors living there (vLLM runs both in the engine-core process when TP=1). The link owns
the engine handle, remembers what was registered, and in server mode watches the server: when
it stops answering, the connectors are pointed at no engine (lookups miss at once, loads
fail so vLLM recomputes); when it answers again (the same process or a restarted one with a
new pool file), a fresh client maps the pool, replays the registrations and the connectors
are pointed at it. A stale client can never touch a restarted server's pool: the restarted
server does not know the instance until this process registers it again through the new
client.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field

from .. import _bridge
from ..engine import EngineClient, LayerRegion, PegaEngine
from ..errors import InvalidArgumentError, PegaflowError, ServerUnavailableError

log = logging.getLogger("pegaflow.connector")

MODES = ("auto", "embedded", "server")
DEFAULT_ENDPOINT = "127.0.0.1:50055"
_KEYS = {
    "mode": "auto | embedded | server (default auto: server when one answers, else embedded)",
    "endpoint": f"HOST:PORT of pegaflow-server (default {DEFAULT_ENDPOINT}, env PEGAFLOW_ENDPOINT)",
    "namespace": "cache namespace override (default: derived from model, dtype, block size, layout, TP)",
    "pool_size": "embedded mode's host pool, e.g. 30gb (default 8gb, env PEGAFLOW_POOL_SIZE)",
    "copy_threads": "threads copying between the pool and the KV cache (default 2)",
    "deadline_ms": "bound on every call to the server (default 2000)",
    "health_interval_s": "server mode: how often the link checks the server (default 1.0)",
}


@dataclass(frozen=True)
class Settings:
    mode: str = "auto"
    endpoint: str = DEFAULT_ENDPOINT
    namespace: str | None = None
    pool_size: str = "8gb"
    copy_threads: int = 2
    deadline_ms: int = 2000
    health_interval_s: float = 1.0

    @staticmethod
    def from_extra(extra: dict | None, env: dict | None = None) -> "Settings":
        """From ``kv_connector_extra_config`` (keys may carry a ``pegaflow.`` prefix)."""
        env = os.environ if env is None else env
        raw = {}
        for key, value in (extra or {}).items():
            k = key.removeprefix("pegaflow.")
            if k not in _KEYS:
                accepted = ", ".join(f"{name} ({doc})" for name, doc in _KEYS.items())
                raise InvalidArgumentError(f"kv_connector_extra_config key '{key}' is unknown; expected one of: {accepted}")
            raw[k] = value
        mode = str(raw.get("mode", env.get("PEGAFLOW_MODE", "auto"))).lower()
        if mode not in MODES:
            raise InvalidArgumentError(f"kv_connector_extra_config mode '{mode}'; expected one of {list(MODES)}")

        def number(key, kind, default, minimum):
            value = raw.get(key, default)
            try:
                n = kind(value)
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"kv_connector_extra_config {key} '{value}'; expected a number") from None
            if n < minimum:
                raise InvalidArgumentError(f"kv_connector_extra_config {key} {n}; expected >= {minimum}")
            return n

        namespace = raw.get("namespace")
        if namespace is not None and (not isinstance(namespace, str) or not namespace.strip()):
            raise InvalidArgumentError(f"kv_connector_extra_config namespace {namespace!r}; expected a non-empty string")
        return Settings(
            mode=mode,
            endpoint=str(raw.get("endpoint", env.get("PEGAFLOW_ENDPOINT", DEFAULT_ENDPOINT))),
            namespace=namespace,
            pool_size=str(raw.get("pool_size", env.get("PEGAFLOW_POOL_SIZE", "8gb"))),
            copy_threads=number("copy_threads", int, 2, 1),
            deadline_ms=number("deadline_ms", int, 2000, 1),
            health_interval_s=number("health_interval_s", float, 1.0, 0.0),
        )


@dataclass
class _Worker:
    instance_id: str
    namespace: str
    tp_size: int
    world_size: int
    worker_rank: int
    tp_rank: int
    device: int
    regions: list[LayerRegion]


@dataclass
class Link:
    """The store as this process sees it (see the module docstring)."""

    settings: Settings
    mode: str  # embedded | server
    engine: PegaEngine | None = None
    transfer: str = "host"
    device: int = 0
    generation: int = 0
    server_id: str = ""
    detached: bool = False  # the brains point at no engine while the server does not answer
    _workers: list[_Worker] = field(default_factory=list)
    _rebinders: list = field(default_factory=list)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _next_check: float = 0.0
    _down_logged: bool = False

    # ------------------------------------------------------------------ engine

    def _connect(self) -> EngineClient:
        return EngineClient(self.settings.endpoint, copy_threads=self.settings.copy_threads, transfer=self.transfer,
                            device=self.device, deadline_s=self.settings.deadline_ms / 1000)

    def handle(self) -> int:
        """The engine handle for the connector brains (0: none right now)."""
        e = self.engine
        if e is None or e._handle is None or self.detached:
            return 0
        return e._handle

    def attach(self, make):
        """``make(handle)`` builds a brain on the current engine; it is rebound whenever the
        engine changes (both under the lock, so no change is missed in between)."""
        with self._lock:
            brain = make(self.handle())
            self._rebinders.append(brain.rebind)
            return brain

    def forget(self, fn) -> None:
        with self._lock:
            if fn in self._rebinders:
                self._rebinders.remove(fn)

    def _rebind_all(self) -> None:
        handle = self.handle()
        for fn in list(self._rebinders):
            fn(handle)

    def use_transfer(self, transfer: str, device: int) -> None:
        """The copy engine the workers of this process need (decided by their tensors)."""
        with self._lock:
            if self.engine is not None and (self.transfer, self.device) != (transfer, device):
                if self.mode == "embedded":
                    raise InvalidArgumentError(
                        f"this process's embedded engine copies with '{self.transfer}' on device {self.device} but a "
                        f"worker's KV cache needs '{transfer}' on device {device}; expected one device per process"
                    )
                self.transfer, self.device = transfer, device
                self._replace(self._try_connect())
                return
            self.transfer, self.device = transfer, device
            if self.engine is None:
                if self.mode == "embedded":
                    self.engine = PegaEngine(pool_size=self.settings.pool_size, copy_threads=self.settings.copy_threads,
                                             transfer=transfer, device=device, prefault=False)
                else:
                    self._replace(self._try_connect())

    def _try_connect(self) -> EngineClient | None:
        try:
            return self._connect()
        except ServerUnavailableError as e:
            if not self._down_logged:
                log.warning("pegaflow-server at %s does not answer (%s); serving without the cache (recompute) "
                            "and retrying every %.1f s", self.settings.endpoint, e, self.settings.health_interval_s)
                self._down_logged = True
            return None

    def _replace(self, new: PegaEngine | None) -> None:
        """Under the lock: registers this process's workers on ``new``, points every brain
        at it, then closes the old engine (copies in flight finish first)."""
        if new is not None:
            try:
                for w in self._workers:
                    new.register_instance(w.instance_id, w.namespace, w.tp_size, w.world_size)
                    new.register_worker(w.instance_id, w.worker_rank, w.tp_rank, w.regions, w.device)
            except ServerUnavailableError:
                new.close()
                new = None
            except PegaflowError as e:
                log.error("pegaflow-server at %s refused this process's registration (%s); serving without the "
                          "cache", self.settings.endpoint, e)
                new.close()
                new = None
        old, self.engine = self.engine, new
        self.server_id = getattr(new, "server_id", "") if new is not None else ""
        self.detached = False
        self.generation += 1
        self._rebind_all()
        if old is not None:
            try:
                old.close()
            except PegaflowError as e:
                log.debug("closing the previous engine: %s", e)
        if new is not None:
            if self._down_logged:
                log.warning("pegaflow-server at %s answers again; cache re-enabled", self.settings.endpoint)
            self._down_logged = False

    def _detach(self) -> None:
        """The server does not answer: lookups miss at once and loads fail fast (recompute)
        instead of each waiting for its deadline. The client is kept: if the same server
        process answers again, its registrations and sessions are still valid."""
        if not self.detached:
            self.detached = True
            self._rebind_all()
            if not self._down_logged:
                log.warning("pegaflow-server at %s does not answer; serving without the cache (recompute) until "
                            "it does", self.settings.endpoint)
                self._down_logged = True

    def register_worker(self, w: _Worker) -> None:
        """Registers a worker now (embedded, or a server that answers) and again after every
        reconnect. Bad geometry is an error now; an absent server is not."""
        with self._lock:
            self._workers.append(w)
            if self.engine is None:
                return
            try:
                self.engine.register_instance(w.instance_id, w.namespace, w.tp_size, w.world_size)
                self.engine.register_worker(w.instance_id, w.worker_rank, w.tp_rank, w.regions, w.device)
            except ServerUnavailableError:
                self._replace(None)
            except PegaflowError:
                self._workers.remove(w)
                raise

    def unregister_instance(self, instance_id: str) -> None:
        with self._lock:
            self._workers = [w for w in self._workers if w.instance_id != instance_id]
            if self.engine is not None:
                try:
                    self.engine.unregister_instance(instance_id)
                except PegaflowError as e:
                    log.debug("unregistering %s: %s", instance_id, e)

    # ------------------------------------------------------------------ health

    def tick(self, probe_instance: str | None) -> None:
        """Server mode, at most every ``health_interval_s``: checks the server. Unreachable:
        detach. Answering again as the same process (same server id): re-attach the kept
        client. A restarted server (new id): register again through a new client, which maps
        its new pool. Cheap when not due."""
        if self.mode != "server":
            return
        now = time.monotonic()
        if now < self._next_check:
            return
        with self._lock:
            if now < self._next_check:
                return
            self._next_check = now + self.settings.health_interval_s
            if self.engine is not None and not self.detached:
                try:
                    if probe_instance is not None:
                        self.engine.query(probe_instance, [])
                    else:
                        self.engine.stats()
                    return
                except ServerUnavailableError:
                    self._detach()
                except PegaflowError as e:
                    log.info("pegaflow-server at %s: %s; checking whether it restarted", self.settings.endpoint, e)
            new = self._try_connect()
            if new is None:
                if self.engine is not None:
                    self._detach()
                return
            if self.engine is not None and new.server_id == self.server_id:
                new.close()  # the same server process: what this process registered is still there
                if self.detached:
                    self.detached = False
                    self._rebind_all()
                    log.warning("pegaflow-server at %s answers again; cache re-enabled", self.settings.endpoint)
                    self._down_logged = False
                return
            self._replace(new)  # a restarted server (or the first connection)

    def close(self) -> None:
        with self._lock:
            self._rebinders.clear()
            engine, self.engine = self.engine, None
            if engine is not None:
                try:
                    engine.close()
                except PegaflowError as e:
                    log.debug("closing the engine: %s", e)


_links: dict[tuple, Link] = {}
_links_lock = threading.Lock()


def link_for(settings: Settings, role: str) -> Link:
    """This process's link for ``settings`` (created on first use). ``auto`` resolves once
    per process: server when one answers at the endpoint, else embedded."""
    key = (settings.mode, settings.endpoint, settings.pool_size)
    with _links_lock:
        link = _links.get(key)
        if link is not None:
            return link
        mode = settings.mode
        probe = None
        if mode in ("auto", "server"):
            _bridge.api()  # start the JVM before timing anything
            try:
                probe = EngineClient(settings.endpoint, copy_threads=settings.copy_threads,
                                     deadline_s=settings.deadline_ms / 1000)
                mode = "server"
            except ServerUnavailableError:
                if mode == "auto":
                    log.info("no pegaflow-server at %s: using an embedded engine (pool %s) in this process",
                             settings.endpoint, settings.pool_size)
                    mode = "embedded"
        link = Link(settings=settings, mode=mode)
        if probe is not None:
            link.engine = probe  # host copies until a worker says otherwise (use_transfer)
            link.server_id = probe.server_id
        elif mode == "server":
            link._next_check = 0.0  # keep trying
            link._down_logged = True
            log.warning("pegaflow-server at %s does not answer; serving without the cache (recompute) until it "
                        "does", settings.endpoint)
        _links[key] = link
        return link


def close_all() -> None:
    with _links_lock:
        for link in _links.values():
            link.close()
        _links.clear()
