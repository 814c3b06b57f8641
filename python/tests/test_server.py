"""A real pegaflow-server on loopback, used from Python: the product's server mode, faults included."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bridge_helpers import Cache, hashes, settle, wait_until
from pegaflow import EngineClient, errors
from pegaflow._server import free_port, server_argv, start_server

pytestmark = pytest.mark.integration

PROTO = Path(__file__).resolve().parents[2] / "client" / "src" / "main" / "proto" / "pegaflow.proto"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start_server(tmp_path_factory.mktemp("pool") / "pool")
    yield s
    s.stop()
    assert s.proc.returncode == 128 + signal.SIGTERM, "SIGTERM stops the server through its shutdown hook"
    assert not s.pool_path.exists(), "a clean stop deletes the shared pool file"
    assert not Path(f"{s.pool_path}.sock").exists() and not Path(f"{s.pool_path}.lock").exists()


def test_health_is_json_and_metrics_parse_as_prometheus(server):
    from prometheus_client.parser import text_string_to_metric_families

    EngineClient(server.endpoint).close()  # one Health call, so the RPC metrics have a sample
    status, body = server.http("/health")
    health = json.loads(body)
    assert status == 200 and health["status"] == "serving" and health["version"] == "0.1.0"
    status, text = server.http("/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["pegaflow_pool_capacity_bytes"].type == "gauge"
    assert families["pegaflow_cache_block_hits"].type == "counter"
    assert families["pegaflow_rpc_duration_seconds"].type == "histogram"
    assert any(s.labels == {"method": "Health", "status": "OK"} for s in families["pegaflow_rpc_requests"].samples)
    assert server.http("/nope")[0] == 404


def test_an_independent_grpc_client_built_from_the_proto_alone_calls_health(server, tmp_path):
    import grpc
    from grpc_tools import protoc

    rc = protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}", str(PROTO)])
    assert rc == 0
    sys.path.insert(0, str(tmp_path))
    try:
        import pegaflow_pb2
        import pegaflow_pb2_grpc

        with grpc.insecure_channel(server.endpoint) as channel:
            stub = pegaflow_pb2_grpc.EngineStub(channel)
            health = stub.Health(pegaflow_pb2.HealthRequest(), timeout=5)
            assert health.server_version == "0.1.0" and health.pool_bytes > 0
            request = pegaflow_pb2.RegisterInstanceRequest(
                client_version="0.0.1", instance_id="old", namespace="ns", tp_size=1, world_size=1)
            with pytest.raises(grpc.RpcError) as anonymous:
                stub.RegisterInstance(request, timeout=5)
            assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED, "every call but Health needs the token"
            # the token is in the file Health names (0600: readable by the server's user)
            auth = [("authorization", "Bearer " + Path(health.token_path).read_text().strip())]
            with pytest.raises(grpc.RpcError) as refused:
                stub.RegisterInstance(request, timeout=5, metadata=auth)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "PegaFlow version mismatch: client 0.0.1, server 0.1.0" in refused.value.details()
    finally:
        sys.path.remove(str(tmp_path))


def test_two_vllm_instances_share_one_server(server):
    a_cache, b_cache = Cache(), Cache()
    with EngineClient(server.endpoint) as a, EngineClient(server.endpoint) as b:
        a.register_instance("vllm-a", "shared", 1, 1)
        a.register_worker("vllm-a", 0, 0, a_cache.regions())
        b.register_instance("vllm-b", "shared", 1, 1)
        b.register_worker("vllm-b", 0, 0, b_cache.regions())
        saved = [a_cache.fill(i) for i in range(3)]
        h = hashes(3)
        assert a.save("vllm-a", 0, [0, 1, 2], h).wait().blocks == 3
        a.flush()  # the visibility barrier: b is another client of the server
        q = b.query("vllm-b", h)
        assert q.hit_blocks == 3
        b.load("vllm-b", 0, q.lease, [5, 9, 13]).wait()
        assert [b_cache.block(i) for i in (5, 9, 13)] == saved
        assert sorted(server.instances()) == ["vllm-a", "vllm-b"]
        stats = b.stats()
        assert stats["pegaflow_cache_resident_blocks"] >= 3 and stats["pegaflow_active_leases"] == 0


@contextlib.contextmanager
def one_instance(tmp_path, name: str):
    """A pegaflow-server on a 16 MiB pool and a client with instance ``name`` (one worker of a
    small cache) registered: (server, client); both stopped after."""
    s = start_server(tmp_path / "pool", pool_size="16mb")
    cache = Cache()  # the worker's blocks: alive while the client copies from them
    try:
        with EngineClient(s.endpoint) as c:
            c.register_instance(name, f"ns-{name}", 1, 1)
            c.register_worker(name, 0, 0, cache.regions())
            yield s, c
    finally:
        s.stop()


def test_the_bench_reads_a_real_servers_query_phases(tmp_path):
    """pegaflow-bench ttft's worker reads, from a real pegaflow-server's /metrics, its calls and
    its store's time in the phases of the queries it answered (lookup, lease, and the plan of a
    load the query began): the per-phase figures of a warm request's server round trip."""
    from pegaflow.bench.ttft_worker import server_rpc

    with one_instance(tmp_path, "phases") as (s, c):
        known = hashes(4)
        c.save("phases", 0, [0, 1, 2, 3], known).wait()
        c.release("phases", c.query("phases", known).lease)
        got = server_rpc(f"http://127.0.0.1:{s.http_port}/metrics")
    assert got["server:calls:Query"] >= 1
    assert got["server:query_s:lookup"] > 0 and got["server:query_s:lease"] > 0
    assert got["server:query_s:plan"] == 0  # a plain query begins no load


