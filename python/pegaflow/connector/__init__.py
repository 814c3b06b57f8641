"""vLLM's v1 KV connector on the PegaFlow-JVM engine.

Load it with::

    vllm serve MODEL --kv-transfer-config '{"kv_connector":"PegaKVConnector","kv_role":"kv_both",
        "kv_connector_module_path":"pegaflow.connector","kv_load_failure_policy":"recompute"}'

``PegaKVConnector`` (in ``_vllm``, imported on first access) adapts vLLM's objects; the
vLLM-independent parts (``worker.WorkerCore``, the Java brain's ``_brain``, ``_layout``,
``_runtime``) import without vLLM, which the GPU end-to-end test relies on. The installed
vLLM's version is checked here, at import, from its metadata (cheap: vLLM is not imported).
"""

from __future__ import annotations

from importlib import metadata as _metadata

from .._vllm_version import SUPPORTED_VLLM, check_vllm_version

try:
    _installed = _metadata.version("vllm")
except _metadata.PackageNotFoundError:
    _installed = None
if _installed is not None:
    check_vllm_version(_installed)

__all__ = ["PegaKVConnector", "PegaConnectorMetadata", "SUPPORTED_VLLM", "check_vllm_version"]


def __getattr__(name: str):
    if name in ("PegaKVConnector", "PegaConnectorMetadata"):
        if _installed is None:
            raise ImportError(f"pegaflow.connector.{name} needs vLLM {SUPPORTED_VLLM}.x: pip install 'vllm==0.33.0'")
        from . import _vllm

        return getattr(_vllm, name)
    raise AttributeError(f"module 'pegaflow.connector' has no attribute '{name}'")
