"""The security tier: pegaflow-server against a hostile client written from the .proto alone.

Each case asserts the typed refusal, that the server stays healthy (Health answers), that no
other tenant's registration or bytes changed, and that the server's memory stays bounded. A
seeded fuzz of gRPC messages and local-socket frames (bounded count and time) runs here too.
Every case adds to ``TALLY``, written to ``out/security.json`` for docs/security.md.
"""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pegaflow import errors
from pegaflow._server import start_server
from pegaflow.engine import EngineClient

from bridge_helpers import BLOCKS, Cache, hashes

pytestmark = pytest.mark.security

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "client" / "src" / "main" / "proto" / "pegaflow.proto"
TALLY = {"cases": 0, "refused": 0, "crashes": 0, "hangs": 0, "bytes_changed": 0, "fuzz_messages": 0,
         "fuzz_frames": 0, "max_rss_growth_mib": 0.0}


@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    """pegaflow_pb2 / pegaflow_pb2_grpc generated from the .proto alone (no project code)."""
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("proto")
    assert protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={out}", f"--grpc_python_out={out}", str(PROTO)]) == 0
    sys.path.insert(0, str(out))
    import pegaflow_pb2
    import pegaflow_pb2_grpc

    yield pegaflow_pb2, pegaflow_pb2_grpc
    sys.path.remove(str(out))


@pytest.fixture(scope="module", autouse=True)
def tally():
    yield
    path = ROOT / "out" / "security.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(TALLY, indent=2) + "\n")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Hostile:
    """A client with the server's token (a tenant on the host) but its own client id."""

    def __init__(self, server, pb, token: str | None = "from-file", client_id: str = "ab" * 16):
        import grpc

        self.grpc = grpc
        self.pb, grpc_mod = pb
        self.channel = grpc.insecure_channel(server.endpoint)
        self.stub = grpc_mod.EngineStub(self.channel)
        self.meta = [("pegaflow-client-id", client_id)]
        if token == "from-file":
            token = server.token
        if token is not None:
            self.meta.append(("authorization", f"Bearer {token}"))

    def call(self, method: str, request, timeout: float = 5.0):
        return getattr(self.stub, method)(request, timeout=timeout, metadata=self.meta)

    def refused(self, method: str, request, *codes) -> str:
        """The call fails with one of ``codes``; returns its details."""
        TALLY["cases"] += 1
        with pytest.raises(self.grpc.RpcError) as e:
            self.call(method, request)
        if e.value.code() == self.grpc.StatusCode.DEADLINE_EXCEEDED:
            TALLY["hangs"] += 1
        assert e.value.code() in codes, f"{method}: {e.value.code()} {e.value.details()}"
        TALLY["refused"] += 1
        return e.value.details()

    def close(self):
        self.channel.close()


@pytest.fixture
def server(tmp_path):
    s = start_server(tmp_path / "pool", pool_size="32mb", grace_ms=100, extra=["--copy-timeout-secs", "2"])
    rss0 = rss_mib(s.proc.pid)
    yield s
    alive = s.proc.poll() is None
    if not alive:
        TALLY["crashes"] += 1
    else:
        TALLY["max_rss_growth_mib"] = max(TALLY["max_rss_growth_mib"], rss_mib(s.proc.pid) - rss0)
    s.stop()
    assert alive, "the server died under the hostile client:\n" + "".join(s.log)


@pytest.fixture
def victim(server):
    """An honest tenant with 2 saved blocks; ``check()`` loads them back byte for byte."""
    cache = Cache()
    client = EngineClient(server.endpoint, deadline_s=5)
    client.register_instance("victim", "ns", 1, 1)
    client.register_worker("victim", 0, 0, cache.regions())
    h = hashes(2)
    saved = [cache.fill(i) for i in range(2)]
    client.save("victim", 0, [0, 1], h).wait()

    def check():
        assert "victim" in server.instances(), "the victim's registration is gone"
        q = client.query("victim", h)
        assert q.hit_blocks == 2, "the victim's blocks are gone"
        client.load("victim", 0, q.lease, [BLOCKS - 2, BLOCKS - 1]).wait()
        for i, want in enumerate(saved):
            if cache.block(BLOCKS - 2 + i) != want:
                TALLY["bytes_changed"] += 1
                raise AssertionError("the victim's bytes changed")

    check.hashes = h  # what the victim stored (a hostile tenant may learn them: vLLM's hashes are of tokens)
    yield check
    client.close()


