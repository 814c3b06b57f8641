"""Typed errors of the Python front; engine errors will carry the Java message."""


class PegaflowError(Exception):
    """Base of every error PegaFlow raises."""


class JavaNotFoundError(PegaflowError):
    """No Java runtime >= 25 was found; the message lists every place that was tried."""


class EngineJarNotFoundError(PegaflowError):
    """The engine jar is neither packaged nor built in the source checkout."""
