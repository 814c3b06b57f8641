"""The launch's join secret: one per launch, shared by the processes it starts.

pegaflow-server lets a client act only for the instances it registered, or joined with the
instance's join secret (docs/security.md). A vLLM instance runs in several processes (its API
server, its engine core with the scheduler, one worker per TP rank), each with its own
client. ``ensure()`` (called by ``import pegaflow``) draws the secret into
``$PEGAFLOW_JOIN_SECRET`` when it is absent, before any of those processes is spawned: they
inherit it, the engine's bridge presents it (``Marshal.joinSecret``), and so each process
acts for the instances another one registered. A process of another launch draws its own
and is refused. Set it yourself to group launches; processes of the same user can read it
(``/proc/PID/environ``) as they can read the server's token.
"""

from __future__ import annotations

import os
import secrets

ENV = "PEGAFLOW_JOIN_SECRET"


def ensure() -> str:
    """This launch's secret, drawn (32 hex digits) when the environment has none."""
    value = os.environ.get(ENV)
    if not value:
        value = secrets.token_hex(16)
        os.environ[ENV] = value
    return value
