"""``pegaflow-bench cluster``: cross-node sharing measured on two hosts made of network
namespaces (root; docs/cluster.md). In one run: raw TCP throughput between the two namespaces
(``pegaflow-bench raw-tcp``, direct buffers over one connection), then a 2,048-block prefix saved
on host A and asked for on host B through real pegaflow-servers (query -> lookup -> pin -> read ->
checked -> hit), then the registry's costs (``pegaflow-bench registry``) against the same Redis."""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pegaflow._server import start_server
from pegaflow.bench import netns
from pegaflow.bench.cluster_agent import SEG

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


def _agent(ns: str, server, *args: str, stdin: str | None = None) -> list[dict]:
    """Runs the host's vLLM-side agent; its JSON lines (one per round)."""
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "pegaflow.bench.cluster_agent", *args,
                          "--endpoint", server.endpoint], input=stdin, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stdout + out.stderr)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def _raw_tcp(ns: dict, prefix_bytes: int) -> dict[str, list[float]]:
    """Three rounds of 1 GiB over one connection from host A to host B, per buffer size."""
    out = {}
    for key, buffer in (("raw_tcp_gbps", prefix_bytes), ("raw_tcp_cached_gbps", 4 << 20)):
        listener = _bench(ns["a"], "raw-tcp", "--listen", f"{ADDRS['a']}:7300", "--rounds", "3",
                          "--buffer-bytes", str(buffer), capture=False)
        assert listener.stdout.readline().strip() == "ready"
        raw = json.loads(_bench(ns["b"], "raw-tcp", "--connect", f"{ADDRS['a']}:7300", "--rounds", "3",
                                "--bytes", str(1 << 30), "--buffer-bytes", str(buffer)).strip().splitlines()[-1])
        listener.wait(60)
        out[key] = raw["raw_tcp_gbps_rounds"]
    return out


def _compile_seconds(servers) -> float:
    """The JIT's compile time so far, summed over the servers (their /metrics)."""
    return sum(s.metric("jvm_compilation_time_seconds_total") for s in servers)


