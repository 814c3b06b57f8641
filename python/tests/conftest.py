"""Shared fixtures. Unit tests never start a JVM; integration tests use the built jar."""

from __future__ import annotations

import pytest


@pytest.fixture
def engine_jar():
    """The built engine jar; integration tests fail (not skip) without it, so CI notices."""
    from pegaflow._java import find_jar

    return find_jar()


@pytest.fixture
def engines():
    """SimEngines (vLLM 0.33's real scheduler, simulated forward: pegaflow.bench.sim) made by the
    test with ``make(name, extra=None, **kw)`` (extra: the connector's settings, an embedded 64 MB
    store when None); closed, with this process's links, afterwards."""
    from pegaflow.bench.sim import SimEngine
    from pegaflow.connector import _runtime

    made: list = []

    def make(name, extra=None, **kw):
        e = SimEngine(name, {"mode": "embedded", "pool_size": "64mb"} if extra is None else extra, **kw)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()
    _runtime.close_all()
