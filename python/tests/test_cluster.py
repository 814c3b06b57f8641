"""Cross-node sharing (docs/cluster.md) on three hosts made of network namespaces on this
machine: each has its own address on a bridge the test builds, a pegaflow-server, and vLLM-side
work run inside it (pegaflow.bench.cluster_agent); redis-server (Debian's package) runs on host A. The
namespaces, links and processes are made and removed by the tests; traffic stays between them."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bridge_helpers import wait_until
from pegaflow._server import in_netns, start_server
from pegaflow.bench import netns

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")]

HOSTS = {"a": "10.77.0.1", "b": "10.77.0.2", "c": "10.77.0.3"}
PREFIX = f"pft{os.getpid() % 10000}"  # namespaces and links of this run
REDIS_PORT = 6390
PEER_PORT = 7100
FAST = ["--cluster-heartbeat-ms=200", "--cluster-stale-ms=1000", "--peer-fetch-deadline-secs=10"]


def ns(host: str) -> str:
    return f"{PREFIX}-{host}"


@pytest.fixture(scope="module")
def network():
    with netns.hosts(HOSTS, PREFIX):
        yield


class Redis:
    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.proc = None

    def start(self):
        self.proc = netns.redis_server(ns("a"), HOSTS["a"], REDIS_PORT, self.workdir)
        assert self.ping()

    def ping(self) -> bool:
        try:
            return self.command(b"PING") == b"+PONG\r\n"
        except OSError:
            return False

    def command(self, *args: bytes) -> bytes:
        """One RESP command from host B (binary-safe arguments)."""
        with in_netns(ns("b")), socket.create_connection((HOSTS["a"], REDIS_PORT), timeout=2) as s:
            s.sendall(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
            return s.recv(65536)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def redis(network, tmp_path_factory):
    r = Redis(tmp_path_factory.mktemp("redis"))
    r.start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def secret(tmp_path_factory) -> Path:
    f = tmp_path_factory.mktemp("secret") / "cluster.secret"
    f.write_text(os.urandom(24).hex())
    f.chmod(0o600)
    return f


def host_server(tmp: Path, host: str, secret: Path, port: int = PEER_PORT, extra: list[str] | None = None,
                advertise: str | None = None, secret_flag: str = "--cluster-secret-file"):
    flags = [f"--redis-url=redis://{HOSTS['a']}:{REDIS_PORT}", f"--peer-addr={HOSTS[host]}:{port}", "--peer-allow-remote",
             f"{secret_flag}={secret}", *FAST, *(extra or [])]
    if secret_flag == "--auth-token-file":  # the operator says the server secret is the cluster's too
        flags.append("--cluster-secret-from-auth-token")
    if advertise:
        flags.append(f"--peer-advertise-addr={advertise}")
    return start_server(tmp / f"{host}-{port}.pool", pool_size="64mb", extra=flags, netns=ns(host))


def agent(host: str, server, op: str, seed: str, blocks: int = 8, timeout: float = 20.0, flush: bool = False) -> dict:
    out = subprocess.run(["ip", "netns", "exec", ns(host), sys.executable, "-m", "pegaflow.bench.cluster_agent", op, "--endpoint", server.endpoint,
                          "--instance", f"{op}-{seed}-{host}", "--seed", seed, "--blocks", str(blocks),
                          "--timeout", str(timeout)] + (["--flush"] if flush else []),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def health(server) -> dict:
    return json.loads(server.http("/health")[1])


def wait_peers(server, n: int):
    wait_until(lambda: health(server)["cluster"]["live_peers"] == n, f"{n} live peers", timeout=15)


@pytest.fixture(scope="module")
def cluster(redis, secret, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hosts")
    servers = {h: host_server(tmp, h, secret) for h in HOSTS}
    for s in servers.values():
        wait_peers(s, 2)
    yield servers
    for s in servers.values():
        s.stop()


def test_host_b_is_served_a_prefix_saved_on_host_a_byte_identical(cluster):
    a, b = cluster["a"], cluster["b"]
    assert agent("a", a, "save", "shared")["saved"] == 8
    wait_until(lambda: a.metric("pegaflow_registry_advertised_blocks_total") >= 8, "A advertised its blocks")
    got = agent("b", b, "fetch", "shared")
    assert got["hit"] == 8 and got["identical"] and got["not_yet"] >= 1, got
    assert b.metric("pegaflow_cache_tier_peer_blocks_total") == 8
    assert a.metric("pegaflow_peer_served_blocks_total") == 8
    wait_until(lambda: health(a)["cluster"]["transfer_pins"] == 0, "A's transfer lock released")
    # a prefix nobody holds is a plain miss after one lookup
    assert agent("b", b, "fetch", "nobody")["hit"] == 0


def test_the_flush_barrier_makes_a_save_visible_to_other_hosts_when_it_returns(cluster):
    """flush (C ABI, PegaEngine.flush): the Flush RPC returns after the server's registry sent
    the advertisements of every save ended before it, so another host finds the blocks with no
    waiting on A's side (the prefill node's "KV ready" signal)."""
    a, b = cluster["a"], cluster["b"]
    before = a.metric("pegaflow_registry_advertised_blocks_total")
    assert agent("a", a, "save", "flushed", flush=True)["saved"] == 8
    assert a.metric("pegaflow_registry_advertised_blocks_total") >= before + 8  # already sent, not queued
    got = agent("b", b, "fetch", "flushed")
    assert got["hit"] == 8 and got["identical"], got


def test_a_host_whose_heartbeat_or_clock_is_stale_is_never_chosen(cluster, redis):
    c, b = cluster["c"], cluster["b"]
    assert agent("c", c, "save", "stale")["saved"] == 8
    wait_until(lambda: c.metric("pegaflow_registry_advertised_blocks_total") >= 8, "C advertised")
    os.kill(c.proc.pid, signal.SIGSTOP)  # C stops heart-beating (and answering) but its key lives until its TTL
    try:
        time.sleep(1.3)  # past --cluster-stale-ms
        got = agent("b", b, "fetch", "stale", timeout=5)
        assert got["hit"] == 0 and got["seconds"] < 2, got  # never waited on the frozen host
    finally:
        os.kill(c.proc.pid, signal.SIGCONT)
    wait_peers(b, 2)
    # a record of a host whose clock runs 60 s ahead, claiming a prefix: never chosen
    hashes = [hashlib.sha256(f"ahead/{i}".encode()).digest() for i in range(4)]
    tag = b"pf" + hashlib.sha256(b"ns-cluster").digest()[:6]
    future = int(time.time() * 1000) + 60_000
    assert redis.command(b"SET", b"pf:node:200", f"{'f' * 36} {HOSTS['c']}:1 {future}".encode(), b"PX", b"5000") == b"+OK\r\n"
    for h in hashes:
        redis.command(b"SETBIT", tag + h, b"200", b"1")
    got = agent("b", b, "fetch", "ahead", blocks=4, timeout=5)
    assert got["hit"] == 0 and got["seconds"] < 2, got
    assert b.metric("pegaflow_peer_fetch_failures_total") == 0, "the fake host was never contacted"


def test_redis_stopped_then_restarted_local_only_then_shared_again(cluster, redis):
    a, b = cluster["a"], cluster["b"]
    redis.stop()
    wait_until(lambda: not health(b)["cluster"]["registry_connected"], "B notices Redis is gone")
    assert agent("a", a, "save", "outage")["saved"] == 8  # saving works alone
    got = agent("b", b, "fetch", "outage", timeout=5)
    assert got["hit"] == 0 and got["seconds"] < 2, got  # local only: a miss, no error, no wait
    redis.start()  # empty: every host advertises its resident blocks again
    wait_until(lambda: health(a)["cluster"]["registry_connected"] and health(b)["cluster"]["live_peers"] == 2,
               "hosts back in the registry", timeout=15)
    wait_until(lambda: a.metric("pegaflow_registry_resyncs_total") >= 1, "A re-advertised")
    time.sleep(0.5)
    got = agent("b", b, "fetch", "outage")
    assert got["hit"] == 8 and got["identical"], got


class Relay:
    """A TCP relay on host C in front of a peer channel: ``flip`` corrupts one payload byte of
    every block it relays; ``rate`` (bytes/s) slows it so a fetch can be interrupted."""

    def __init__(self, target: tuple[str, int], port: int, flip: bool = False, rate: int = 0):
        code = f"""
