"""The vLLM release the connector supports (checked at ``import pegaflow.connector``)."""

from __future__ import annotations

import re

SUPPORTED_VLLM = "0.33"  # major.minor; the pinned, tested release is vllm==0.33.0


def check_vllm_version(version: str) -> None:
    """Refuses any vLLM but the supported minor release, naming both."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None or f"{m.group(1)}.{m.group(2)}" != SUPPORTED_VLLM:
        raise ImportError(
            f"pegaflow.connector supports vLLM {SUPPORTED_VLLM}.x (tested with 0.33.0) but vllm {version} is "
            f"installed; install vllm>={SUPPORTED_VLLM}.0,<0.34 (pip install 'vllm==0.33.0')"
        )
