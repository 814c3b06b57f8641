"""Per-request controls through vLLM's ``kv_transfer_params`` (the OpenAI request's field, or
``SamplingParams(extra_args={"kv_transfer_params": ...})``), under the key ``"pegaflow"``:

- ``"load": false``: this request is not served from the store (it computes its prefix);
- ``"save": false``: nothing of this request is saved (a one-off prompt, private data);
- ``"save_max_tokens": N``: at most the first N prompt tokens' full blocks are saved;
- ``"retention": "low"``: what this request saves goes first when the pool needs room (a
  one-off prompt that should not push out prefixes others reuse), until a lookup hits it
  again; ``"normal"`` (default) keeps the pool's own order. There is no "high": keeping blocks
  against pressure is the operator's pin (``/admin/pin``), within the pool's share for pins.

A value of the wrong type or an unknown key is logged once per request, naming the key, the
value and what was expected, and the default stands: a request's parameters never fail vLLM.
Other connectors' keys in ``kv_transfer_params`` are left alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("pegaflow.connector")

KEY = "pegaflow"


@dataclass(frozen=True)
class Controls:
    load: bool = True
    save: bool = True
    save_max_tokens: int | None = None  # None: no cap
    retention: str = "normal"  # "low": evicted first


DEFAULT = Controls()


def of(request_id: str, params: Any) -> Controls:
    """The controls of one request from its ``kv_transfer_params`` (None: the defaults)."""
    if not isinstance(params, dict) or KEY not in params:
        return DEFAULT
    raw = params[KEY]
    if not isinstance(raw, dict):
        log.warning("request %s: kv_transfer_params['%s'] is %r; expected an object such as "
                    "{\"load\": false, \"save\": false, \"save_max_tokens\": 4096}: ignored", request_id, KEY, raw)
        return DEFAULT
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in ("load", "save"):
            if isinstance(value, bool):
                out[key] = value
                continue
            expected = "true or false"
        elif key == "retention":
            if value in ("normal", "low"):
                out[key] = value
                continue
            expected = "\"normal\" or \"low\""
        elif key == "save_max_tokens":
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                out[key] = value
                continue
            expected = "an integer >= 0"
        else:
            log.warning("request %s: kv_transfer_params['%s'] has unknown key %r; expected load, save, "
                        "save_max_tokens or retention: ignored", request_id, KEY, key)
            continue
        log.warning("request %s: kv_transfer_params['%s']['%s'] is %r; expected %s: the default stands",
                    request_id, KEY, key, value, expected)
    return Controls(**out)


class LowRetention:
    """Scheduler side: which blocks each ``"retention": "low"`` request saved, handed to the store
    (``link.demote``) once its saves are done: at ``request_finished`` when vLLM does not hold its
    blocks for saves still running, else when they are reported finished (``finished_sending``).
    Only the blocks the request computed itself are demoted: the prefix it got from vLLM's cache
    or from the store was someone else's to keep."""

    def __init__(self, block_size: int):
        self._block_size = block_size
        self._own_from: dict[str, int] = {}  # first block the request computed, by request
        self._after_saves: dict[str, list[bytes]] = {}

    def looked_up(self, req_id: str, num_computed_tokens: int, hit_tokens: int) -> None:
        self._own_from[req_id] = (num_computed_tokens + max(0, hit_tokens)) // self._block_size

    def finished(self, req_id: str, keys, saved: int, held: bool) -> list[bytes]:
        """The keys to demote now (empty when they wait for the saves, or there are none)."""
        own = list(keys[self._own_from.pop(req_id, 0):saved])
        if held and own:
            self._after_saves[req_id] = own
            return []
        return own

    def saves_done(self, req_ids) -> list[bytes]:
        out: list[bytes] = []
        for req_id in req_ids or ():
            out.extend(self._after_saves.pop(req_id, ()))
        return out