import socket, threading, time
flip, rate, target = {flip!r}, {rate!r}, {target!r}
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(({HOSTS['c']!r}, {port})); ls.listen(8); print('ready', flush=True)
def pump(src, dst, down):
    marker, seen, pos, head, flips = b'PFBAT2', b'', -1, b'', set()
    try:
        while True:
            data = src.recv(65536 if not rate else 16384)
            if not data: break
            if down and flip:
                data = bytearray(data)
                for k in range(len(data)):
                    if pos >= 0:  # inside a batch: u16 blocks, u64 length, 8 bytes per block, payloads
                        if pos < 10:
                            head += bytes([data[k]])
                            if pos == 9:
                                m, n = int.from_bytes(head[:2], 'big'), int.from_bytes(head[2:], 'big')
                                flips = {{10 + 8 * m + j * n + 100 for j in range(m)}}
                        elif pos in flips:
                            data[k] ^= 0x5A
                            flips.discard(pos)
                            if not flips: pos = -2
                        pos += 1
                        continue
                    seen = (seen + bytes([data[k]]))[-6:]
                    if seen == marker: pos, head, seen = 0, b'', b''
                data = bytes(data)
            dst.sendall(data)
            if down and rate: time.sleep(len(data) / rate)
    except OSError: pass
    finally:
        src.close(); dst.close()
