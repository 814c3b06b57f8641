"""PegaFlow-JVM: KV-cache offload and sharing for vLLM, with a Java engine.

The Python side stays thin: it finds a Java runtime, starts the engine in-process
(``PegaEngine``) and forwards plain data to it. Importing this package starts nothing; the
JVM starts on the first ``PegaEngine(...)``. It only sets ``$PEGAFLOW_JOIN_SECRET`` when absent
(``pegaflow._launch``), so the processes a launch spawns later share it.
"""

from pegaflow import _launch

from pegaflow.errors import (
    CudaError,
    EngineClosedError,
    EngineTimeoutError,
    InternalError,
    InvalidArgumentError,
    JavaNotFoundError,
    JvmStartError,
    PegaflowError,
    PoolExhaustedError,
    RegistrationIncompleteError,
    ServerUnavailableError,
    TopologyMismatchError,
    TransferFailedError,
    UnknownInstanceError,
    UnknownLeaseError,
)

__version__ = "0.1.0"

_launch.ensure()

_LAZY = {"PegaEngine", "EngineClient", "LayerRegion", "QueryResult", "TransferResult", "Completion"}


def __getattr__(name: str):
    if name in _LAZY:
        from pegaflow import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'pegaflow' has no attribute {name!r}")


__all__ = sorted(
    _LAZY
    | {
        "CudaError", "EngineClosedError", "EngineTimeoutError", "InternalError", "InvalidArgumentError",
        "JavaNotFoundError", "JvmStartError", "PegaflowError", "PoolExhaustedError",
        "RegistrationIncompleteError", "ServerUnavailableError", "TopologyMismatchError", "TransferFailedError",
        "UnknownInstanceError", "UnknownLeaseError", "__version__",
    }
)