def _fetch_rounds(ns: str, server, servers, plan, a) -> tuple[list[float], dict]:
    """Host B's fetch rounds from one long-lived vLLM-side process, as a scheduler is (a fresh
    process per round would time its own JIT warm-up beside the fetch). Warm-up rounds run until
    both servers' JIT compiled less than --jit-quiet-ms in a round (at least --warmup rounds, at
    most --max-warmup): a fresh server's first fetches run beside C2 on the same cores, and a
    long-running server's do not. Returns the counted rounds' ms and what the warm-up took."""
    agent = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "pegaflow.bench.cluster_agent", "fetch",
                              "--instance", "fetch", "--seed", "-", "--stdin", "--layers", str(a.layers), "--no-load",
                              "--timeout", "60", "--endpoint", server.endpoint],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def fetch(seed: str, blocks: int) -> float:
        fetched = server.metric("pegaflow_peer_fetch_blocks_total")
        agent.stdin.write(f"{seed} {blocks}\n")
        agent.stdin.flush()
        ready, _, _ = select.select([agent.stdout], [], [], 120)
        line = agent.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(f"the fetch agent ended or hung (rc {agent.poll()})")
        got = json.loads(line)
        if got.get("hit") != blocks:
            raise RuntimeError(f"prefix {seed}: fetched {got.get('hit')} of {blocks} blocks ({got})")
        # every round is a fetch from host A, never a local hit on B (its pool holds 4 prefixes)
        # (counted just after the blocks are sealed: a moment after the agent may see them)
        deadline = time.time() + 5
        while server.metric("pegaflow_peer_fetch_blocks_total") - fetched < blocks:
            if time.time() > deadline:
                raise RuntimeError(f"prefix {seed}: host B did not fetch all {blocks} blocks from host A this round")
            time.sleep(0.01)
        return got["seconds"] * 1e3

    try:
        turn = iter(plan * (a.max_warmup + a.rounds))
        compile_ms, warm_ms = [], []
        before = _compile_seconds(servers)
        quiet = False
        for r in range(a.max_warmup):
            seed, n = next(turn)
            took = fetch(seed, n)
            warm_ms.append(round(took, 1))
            now = _compile_seconds(servers)
            compile_ms.append(round((now - before) * 1e3, 1))
            before = now
            print(f"warm-up {r}: {n}-block prefix in {took:.1f} ms, {compile_ms[-1]} ms of JIT compiles",
                  file=sys.stderr)
            if r + 1 >= a.warmup and compile_ms[-1] < a.jit_quiet_ms:
                quiet = True
                break
        ms = []
        for r in range(a.rounds):
            seed, n = next(turn)
            ms.append(fetch(seed, n))
            print(f"round {r}: {n}-block prefix from host A ready on host B in {ms[-1]:.1f} ms", file=sys.stderr)
        counted_compile_ms = round((_compile_seconds(servers) - before) * 1e3, 1)
    finally:
        try:
            agent.stdin.close()
            agent.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            agent.kill()
            agent.wait(10)
    return ms, {"warmup_rounds": len(compile_ms), "warmup_jit_quiet": quiet, "warmup_compile_ms": compile_ms,
                "warmup_ms": warm_ms,
                "counted_rounds_compile_ms": counted_compile_ms}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="pegaflow-bench cluster")
    p.add_argument("--blocks", type=int, default=2048, help="prefix length fetched (default 2048)")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--warmup", type=int, default=3,
                   help="fetch rounds run first and not counted, at least (the JIT of both servers compiles the fetch and "
                        "the registry client's advertising of fetched blocks over the first rounds)")
    p.add_argument("--max-warmup", type=int, default=30, help="warm-up rounds at most (default 30)")
    p.add_argument("--prefixes", type=int, default=6,
                   help="distinct prefixes host A holds, fetched in turn (default 6; host B's pool holds 4)")
    p.add_argument("--jit-quiet-ms", type=float, default=30.0,
                   help="the warm-up ends once both servers compiled less than this in a round (default 30)")
    p.add_argument("--layers", type=int, default=8,
                   help=f"layers per block, {2 * SEG >> 10} KiB each (default 8: 256 KiB blocks; real models' blocks are "
                        "256 KiB-2 MiB)")
    p.add_argument("--registry-blocks", type=int, default=1_000_000)
    p.add_argument("--json", default="out/cluster.json")
    a = p.parse_args(argv)
    if a.prefixes < 5:
        p.error(f"--prefixes {a.prefixes}: expected at least 5 (host B's pool holds 4: fewer would be local hits)")
    if os.geteuid() != 0:
        print("pegaflow-bench cluster: needs root (it makes network namespaces)", file=sys.stderr)
        return 2
    block_bytes = a.layers * 2 * SEG
    report: dict = {"blocks": a.blocks, "block_bytes": block_bytes, "rounds": a.rounds}
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
            #    that stays in cache (iperf's way; the higher figure). Measured again after the fetch
            #    rounds, with the servers still up: the baseline is the median of the rounds on both
            #    sides of the fetch, so a quieter or busier moment of the VM favours neither figure
            prefix_bytes = a.blocks * block_bytes
            raw_rounds = _raw_tcp(ns, prefix_bytes)
            # 2. peer fetch through two real servers
            flags = [f"--redis-url=redis://{ADDRS['a']}:{REDIS_PORT}", "--peer-allow-remote", f"--cluster-secret-file={secret}",
                     "--cluster-heartbeat-ms=200", "--cluster-stale-ms=1000"]
            # the prefixes A holds; B's rounds go through them in turn: B's pool holds 4, so by the time
            # a prefix comes round again B has evicted it and fetches it from A again (warm-up rounds
            # as long as the counted ones: they run the same code paths, e.g. the registry's
            # advertising of 2,048 fetched blocks)
            plan = [(f"bench{r}", a.blocks) for r in range(a.prefixes)]
            saved_blocks = sum(n for _, n in plan)
            pool_a = f"{(saved_blocks * block_bytes >> 20) + 256}mb"
            pool_b = f"{(4 * a.blocks * block_bytes >> 20)}mb"
            # pools committed at start (--prefault-threads), as for a production pool: the fetch then
            # writes into resident pages, as the raw TCP receiver does into its reused buffer
            sa = start_server(tmp / "a.pool", pool_size=pool_a, netns=ns["a"],
                              extra=[*flags, f"--peer-addr={ADDRS['a']}:7301", "--prefault-threads=2"])
            servers.append(sa)
            sb = start_server(tmp / "b.pool", pool_size=pool_b, netns=ns["b"],
                              extra=[*flags, f"--peer-addr={ADDRS['b']}:7301", "--prefault-threads=2"])
            servers.append(sb)
            _agent(ns["a"], sa, "save", "--instance", "save", "--seed", "-", "--stdin", "--layers", str(a.layers),
                   stdin="".join(f"{seed} {n}\n" for seed, n in plan))
            deadline = time.time() + 30
            while sa.metric("pegaflow_registry_advertised_blocks_total") < saved_blocks:
                assert time.time() < deadline, "A did not advertise its blocks"
                time.sleep(0.05)
            ms, warm = _fetch_rounds(ns["b"], sb, [sa, sb], plan, a)
            report.update(warm)
            for key, after in _raw_tcp(ns, prefix_bytes).items():
                raw_rounds[key] += after
            for key, rounds in raw_rounds.items():
                report[key] = round(statistics.median(rounds), 3)
                report[key + "_rounds"] = rounds
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
                    phases[line.split('"')[1]] = round(float(line.rsplit(" ", 1)[1]) * 1e3 / (report["warmup_rounds"] + a.rounds), 1)
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