while True:
    c, _ = ls.accept(); u = socket.create_connection(target)
    threading.Thread(target=pump, args=(c, u, False), daemon=True).start()
    threading.Thread(target=pump, args=(u, c, True), daemon=True).start()
"""
        self.proc = subprocess.Popen(["ip", "netns", "exec", ns("c"), sys.executable, "-c", code], stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def close(self):
        self.proc.kill()
        self.proc.wait(10)


def test_a_checksum_mismatch_on_the_wire_is_a_miss_never_wrong_bytes(cluster, secret, tmp_path):
    b = cluster["b"]
    relay_port = PEER_PORT + 50
    relay = Relay((HOSTS["a"], PEER_PORT + 1), relay_port, flip=True)
    a2 = host_server(tmp_path, "a", secret, port=PEER_PORT + 1, advertise=f"{HOSTS['c']}:{relay_port}")
    try:
        wait_peers(b, 3)
        assert agent("a", a2, "save", "flipped", blocks=4)["saved"] == 4
        wait_until(lambda: a2.metric("pegaflow_registry_advertised_blocks_total") >= 4, "A2 advertised")
        got = agent("b", b, "fetch", "flipped", blocks=4)
        assert got["hit"] == 0, got
        assert b.metric("pegaflow_peer_checksum_failures_total") == 4
    finally:
        a2.stop()
        relay.close()


def test_the_owner_sigkilled_mid_fetch_is_a_miss_and_leaves_no_lock(cluster, secret, tmp_path):
    b = cluster["b"]
    relay_port = PEER_PORT + 60
    relay = Relay((HOSTS["a"], PEER_PORT + 2), relay_port, rate=1 << 20)  # 1 MiB/s: 16 blocks of 64 KiB take ~1 s
    a3 = host_server(tmp_path, "a", secret, port=PEER_PORT + 2, advertise=f"{HOSTS['c']}:{relay_port}")
    try:
        wait_peers(b, 3)
        assert agent("a", a3, "save", "killed", blocks=16)["saved"] == 16
        wait_until(lambda: a3.metric("pegaflow_registry_advertised_blocks_total") >= 16, "A3 advertised")
        result = {}
        t = threading.Thread(target=lambda: result.update(agent("b", b, "fetch", "killed", blocks=16, timeout=30)))
        t.start()
        wait_until(lambda: health(a3)["cluster"]["transfer_pins"] == 1, "the fetch started (A3 pinned the blocks)")
        time.sleep(0.3)
        a3.stop(kill=True)
        relay.close()  # and what was in flight from it: the host is gone, not only its process
        t.join(60)
        assert result["hit"] < 16 and result["identical"], result  # what arrived intact may be served; the rest recomputed
        wait_until(lambda: health(b)["cluster"]["transfer_pins"] == 0, "no lock left on B")
        assert b.metric("pegaflow_inflight_blocks") == 0, "no reservation left behind"
        assert b.metric("pegaflow_peer_fetch_failures_total") >= 1
    finally:
        a3.stop()
        relay.close()


def _certs(d: Path, ca_name: str, hosts: list[str]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    run = lambda *a: subprocess.run(a, check=True, capture_output=True, cwd=d)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
        "-subj", f"/CN={ca_name}", "-keyout", "ca.key", "-out", "ca.pem")
    for h in hosts:
        run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={h}",
            "-keyout", f"{h}.key", "-out", f"{h}.csr")
        (d / f"{h}.ext").write_text(f"subjectAltName=IP:{HOSTS[h]}\n")
        run("openssl", "x509", "-req", "-in", f"{h}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", f"{h}.ext", "-out", f"{h}.pem")


def test_tls_between_hosts_and_a_wrong_certificate_is_refused(cluster, secret, tmp_path):
    """Mutual TLS between hosts whose cluster secret is the server secret they share."""
    good, rogue = tmp_path / "good", tmp_path / "rogue"
    _certs(good, "pegaflow-test-ca", ["a", "b"])
    _certs(rogue, "someone-else", ["c"])
    tls = lambda d, h: [f"--peer-tls-cert={d / (h + '.pem')}", f"--peer-tls-key={d / (h + '.key')}",  # noqa: E731
                        f"--peer-tls-ca={d / 'ca.pem'}"]
    port = PEER_PORT + 3
    # these hosts share the server secret of --auth-token-file (security.md) as their cluster secret
    ta = host_server(tmp_path, "a", secret, port=port, extra=tls(good, "a"), secret_flag="--auth-token-file")
    tb = host_server(tmp_path, "b", secret, port=port, extra=tls(good, "b"), secret_flag="--auth-token-file")
    tc = host_server(tmp_path, "c", secret, port=port, extra=tls(rogue, "c"), secret_flag="--auth-token-file")
    try:
        for s in (ta, tb, tc):
            wait_peers(s, 5)
        assert agent("a", ta, "save", "tls", blocks=4)["saved"] == 4
        wait_until(lambda: ta.metric("pegaflow_registry_advertised_blocks_total") >= 4, "advertised")
        got = agent("b", tb, "fetch", "tls", blocks=4)
        assert got["hit"] == 4 and got["identical"], got  # mutual TLS, same CA
        refused_before = ta.metric("pegaflow_peer_refused_connections_total")
        got = agent("c", tc, "fetch", "tls", blocks=4, timeout=10)
        assert got["hit"] == 0, got  # C's certificate chains to another CA
        assert ta.metric("pegaflow_peer_refused_connections_total") > refused_before or \
            tb.metric("pegaflow_peer_refused_connections_total") > 0
    finally:
        for s in (ta, tb, tc):
            s.stop()


def test_listening_beyond_loopback_needs_the_explicit_flag(network, secret, tmp_path):
    flags = [f"--redis-url=redis://{HOSTS['a']}:{REDIS_PORT}", f"--peer-addr={HOSTS['b']}:{PEER_PORT + 9}",
             f"--cluster-secret-file={secret}"]
    with pytest.raises(RuntimeError, match="listens beyond loopback; pass --peer-allow-remote"):
        start_server(tmp_path / "x.pool", extra=flags, netns=ns("b"))
