"""PegaFlow-JVM: KV-cache offload and sharing for vLLM, with a Java engine.

The Python side stays thin: it finds a Java runtime (``pegaflow._java``), locates the engine
jar, and forwards plain data to the engine.
"""

from pegaflow.errors import JavaNotFoundError, PegaflowError

__version__ = "0.1.0"

__all__ = ["JavaNotFoundError", "PegaflowError", "__version__"]
