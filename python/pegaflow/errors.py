"""Typed errors. Engine errors carry the Java message, which names the bad value."""

from __future__ import annotations


class PegaflowError(Exception):
    """Base of every error PegaFlow raises."""

    code: int = 9  # INTERNAL

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


class JavaNotFoundError(PegaflowError):
    """No Java runtime >= 25 was found; the message lists every place that was tried."""


class EngineJarNotFoundError(PegaflowError):
    """The engine jar is neither packaged nor built in the source checkout."""


class JvmStartError(PegaflowError):
    """The in-process JVM could not be started (or was started before a fork)."""


class InvalidArgumentError(PegaflowError, ValueError):
    code = 1


class UnknownInstanceError(PegaflowError, KeyError):
    code = 2

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownLeaseError(PegaflowError, KeyError):
    code = 3

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class RegistrationIncompleteError(PegaflowError):
    code = 4


class TopologyMismatchError(PegaflowError):
    code = 5


class PoolExhaustedError(PegaflowError, MemoryError):
    code = 6


class TransferFailedError(PegaflowError):
    """A copy failed; ``block_ids`` are the blocks whose bytes are not valid (recompute them)."""

    code = 7

    def __init__(self, message: str, code: int | None = None, block_ids: list[int] | None = None):
        super().__init__(message, code)
        self.block_ids = block_ids or []


class EngineClosedError(PegaflowError):
    code = 8


class InternalError(PegaflowError):
    code = 9


class CudaError(PegaflowError):
    code = 10


class EngineTimeoutError(PegaflowError, TimeoutError):
    code = 11


class ServerUnavailableError(PegaflowError, ConnectionError):
    """pegaflow-server did not answer within the call's deadline; a connector treats it as a miss."""

    code = 12


class PermissionDeniedError(PegaflowError, PermissionError):
    """No or a wrong server credential, or an id of another instance; nothing changed."""

    code = 13


BY_CODE: dict[int, type[PegaflowError]] = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        UnknownInstanceError,
        UnknownLeaseError,
        RegistrationIncompleteError,
        TopologyMismatchError,
        PoolExhaustedError,
        TransferFailedError,
        EngineClosedError,
        InternalError,
        CudaError,
        EngineTimeoutError,
        ServerUnavailableError,
        PermissionDeniedError,
    )
}


def from_code(code: int, message: str) -> PegaflowError:
    """The typed exception for an engine error code (unknown codes become InternalError)."""
    cls = BY_CODE.get(code, InternalError)
    return cls(message, code)
