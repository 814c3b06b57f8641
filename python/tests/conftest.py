"""Shared fixtures. Unit tests never start a JVM; integration tests use the built jar."""

from __future__ import annotations

import pytest


@pytest.fixture
def engine_jar():
    """The built engine jar; integration tests fail (not skip) without it, so CI notices."""
    from pegaflow._java import find_jar

    return find_jar()
