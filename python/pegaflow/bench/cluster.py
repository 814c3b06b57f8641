"""``pegaflow-bench cluster``: cross-node sharing measured on two hosts made of network
namespaces (root; docs/cluster.md). In one run: raw TCP throughput between the two namespaces
(``pegaflow-bench raw-tcp``, direct buffers over one connection), then a 2,048-block prefix saved
on host A and asked for on host B through real pegaflow-servers (query -> lookup -> pin -> read ->
checked -> hit), then the registry's costs (``pegaflow-bench registry``) against the same Redis."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pegaflow._server import start_server
from pegaflow.bench import netns
from pegaflow.bench.cluster_agent import BLOCKS, LAYERS, SEG

ADDRS = {"a": "10.77.1.1", "b": "10.77.1.2"}
REDIS_PORT = 6391


def _bench(ns: str, *args: str, capture: bool = True) -> subprocess.Popen | str:
    cmd = ["ip", "netns", "exec", ns, str(Path(sys.executable).parent / "pegaflow-bench"), *args]
    if not capture:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(" ".join(cmd) + " failed:\n" + out.stdout + out.stderr)
    return out.stdout


def _agent(ns: str, server, *args: str) -> list[dict]:
    """Runs the host's vLLM-side agent; its JSON lines (one per round)."""
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "pegaflow.bench.cluster_agent", *args,
                          "--endpoint", server.endpoint], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stdout + out.stderr)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="pegaflow-bench cluster")
    p.add_argument("--blocks", type=int, default=2048, help="prefix length fetched (default 2048)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3, help="fetch rounds run first and not counted (JIT warm-up)")
    p.add_argument("--registry-blocks", type=int, default=1_000_000)
    p.add_argument("--json", default="out/cluster.json")
    a = p.parse_args(argv)
    if os.geteuid() != 0:
        print("pegaflow-bench cluster: needs root (it makes network namespaces)", file=sys.stderr)
        return 2
    block_bytes = LAYERS * 2 * SEG
    report: dict = {"blocks": a.blocks, "block_bytes": block_bytes, "rounds": a.rounds, "warmup_rounds": a.warmup}
    # the pools live where pegaflow-server puts them by default (/dev/shm, tmpfs): a pool file on a
    # disk file system would have the fetch's writes flushed to disk behind it
    shm = Path("/dev/shm")
    tmp = Path(tempfile.mkdtemp(prefix="pegaflow-cluster-bench-", dir=shm if shm.is_dir() else None))
    secret = tmp / "secret"
    secret.write_text(os.urandom(24).hex())
    with netns.hosts(ADDRS, prefix=f"pfb{os.getpid() % 10000}") as ns:
        redis = netns.redis_server(ns["a"], ADDRS["a"], REDIS_PORT)
        servers = []
        try:
            # 1. the baseline: raw TCP between the same two namespaces, twice: cycling through memory
            #    the size of one fetch (what a fetch moves: pool pages, not cache) and through 4 MiB
            #    that stays in cache (iperf's way; the higher figure)
            prefix_bytes = a.blocks * block_bytes
            for key, buffer in (("raw_tcp_gbps", prefix_bytes), ("raw_tcp_cached_gbps", 4 << 20)):
                listener = _bench(ns["a"], "raw-tcp", "--listen", f"{ADDRS['a']}:7300", "--rounds", "3",
                                  "--buffer-bytes", str(buffer), capture=False)
                assert listener.stdout.readline().strip() == "ready"
                raw = json.loads(_bench(ns["b"], "raw-tcp", "--connect", f"{ADDRS['a']}:7300", "--rounds", "3",
                                        "--bytes", str(1 << 30), "--buffer-bytes", str(buffer)).strip().splitlines()[-1])
                listener.wait(60)
                report[key] = round(statistics.median(raw["raw_tcp_gbps_rounds"]), 3)
                report[key + "_rounds"] = raw["raw_tcp_gbps_rounds"]
            # 2. peer fetch through two real servers
            flags = [f"--redis-url=redis://{ADDRS['a']}:{REDIS_PORT}", "--peer-allow-remote", f"--cluster-secret-file={secret}",
                     "--cluster-heartbeat-ms=200", "--cluster-stale-ms=1000"]
            total = a.warmup + a.rounds
            pool_a = f"{(total * a.blocks * block_bytes >> 20) + 256}mb"
            pool_b = f"{(4 * a.blocks * block_bytes >> 20)}mb"
            # pools committed at start (--prefault-threads), as for a production pool: the fetch then
            # writes into resident pages, as the raw TCP receiver does into its reused buffer
            sa = start_server(tmp / "a.pool", pool_size=pool_a, netns=ns["a"],
                              extra=[*flags, f"--peer-addr={ADDRS['a']}:7301", "--prefault-threads=2"])
            servers.append(sa)
            sb = start_server(tmp / "b.pool", pool_size=pool_b, netns=ns["b"],
                              extra=[*flags, f"--peer-addr={ADDRS['b']}:7301", "--prefault-threads=2"])
            servers.append(sb)
            _agent(ns["a"], sa, "save", "--instance", "save", "--seed", "bench", "--rounds", str(total), "--blocks", str(a.blocks))
            deadline = time.time() + 30
            while sa.metric("pegaflow_registry_advertised_blocks_total") < total * a.blocks:
                assert time.time() < deadline, "A did not advertise its blocks"
                time.sleep(0.05)
            # one long-lived vLLM-side process for every round, as a scheduler is: a fresh process per
            # round would time its own JIT warm-up beside the fetch
            rounds = _agent(ns["b"], sb, "fetch", "--instance", "fetch", "--seed", "bench", "--rounds", str(total),
                            "--blocks", str(a.blocks), "--no-load", "--timeout", "60")
            ms = []
            for r, got in enumerate(rounds):
                if got["hit"] != a.blocks:
                    raise RuntimeError(f"round {r}: fetched {got['hit']} of {a.blocks} blocks")
                took = got["seconds"] * 1e3
                print(f"{'warm-up' if r < a.warmup else 'round'} {r}: {a.blocks}-block prefix from host A ready on host B "
                      f"in {took:.1f} ms", file=sys.stderr)
                if r >= a.warmup:
                    ms.append(took)
            p50 = statistics.median(ms)
            report[f"remote_prefix_{a.blocks}_ms_p50"] = round(p50, 1)
            report["remote_prefix_ms_all"] = [round(x, 1) for x in ms]
            report["fetch_gbps"] = round(a.blocks * block_bytes / (p50 / 1e3) / 1e9, 3)
            report["fetch_ratio"] = round(report["fetch_gbps"] / report["raw_tcp_gbps"], 3)
            report["fetch_ratio_to_cached"] = round(report["fetch_gbps"] / report["raw_tcp_cached_gbps"], 3)
            report["peer_fetch_bytes"] = sb.metric("pegaflow_peer_fetch_bytes_total")
            report["checksum_failures"] = sb.metric("pegaflow_peer_checksum_failures_total")
            phases = {}
            for line in sb.http("/metrics")[1].splitlines():
                if line.startswith("pegaflow_peer_fetch_phase_seconds_total{"):
                    phases[line.split('"')[1]] = round(float(line.rsplit(" ", 1)[1]) * 1e3 / (a.warmup + a.rounds), 1)
            report["fetch_phase_ms_mean"] = phases  # over warm-up and counted rounds
            for s in servers:
                s.stop()
            servers.clear()
            # 3. the registry's own costs, on a database of the same Redis nothing else uses
            reg = json.loads(_bench(ns["b"], "registry", "--redis", f"redis://{ADDRS['a']}:{REDIS_PORT}/1",
                                    "--blocks", str(a.registry_blocks), "--json", str(tmp / "registry.json")))
            report["registry_blocks"] = reg.pop("blocks")
            report.update({k: v for k, v in reg.items() if k != "command"})
        finally:
            for s in servers:
                s.stop(kill=True)
            redis.kill()
            redis.wait(10)
    shutil.rmtree(tmp, ignore_errors=True)
    report["command"] = "pegaflow-bench cluster " + " ".join(argv)
    print(json.dumps(report, indent=2))
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0
