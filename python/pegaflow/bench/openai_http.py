"""A vLLM OpenAI API server as the benchmarks and tests talk to it over HTTP: wait until it is
ready, ask for a completion, read a Prometheus series from its ``/metrics``. One home for what
the ttft bench, the e2e, stress and GPU tiers all do."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any


def log_excerpt(text: str, tail: int = 4000, cause: int = 3000) -> str:
    """The log's last ``tail`` characters and, where an earlier traceback lies before them (vLLM's
    engine core prints the root cause there, then the API server's own traceback ends the log
    with "See root cause above"), the first such traceback's first ``cause`` characters."""
    end = text[-tail:]
    first = text.find("Traceback (most recent call last)")
    if first < 0 or first >= len(text) - tail:
        return end
    start = text.rfind("\n", 0, first) + 1  # from the start of its line (the process's prefix)
    return f"{text[start:start + cause]}\n[...]\n{end}"


def wait_ready(port: int, proc: subprocess.Popen, log: Path, timeout: float = 600) -> None:
    """Returns once ``GET /health`` answers 200; raises AssertionError (with the log's tail, and its
    first traceback where that lies earlier: ``log_excerpt``) when the process exits first or the
    timeout passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the API server exited with {proc.returncode}:\n{log_excerpt(log.read_text())}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"the API server was not ready in {timeout} s:\n{log_excerpt(log.read_text())}")


def post(port: int, path: str, body: dict[str, Any] | None, timeout: float = 120) -> dict:
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def complete(port: int, model: str, prompt: str | list[int], max_tokens: int, timeout: float = 120, **extra) -> dict:
    """``POST /v1/completions``, greedy; ``extra`` joins the body (``logprobs``, ``ignore_eos``...)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    return post(port, "/v1/completions", body, timeout)


def metric(port: int, name: str) -> float:
    """A series of the server's ``/metrics``, summed over its label sets (0 when absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))