def test_the_hit_rate_ceiling_counts_distinct_blocks_and_lookups_per_window(tmp_path):
    """pegaflow_hit_rate_ceiling{window}: the share of block lookups whose block was asked for before
    within the window (what a pool of unbounded size would serve), from a HyperLogLog per window."""
    from prometheus_client.parser import text_string_to_metric_families

    import hashlib

    # fixed hashes: 8 random ones share one of the sketch's 4,096 registers about once in 140 runs
    # (the estimate then reads 7.0, linear counting); these 8 do not
    fixed = [hashlib.sha256(b"ceiling-%d" % i).digest() for i in range(8)]
    known, unknown = fixed[:4], fixed[4:]
    with one_instance(tmp_path, "ceiling") as (s, c):
        c.save("ceiling", 0, [0, 1, 2, 3], known).wait()
        for _ in range(2):
            c.release("ceiling", c.query("ceiling", known).lease)
        c.query("ceiling", unknown)  # a miss: asked for, never stored
        text = s.http("/metrics")[1]
    samples = {(smp.name, smp.labels.get("window")): smp.value
               for f in text_string_to_metric_families(text) for smp in f.samples if "window" in smp.labels}
    assert {w for _, w in samples} == {"15m", "1h", "1d"}
    for w in ("15m", "1h", "1d"):
        assert samples[("pegaflow_window_block_lookups", w)] == 12
        assert samples[("pegaflow_distinct_blocks", w)] == pytest.approx(8, abs=0.5)
        assert samples[("pegaflow_hit_rate_ceiling", w)] == pytest.approx(1 - 8 / 12, abs=0.05)


def test_bad_input_gets_a_typed_error_and_nothing_is_lost(server):
    cache = Cache()
    with EngineClient(server.endpoint) as c:
        c.register_instance("strict", "ns-strict", 1, 1)
        c.register_worker("strict", 0, 0, cache.regions())
        cache.fill(0)
        h = hashes(1)
        c.save("strict", 0, [0], h).wait()
        before = c.stats()
        with pytest.raises(errors.UnknownInstanceError, match="instance 'ghost' is not registered"):
            c.query("ghost", h)
        with pytest.raises(errors.UnknownLeaseError):
            c.release("strict", b"\x07" * 16)
        with pytest.raises(errors.InvalidArgumentError, match="out of range"):
            c.save("strict", 0, [999], hashes(1))
        with pytest.raises(errors.InvalidArgumentError, match=r"expected at most 262144 \(Limits.MAX_HASHES_PER_CALL\)"):
            c.query("strict", [os.urandom(32)] * (3 << 20))  # 3M hashes: over the per-call cap
        with pytest.raises(errors.InvalidArgumentError, match=r"\(Limits.MAX_NAME_BYTES\)"):
            c.register_instance("x" * (4 << 20), "ns", 1, 1)
        with pytest.raises(errors.InvalidArgumentError, match=r"\(Limits.MAX_WORLD_SIZE\)"):
            c.register_instance("huge", "ns", 1, 1 << 28)
        with pytest.raises(errors.TopologyMismatchError):
            c.register_instance("strict", "another-ns", 1, 1)
        after = c.stats()
        gauges = [k for k in before if not k.endswith("_total")]
        assert {k: after[k] for k in gauges} == {k: before[k] for k in gauges}
        assert c.query("strict", h).hit_blocks == 1


