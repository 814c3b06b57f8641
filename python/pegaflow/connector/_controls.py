"""Per-request controls through vLLM's ``kv_transfer_params`` (the OpenAI request's field, or
``SamplingParams(extra_args={"kv_transfer_params": ...})``), under the key ``"pegaflow"``:

- ``"load": false``: this request is not served from the store (it computes its prefix);
- ``"save": false``: nothing of this request is saved (a one-off prompt, private data);
- ``"save_max_tokens": N``: at most the first N prompt tokens' full blocks are saved.

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
        elif key == "save_max_tokens":
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                out[key] = value
                continue
            expected = "an integer >= 0"
        else:
            log.warning("request %s: kv_transfer_params['%s'] has unknown key %r; expected load, save or "
                        "save_max_tokens: ignored", request_id, KEY, key)
            continue
        log.warning("request %s: kv_transfer_params['%s']['%s'] is %r; expected %s: the default stands",
                    request_id, KEY, key, value, expected)
    return Controls(**out)