def healthy(server, pb) -> None:
    h = Hostile(server, pb, token=None)
    try:
        assert h.stub.Health(h.pb.HealthRequest(), timeout=5).server_version
    finally:
        h.close()


def test_calls_without_or_with_a_wrong_token_are_refused(server, pb, victim):
    pb2 = pb[0]
    for token in (None, "0" * 64, server.token[:-1] + "x", ""):
        h = Hostile(server, pb, token=token)
        try:
            codes = (h.grpc.StatusCode.UNAUTHENTICATED,)
            h.refused("Shutdown", pb2.Empty(), *codes)
            h.refused("UnregisterInstance", pb2.UnregisterInstanceRequest(instance_id="victim"), *codes)
            h.refused("Query", pb2.QueryRequest(instance_id="victim", hashes=b"", hash_len=0), *codes)
            h.refused("Stats", pb2.StatsRequest(), *codes)
            h.refused("RegisterInstance", pb2.RegisterInstanceRequest(client_version="0.1.0", instance_id="x",
                                                                       namespace="ns", tp_size=1, world_size=1), *codes)
        finally:
            h.close()
    assert oct(os.stat(f"{server.pool_path}.token").st_mode & 0o777) == "0o600"
    healthy(server, pb)
    victim()


def test_another_tenant_cannot_end_release_load_unregister_or_hijack_the_session(server, pb, victim):
    pb2 = pb[0]
    h = Hostile(server, pb)
    g = h.grpc.StatusCode
    try:
        # its own instance in the same namespace: a real tenant, with real ids of its own
        h.call("RegisterInstance", pb2.RegisterInstanceRequest(client_version="0.1.0", instance_id="hostile",
                                                               namespace="ns-hostile", tp_size=1, world_size=1))
        h.call("RegisterWorker", pb2.RegisterWorkerRequest(instance_id="hostile", worker_rank=0, tp_rank=0, layers=[
            pb2.LayerRegion(name=f"layers.{i}", layout=pb2.SPLIT_KV, base_address=(1 << 40) + i * (1 << 30),
                            region_bytes=2 * BLOCKS * 4096, num_blocks=BLOCKS, block_stride=4096, segment_bytes=4096,
                            segment_offset=BLOCKS * 4096) for i in range(2)]))
        # a lease on the victim's prefix (querying a known instance id is allowed to token holders) ...
        q = h.call("Query", pb2.QueryRequest(instance_id="victim", hashes=b"".join(victim.hashes), hash_len=32))
        assert q.hit_blocks == 2
        # ... cannot be released, loaded or ended under another instance
        assert "not issued to instance 'hostile'" in h.refused(
            "Release", pb2.ReleaseRequest(instance_id="hostile", lease=q.lease), g.PERMISSION_DENIED)
        h.refused("BeginLoad", pb2.BeginLoadRequest(instance_id="hostile", worker_rank=0, lease=q.lease,
                                                    dst_block_ids=[0, 1]), g.PERMISSION_DENIED)
        plan = h.call("ReserveSave", pb2.ReserveSaveRequest(instance_id="hostile", worker_rank=0, block_ids=[3],
                                                             hashes=os.urandom(32), hash_len=32))
        assert len(plan.id) == 16 and plan.id != b"\0" * 16
        h.refused("EndCopy", pb2.EndCopyRequest(instance_id="victim", id=plan.id, ok=True), g.PERMISSION_DENIED)
        h.call("EndCopy", pb2.EndCopyRequest(instance_id="hostile", id=plan.id, ok=False))
        # a load planned in parts (plan_blocks, then LoadRest): the rest of its plan is the
        # issuing instance's and worker's only, within the lease's blocks
        own = os.urandom(64)
        saved = h.call("ReserveSave", pb2.ReserveSaveRequest(instance_id="hostile", worker_rank=0, block_ids=[4, 5],
                                                              hashes=own, hash_len=32))
        h.call("EndCopy", pb2.EndCopyRequest(instance_id="hostile", id=saved.id, ok=True))
        mine = h.call("Query", pb2.QueryRequest(instance_id="hostile", hashes=own, hash_len=32))
        assert mine.hit_blocks == 2
        head = h.call("BeginLoad", pb2.BeginLoadRequest(instance_id="hostile", worker_rank=0, lease=mine.lease,
                                                        dst_block_ids=[6, 7], plan_blocks=1))
        assert head.blocks == 2 and set(head.run_block) == {0}
        h.refused("LoadRest", pb2.LoadRestRequest(instance_id="victim", worker_rank=0, id=head.id, from_block=1,
                                                  to_block=2), g.PERMISSION_DENIED)
        h.refused("LoadRest", pb2.LoadRestRequest(instance_id="hostile", worker_rank=1, id=head.id, from_block=1,
                                                  to_block=2), g.PERMISSION_DENIED)
        for lo, hi in ((1, 3), (-1, 1), (2, 1)):
            h.refused("LoadRest", pb2.LoadRestRequest(instance_id="hostile", worker_rank=0, id=head.id, from_block=lo,
                                                      to_block=hi), g.INVALID_ARGUMENT)
        h.refused("LoadRest", pb2.LoadRestRequest(instance_id="hostile", worker_rank=0, id=saved.id, from_block=0,
                                                  to_block=1), g.INVALID_ARGUMENT)  # ended: no longer open
        rest = h.call("LoadRest", pb2.LoadRestRequest(instance_id="hostile", worker_rank=0, id=head.id, from_block=1,
                                                      to_block=2))
        assert rest.blocks == 2 and set(rest.run_block) == {1} and rest.id == head.id
        h.call("EndCopy", pb2.EndCopyRequest(instance_id="hostile", id=head.id, ok=False))
        # guessed ids: 128 random bits each
        rnd = random.Random(7)
        for _ in range(200):
            h.refused("EndCopy", pb2.EndCopyRequest(instance_id="victim", id=rnd.randbytes(16), ok=True),
                      g.INVALID_ARGUMENT)
            h.refused("Release", pb2.ReleaseRequest(instance_id="victim", lease=rnd.randbytes(16)), g.FAILED_PRECONDITION)
            h.refused("LoadRest", pb2.LoadRestRequest(instance_id="victim", worker_rank=0, id=rnd.randbytes(16),
                                                      from_block=0, to_block=1), g.INVALID_ARGUMENT)
        # the victim's registration: not this client's to drop, by unregistering or by its session
        h.refused("UnregisterInstance", pb2.UnregisterInstanceRequest(instance_id="victim"), g.PERMISSION_DENIED)
        TALLY["cases"] += 1
        with pytest.raises(h.grpc.RpcError) as session:
            next(h.stub.Session(pb2.SessionRequest(instance_id="victim", client_id="ab" * 16), metadata=h.meta,
                                timeout=5))
        assert session.value.code() == g.PERMISSION_DENIED
        TALLY["refused"] += 1
        time.sleep(0.5)  # past the session grace
        h.call("Release", pb2.ReleaseRequest(instance_id="victim", lease=q.lease))  # the lease was issued to "victim"
    finally:
        h.close()
    healthy(server, pb)
    victim()