def test_a_client_killed_mid_load_has_its_leases_released_within_5s_and_its_pins_after_their_hold(server):
    child = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from bridge_helpers import Cache, hashes
        from pegaflow import EngineClient
        c = EngineClient({server.endpoint!r})
        cache = Cache()
        c.register_instance("doomed", "ns-doomed", 1, 1)
        c.register_worker("doomed", 0, 0, cache.regions())
        h = hashes(8)
        for b in range(8):
            cache.fill(b)
        c.save("doomed", 0, list(range(8)), h).wait()
        held = c.query("doomed", h)          # a lease this process will never release
        print("holding", flush=True)
        while True:                          # and loads in flight when it dies
            q = c.query("doomed", h)
            c.load("doomed", 0, q.lease, list(range(8, 16))).wait()
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "holding", proc.stderr.read()
        assert "doomed" in server.instances()
        assert server.metric("pegaflow_active_leases") >= 1
        time.sleep(0.3)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        killed = time.perf_counter()
        while time.perf_counter() - killed < 5:
            if "doomed" not in server.instances() and server.metric("pegaflow_active_leases") == 0:
                break
            time.sleep(0.05)
        assert "doomed" not in server.instances(), "instance still registered 5 s after its client died"
        assert server.metric("pegaflow_active_leases") == 0
        # the pins of a load in flight at the kill stay for its plan's hold (10 s from issue: a
        # copier whose session was lost may still be reading them), then go
        while time.perf_counter() - killed < 15 and server.metric("pegaflow_pinned_blocks") != 0:
            time.sleep(0.1)
        assert server.metric("pegaflow_pinned_blocks") == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_killed_server_fails_calls_within_their_deadline_and_recovery_works(tmp_path):
    port = free_port()
    pool = tmp_path / "pool"
    first = start_server(pool, grpc_port=port)
    cache = Cache()
    try:
        client = EngineClient(f"127.0.0.1:{port}", deadline_s=1.0)
        client.register_instance("survivor", "ns-survivor", 1, 1)
        client.register_worker("survivor", 0, 0, cache.regions())
        h = hashes(2)
        saved = [cache.fill(i) for i in range(2)]
        client.save("survivor", 0, [0, 1], h).wait()
        first.stop(kill=True)
        assert pool.exists(), "a crashed server leaves its pool file for the next one"
        t0 = time.perf_counter()
        with pytest.raises(errors.ServerUnavailableError, match=f"127.0.0.1:{port}"):
            client.query("survivor", h)
        assert time.perf_counter() - t0 < 3.0, "a call to a dead server must fail within its deadline"
        second = start_server(pool, grpc_port=port)
        try:
            # The new server knows nothing: the client registers again, as the connector does.
            deadline = time.perf_counter() + 10
            while True:
                try:
                    client.register_instance("survivor", "ns-survivor", 1, 1)
                    break
                except errors.ServerUnavailableError:
                    if time.perf_counter() > deadline:
                        raise
                    time.sleep(0.1)
            client.register_worker("survivor", 0, 0, cache.regions())
            assert client.query("survivor", h).hit_blocks == 0, "the cache died with the server"
            client.save("survivor", 0, [0, 1], h).wait()
            q = client.query("survivor", h)
            client.load("survivor", 0, q.lease, [6, 7]).wait()
            assert [cache.block(6), cache.block(7)] == saved, "saves and loads work on the restarted server"
        finally:
            client.close()
            second.stop()
    finally:
        first.stop(kill=True)


def _files(directory: Path) -> dict[str, tuple[int, int, int, int]]:
    """Each file's identity, size, mode and modification time (nothing may change)."""
    return {p.name: (p.lstat().st_ino, p.lstat().st_size, p.lstat().st_mode, p.lstat().st_mtime_ns)
            for p in directory.iterdir()}


