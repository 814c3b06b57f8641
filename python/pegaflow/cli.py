"""Console scripts. ``pegaflow-bench`` runs the Java benchmark CLI (workload, jmh, ...)."""

from __future__ import annotations

import os
import sys

from pegaflow._java import java_command
from pegaflow.errors import PegaflowError


def bench_main(argv: list[str] | None = None) -> int:
    """Replaces this process with the JVM so signals and the exit code pass straight through."""
    args = sys.argv[1:] if argv is None else argv
    try:
        cmd = java_command(args)
    except PegaflowError as e:
        print(f"pegaflow-bench: {e}", file=sys.stderr)
        return 2
    os.execv(cmd[0], cmd)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(bench_main())