def test_oversized_counts_and_strings_are_refused_before_allocation(server, pb, victim):
    pb2 = pb[0]
    h = Hostile(server, pb, client_id="cd" * 16)
    g = h.grpc.StatusCode
    big = (g.INVALID_ARGUMENT, g.RESOURCE_EXHAUSTED)
    try:
        h.refused("RegisterInstance", pb2.RegisterInstanceRequest(client_version="0.1.0", instance_id="w", namespace="ns",
                                                                   tp_size=1, world_size=1 << 28), *big)
        h.refused("RegisterInstance", pb2.RegisterInstanceRequest(client_version="0.1.0", instance_id="i" * (4 << 20),
                                                                   namespace="ns", tp_size=1, world_size=1), *big)
        h.call("RegisterInstance", pb2.RegisterInstanceRequest(client_version="0.1.0", instance_id="many", namespace="ns2",
                                                               tp_size=1, world_size=1))
        layer = pb2.LayerRegion(layout=pb2.MLA, base_address=1 << 40, region_bytes=4096, num_blocks=1, block_stride=4096,
                                segment_bytes=4096)
        layers = [pb2.LayerRegion(name=f"l{i}", layout=layer.layout, base_address=(1 << 40) + i * 4096,
                                  region_bytes=4096, num_blocks=1, block_stride=4096, segment_bytes=4096)
                  for i in range(120_000)]
        t0 = time.perf_counter()
        h.refused("RegisterWorker", pb2.RegisterWorkerRequest(instance_id="many", worker_rank=0, tp_rank=0,
                                                              layers=layers), *big)
        assert time.perf_counter() - t0 < 5, "120k layers must be refused (or checked) quickly"
        h.refused("EndCopy", pb2.EndCopyRequest(instance_id="many", id=b"\1" * 16, ok=True, bytes=-1), *big)
        h.refused("Query", pb2.QueryRequest(instance_id="victim", hashes=os.urandom(33), hash_len=32), *big)
        registered = server.instances()
        assert "w" not in registered and not any(len(i) > 1000 for i in registered), "a refused instance was kept"
    finally:
        h.close()
    healthy(server, pb)
    victim()