@pytest.mark.security  # also in the security tier: a second server must not hurt the live one
def test_a_second_server_on_a_live_servers_port_and_pool_is_refused_and_changes_nothing(tmp_path):
    port = free_port()
    pool = tmp_path / "pool"
    first = start_server(pool, grpc_port=port)
    cache = Cache()
    try:
        before = _files(tmp_path)
        second = subprocess.run(server_argv(pool, grpc_port=port), capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second.stdout + second.stderr
        assert pool.exists(), "the refused server left the first one's pool alone"
        # the console script execs the JVM, so the first server's pid is its process's
        assert f"in use by the server with pid {first.proc.pid} at 127.0.0.1:{port}" in second.stderr, second.stderr
        assert _files(tmp_path) == before, "the refused server changed nothing on disk"
        assert set(before) == {"pool", "pool.sock", "pool.lock", "pool.token", "pool.operator-token"}
        assert {name: stat.S_IMODE(v[2]) for name, v in before.items()} == {n: 0o600 for n in before}
        assert first.proc.poll() is None
        with EngineClient(first.endpoint) as c:
            c.register_instance("still", "ns-still", 1, 1)
            c.register_worker("still", 0, 0, cache.regions())  # maps the pool file
            cache.fill(0)
            h = hashes(1)
            c.save("still", 0, [0], h).wait()
            assert c.query("still", h).hit_blocks == 1
    finally:
        first.stop()
    assert not tmp_path.joinpath("pool").exists() and list(tmp_path.iterdir()) == []


@pytest.mark.security
def test_a_sigkilled_servers_pool_is_reclaimed_by_the_next_start(tmp_path):
    pool = tmp_path / "pool"
    first = start_server(pool)
    first.stop(kill=True)
    assert pool.exists(), "a crash leaves the files, with the lock free"
    second = start_server(pool)
    cache = Cache()
    try:
        log = "".join(second.log)
        assert f"reclaimed stale pool {pool}" in log and f"pid {first.proc.pid} at 127.0.0.1:{first.grpc_port}" in log, log
        assert stat.S_IMODE(pool.stat().st_mode) == 0o600
        assert set(_files(tmp_path)) == {"pool", "pool.sock", "pool.lock", "pool.token", "pool.operator-token"}
        assert Path(f"{pool}.lock").read_text() == f"pid={second.proc.pid}\naddr=127.0.0.1:{second.grpc_port}\n"
        with EngineClient(second.endpoint) as c:
            c.register_instance("again", "ns-again", 1, 1)
            c.register_worker("again", 0, 0, cache.regions())
            saved = cache.fill(0)
            h = hashes(1)
            c.save("again", 0, [0], h).wait()
            q = c.query("again", h)
            c.load("again", 0, q.lease, [3]).wait()
            assert cache.block(3) == saved
    finally:
        second.stop()
    assert list(tmp_path.iterdir()) == []


def test_a_server_with_an_owner_stops_when_the_owner_exits(tmp_path):
    """--owner-pid: the private server a vLLM instance starts for itself (mode auto across
    processes) does not outlive it, and removes its files on the way out."""
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    pool = tmp_path / "owned.pool"
    server = start_server(pool, extra=["--owner-pid", str(owner.pid)])
    try:
        assert server.http("/health")[0] == 200
        owner.kill()
        owner.wait()
        server.proc.wait(timeout=30)
    finally:
        server.stop(kill=True)
    assert server.proc.returncode == 0
    assert not pool.exists() and not Path(f"{pool}.token").exists()


def test_an_owner_pid_that_is_not_running_is_refused(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = subprocess.run(server_argv(tmp_path / "p.pool", extra=["--owner-pid", str(dead.pid)]),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and f"--owner-pid {dead.pid} is not a running process" in out.stderr


def test_a_sigkilled_servers_ssd_blocks_are_served_byte_identical_after_a_restart(tmp_path):
    """Blocks saved through the worker path reach the server's SSD tier; the server is
    SIGKILLed; a new one on the same SSD path rebuilds its index from the shard file and,
    after "not yet" answers while it reads them back, serves the same bytes."""
    ssd = tmp_path / "ssd"
    flags = [f"--ssd-cache-path={ssd}", "--ssd-cache-capacity=64mb"]
    cache = Cache()
    h = hashes(4)
    first = start_server(tmp_path / "pool", extra=flags)
    try:
        with EngineClient(first.endpoint) as c:
            c.register_instance("ssd-a", "ns-ssd", 1, 1)
            c.register_worker("ssd-a", 0, 0, cache.regions())
            saved = [cache.fill(i) for i in range(4)]
            assert c.save("ssd-a", 0, [0, 1, 2, 3], h).wait().blocks == 4
            wait_until(lambda: first.metric("pegaflow_ssd_write_blocks_total") == 4, "4 blocks written to SSD")
    finally:
        first.stop(kill=True)
    second = start_server(tmp_path / "pool", extra=flags)
    try:
        assert json.loads(second.http("/health")[1])["ssd_blocks"] == 4
        with EngineClient(second.endpoint) as c:
            c.register_instance("ssd-b", "ns-ssd", 1, 1)
            c.register_worker("ssd-b", 0, 0, cache.regions())
            q = settle(c, "ssd-b", h, expect_not_yet=4)
            assert q.hit_blocks == 4
            assert c.load("ssd-b", 0, q.lease, [10, 11, 12, 13]).wait().blocks == 4
            assert [cache.block(i) for i in (10, 11, 12, 13)] == saved
        assert second.metric("pegaflow_cache_tier_ssd_blocks_total") == 4
    finally:
        second.stop()


LOG_LINE = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z (ERROR|WARN|INFO|DEBUG|TRACE) \[[^\]]*\] [\w.$]+: "


def _records_of(server) -> list[str]:
    """Everything a server wrote from start to SIGTERM, with a refused call (a
    warning naming the client's bad input) and a clean stop in between; the ready line dropped."""
    import grpc

    with EngineClient(server.endpoint) as c:
        c.register_instance("logs-a", "ns-logs", 1, 1)
        with grpc.insecure_channel(server.endpoint) as ch:
            stats = ch.unary_unary("/pegaflow.v1.Engine/Stats")
            with pytest.raises(grpc.RpcError) as refused:
                stats(b"", metadata=[("authorization", "Bearer wrong")], timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    server.stop()
    time.sleep(0.2)  # the drain thread reads the last lines
    lines = [l.rstrip("\n") for l in server.log]
    assert not [l for l in lines if "SLF4J" in l], "no SLF4J 'no binder' noise: its users are bound to the same logger"
    return [l for l in lines if " ready grpc=" not in l]


def test_server_logs_one_line_per_record_without_slf4j_noise(tmp_path):
    """--log-level debug: PegaFlow's debug records show (the warm-up's time), each record is one
    line in the text format, a refusal's warning among them."""
    server = start_server(tmp_path / "pool", extra=["--log-level", "debug"])
    records = _records_of(server)
    assert len(records) >= 3, records
    bad = [l for l in records if not re.match(LOG_LINE, l)]
    assert bad == [], f"every line is one record '<ts> <LEVEL> [thread] logger: msg': {bad}"
    assert any(" DEBUG " in l and "warm-up took" in l for l in records)
    assert any(" WARN " in l and "refused requests" in l for l in records)


def test_a_server_that_cannot_warm_up_still_serves(tmp_path, monkeypatch):
    """The start-up warm-up is an optimisation: where its scratch server cannot be made (here no
    temporary directory), the server says so in a warning and serves."""
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", f"-Djava.io.tmpdir={tmp_path / 'absent'}")
    server = start_server(tmp_path / "pool")
    try:
        assert any(" WARN " in l and "warm-up skipped" in l for l in server.log), list(server.log)
        status, body = server.http("/health")
        assert status == 200 and json.loads(body)["status"] == "serving", body
    finally:
        server.stop()


def test_server_logs_json_lines_with_log_format_json(tmp_path):
    server = start_server(tmp_path / "pool", extra=["--log-format", "json", "--log-level", "debug"])
    records = [json.loads(l) for l in _records_of(server)]
    assert len(records) >= 3
    assert all(set(r) >= {"ts", "level", "logger", "thread", "msg"} for r in records)
    assert {"DEBUG", "INFO", "WARN"} <= {r["level"] for r in records}
    assert any(r["logger"] == "io.pegaflow.server.PegaflowServer" and r["msg"].startswith("pool: ") for r in records)


def test_a_log_level_or_format_outside_the_choices_is_refused_naming_the_flag(tmp_path):
    for flag, value in (("--log-level", "loud"), ("--log-format", "xml")):
        out = subprocess.run(server_argv(tmp_path / "p.pool", extra=[flag, value]), capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and f"{flag} '{value}'" in out.stderr, out.stderr