def _frames(sock_path: str):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(sock_path)
    return s


def _ask(s, method: int, payload: bytes) -> tuple[int, bytes]:
    s.sendall(struct.pack(">iB", 1 + len(payload), method) + payload)
    head = b""
    while len(head) < 5:
        chunk = s.recv(5 - len(head))
        if not chunk:
            raise ConnectionError("closed")
        head += chunk
    length, status = struct.unpack(">iB", head)
    body = b""
    while len(body) < length - 1:
        chunk = s.recv(length - 1 - len(body))
        if not chunk:
            raise ConnectionError("closed")
        body += chunk
    return status, body


def test_local_socket_needs_the_token_first_and_survives_a_frame_flood(server, pb, victim):
    pb2 = pb[0]
    health = Hostile(server, pb, token=None)
    sock_path = health.stub.Health(pb2.HealthRequest(), timeout=5).local_socket
    health.close()
    assert sock_path and oct(os.stat(sock_path).st_mode & 0o777) == "0o600"
    query = pb2.QueryRequest(instance_id="victim", hashes=b"".join(hashes(2)), hash_len=32).SerializeToString()
    # no token first: refused and closed
    TALLY["cases"] += 1
    s = _frames(sock_path)
    status, body = _ask(s, 1, query)
    assert status == errors.PermissionDeniedError.code, body
    TALLY["refused"] += 1
    s.close()
    # a wrong token
    TALLY["cases"] += 1
    s = _frames(sock_path)
    assert _ask(s, 3, b"0" * 64)[0] == errors.PermissionDeniedError.code
    TALLY["refused"] += 1
    s.close()
    # 40 connections announcing 64 MiB frames, then stalling
    rss0 = rss_mib(server.proc.pid)
    flood = []
    for _ in range(40):
        try:
            c = _frames(sock_path)
            c.sendall(struct.pack(">iB", 64 << 20, 3) + b"x" * 1024)
            flood.append(c)
        except OSError:
            pass  # refused beyond the connection cap: fine
    TALLY["cases"] += 1
    time.sleep(0.5)
    grown = rss_mib(server.proc.pid) - rss0
    TALLY["max_rss_growth_mib"] = max(TALLY["max_rss_growth_mib"], grown)
    assert grown < 256, f"server RSS grew {grown:.0f} MiB under a frame flood"
    # an honest client is still answered (over gRPC or the socket)
    healthy(server, pb)
    victim()
    for c in flood:
        c.close()
    TALLY["refused"] += 1


def test_a_sigkilled_sessionless_client_leaves_nothing_behind(server, pb, victim, tmp_path):
    """A raw client (no Session stream) reserves a save and begins a load, then is SIGKILLed:
    after the copy TTL (2 s here) both are rolled back and the pool is back to its resident bytes."""
    script = tmp_path / "dying.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys, grpc
        sys.path.insert(0, {str(Path(pb[0].__file__).parent)!r})
        import pegaflow_pb2 as pb, pegaflow_pb2_grpc as rpc
        meta = [("authorization", "Bearer {server.token}"), ("pegaflow-client-id", "ee" * 16)]
        stub = rpc.EngineStub(grpc.insecure_channel("{server.endpoint}"))
        stub.RegisterInstance(pb.RegisterInstanceRequest(client_version="0.1.0", instance_id="dying",
                              namespace="ns-dying", tp_size=1, world_size=1), metadata=meta)
        stub.RegisterWorker(pb.RegisterWorkerRequest(instance_id="dying", worker_rank=0, tp_rank=0, layers=[
            pb.LayerRegion(name=f"layers.{{i}}", layout=pb.SPLIT_KV, base_address=(1 << 40) + i * (1 << 30),
                           region_bytes=2 * {BLOCKS} * 4096, num_blocks={BLOCKS}, block_stride=4096, segment_bytes=4096,
                           segment_offset={BLOCKS} * 4096) for i in range(2)]), metadata=meta)
        h = os.urandom(64)
        saved = stub.ReserveSave(pb.ReserveSaveRequest(instance_id="dying", worker_rank=0, block_ids=[1, 2], hashes=h,
                                 hash_len=32), metadata=meta)
        stub.EndCopy(pb.EndCopyRequest(instance_id="dying", id=saved.id, ok=True, bytes=1), metadata=meta)
        q = stub.Query(pb.QueryRequest(instance_id="dying", hashes=h, hash_len=32), metadata=meta)
        stub.BeginLoad(pb.BeginLoadRequest(instance_id="dying", worker_rank=0, lease=q.lease, dst_block_ids=[7, 8]),
                       metadata=meta)
        stub.ReserveSave(pb.ReserveSaveRequest(instance_id="dying", worker_rank=0, block_ids=[5, 6],
                         hashes=os.urandom(64), hash_len=32), metadata=meta)
        print("open", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert "open" in proc.stdout, proc.stderr
    assert server.metric("pegaflow_pool_used_bytes") > server.metric("pegaflow_cache_resident_bytes"), \
        "the dead client's open save claimed pool space"
    assert server.metric("pegaflow_pinned_blocks") == 2, "its open load pins its blocks"
    TALLY["cases"] += 1
    deadline = time.monotonic() + 20  # copy TTL 2 s, swept every 0.5 s
    while time.monotonic() < deadline:
        if server.metric("pegaflow_copies_expired_total") >= 2:
            break
        time.sleep(0.2)
    assert server.metric("pegaflow_copies_expired_total") >= 2
    assert server.metric("pegaflow_pool_used_bytes") == server.metric("pegaflow_cache_resident_bytes"), \
        "the pool is back to its resident bytes"
    assert server.metric("pegaflow_pinned_blocks") == 0
    TALLY["refused"] += 1
    healthy(server, pb)
    victim()


def test_seeded_fuzz_of_grpc_messages_and_local_socket_frames(server, pb, victim):
    """Random bytes as every method's request and as local-socket frames (with and without the
    token first): each is refused or answered, never a crash or a hang."""
    import grpc

    seed = int(os.environ.get("PEGAFLOW_FUZZ_SEED", "20261130"))
    rnd = random.Random(seed)
    h = Hostile(server, pb, client_id="ff" * 16)
    methods = ["RegisterInstance", "RegisterWorker", "UnregisterInstance", "ReserveSave", "Query", "Release",
               "BeginLoad", "LoadRest", "EndCopy", "Stats"]
    end = time.monotonic() + 60
    try:
        for i in range(600):
            if time.monotonic() > end:
                break
            method = rnd.choice(methods)
            raw = h.channel.unary_unary(f"/pegaflow.v1.Engine/{method}", request_serializer=None,
                                        response_deserializer=None)
            body = rnd.randbytes(rnd.choice([0, 1, 7, 64, 512, 4096]))
            TALLY["fuzz_messages"] += 1
            try:
                raw(body, timeout=5, metadata=h.meta)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    TALLY["hangs"] += 1
                    raise AssertionError(f"seed {seed} message {i} ({method}) hung")
        sock_path = h.stub.Health(pb[0].HealthRequest(), timeout=5).local_socket
        for i in range(300):
            if time.monotonic() > end:
                break
            TALLY["fuzz_frames"] += 1
            s = _frames(sock_path)
            try:
                if rnd.random() < 0.5:
                    _ask(s, 3, server.token.encode())
                method = rnd.choice([0, 1, 2, 3, 4, 255])
                length = rnd.choice([1, 2, 17, 300, 5000])
                payload = rnd.randbytes(length - 1)
                try:
                    _ask(s, method, payload)
                except (ConnectionError, socket.timeout, OSError):
                    pass  # closed on a bad frame: fine
            finally:
                s.close()
    finally:
        h.close()
    healthy(server, pb)
    victim()
