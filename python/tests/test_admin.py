"""The operator's HTTP calls (/admin) on a real pegaflow-server: each changes what /metrics and a
following query show; bad input is a 4xx naming the field; no operator token, no call."""

from __future__ import annotations

import json

import pytest

from bridge_helpers import BLOCKS, Cache, hashes, wait_until
from pegaflow import EngineClient, errors
from pegaflow._server import start_server

pytestmark = pytest.mark.integration

SSD_FLAGS = ["--ssd-cache-capacity=64mb"]


def _samples(server) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(server.http("/metrics")[1]):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _admin_count(server, op: str, status: int) -> float:
    return _samples(server).get(("pegaflow_admin_requests_total", (("op", op), ("status", str(status)))), 0.0)


def _save(client, cache, instance: str, keys: list[bytes]) -> None:
    """Saves ``keys`` through device blocks 0.., BLOCKS at a time."""
    for i in range(0, len(keys), BLOCKS):
        run = keys[i:i + BLOCKS]
        for k in range(len(run)):
            cache.fill(k)
        assert client.save(instance, 0, list(range(len(run))), run).wait().blocks == len(run)


def _ssd_settled(server) -> None:
    """Waits until every sealed block was written to SSD or passed over (each is offered once)."""
    def settled():
        m = _samples(server)
        done = sum(m.get((f"pegaflow_ssd_write_{k}_total", ()), 0) for k in ("blocks", "skipped", "queue_full", "errors"))
        return done == m[("pegaflow_cache_block_insertions_total", ())]
    wait_until(settled, "the SSD tier's writes done")


def _read_back(client, instance: str, keys: list[bytes]) -> int:
    """Queries until the answer is not "not yet"; releases its lease; the hit."""
    answers = []
    wait_until(lambda: not answers.append(client.query(instance, keys)) and not answers[-1].pending_blocks, "read back from SSD")
    if answers[-1].lease is not None:
        client.release(instance, answers[-1].lease)
    return answers[-1].hit_blocks


def _registered(client, cache, instance: str, namespace: str, blocks: int) -> list[bytes]:
    """Registers a one-rank instance and saves ``blocks`` new blocks; their keys."""
    client.register_instance(instance, namespace, 1, 1)
    client.register_worker(instance, 0, 0, cache.regions())
    keys = hashes(blocks)
    _save(client, cache, instance, keys)
    return keys


def _prefix(namespace: str, keys: list[bytes]) -> dict:
    """The body of pin, unpin and warm."""
    return {"namespace": namespace, "hashes": [k.hex() for k in keys]}


def _hit(client, instance: str, keys: list[bytes]) -> int:
    q = client.query(instance, keys)
    if q.lease is not None:
        client.release(instance, q.lease)
    assert not q.pending_blocks, q
    return q.hit_blocks


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A 1 MiB pool (64 blocks of the test cache's 16 KiB) over a 64 MiB SSD tier."""
    d = tmp_path_factory.mktemp("admin")
    s = start_server(d / "pool", pool_size="1mb", extra=[f"--ssd-cache-path={d / 'ssd'}", *SSD_FLAGS])
    yield s
    s.stop()


def test_admin_calls_need_the_operator_token_and_refusals_are_counted(server):
    before = _samples(server)
    for path, body in [("status", None), ("clear", {"all": True}), ("pin", {"namespace": "x", "hashes": ["00"]})]:
        status, answer = server.admin(path, body, token=None)
        assert status == 401 and "Authorization: Bearer <operator token>" in answer["error"], answer
        status, answer = server.admin(path, body, token="0" * 64)
        assert status == 401, answer
        status, answer = server.admin(path, body, token="tenant")
        assert status == 403 and "the admin API is the operator's" in answer["error"]
        assert "operator-token" in answer["error"], "the refusal says where the operator token is"
    after = _samples(server)
    rejected = "pegaflow_rejected_requests_total"
    assert after[(rejected, (("reason", "unauthenticated"),))] - before.get((rejected, (("reason", "unauthenticated"),)), 0) == 6
    assert after[(rejected, (("reason", "operator_only"),))] - before.get((rejected, (("reason", "operator_only"),)), 0) == 3
    assert _admin_count(server, "clear", 401) >= 2 and _admin_count(server, "clear", 403) >= 1
    assert server.admin("status")[0] == 200, "the operator token is let in"


def test_pin_keeps_a_prefix_through_pressure_and_unpin_lets_it_go(server):
    cache = Cache()
    with EngineClient(server.endpoint) as c:
        kept = _registered(c, cache, "pin-a", "ns-pin", 4)
        calls = _admin_count(server, "pin", 200)
        status, answer = server.admin("pin", _prefix("ns-pin", kept + hashes(2)))
        assert status == 200 and answer["pinned"] == 4 and answer["not_resident"] == 2, answer
        assert answer["pinned_blocks"] == 4 and answer["pinned_bytes"] == 4 * 4 * 4096
        assert server.metric("pegaflow_admin_pinned_blocks") == 4
        assert _admin_count(server, "pin", 200) == calls + 1, "every call is counted"
        ns = {n["namespace"]: n for n in server.admin("status")[1]["namespaces"]}
        assert ns["ns-pin"]["pinned_blocks"] == 4
        evictions = server.metric("pegaflow_cache_block_evictions_total")
        left = server.metric("pegaflow_block_residence_seconds_count")
        saves = server.metric("pegaflow_save_copy_seconds_count")
        _save(c, cache, "pin-a", hashes(160))  # 2.5 pools' worth: every unpinned block is evicted
        assert server.metric("pegaflow_cache_block_evictions_total") - evictions >= 96
        # each evicted block's time in the pool, each save's copy time: histograms on /metrics
        assert server.metric("pegaflow_block_residence_seconds_count") - left >= 96
        assert server.metric("pegaflow_save_copy_seconds_count") > saves
        assert _hit(c, "pin-a", kept) == 4, "pinned blocks survived"
        status, answer = server.admin("unpin", _prefix("ns-pin", kept))
        assert (status, answer["unpinned"], answer["pinned_blocks"]) == (200, 4, 0), answer
        assert server.metric("pegaflow_admin_pinned_blocks") == 0
        c.unregister_instance("pin-a")


def test_clear_then_warm_then_clear_all_through_dram_and_ssd(server):
    cache = Cache()
    with EngineClient(server.endpoint) as c:
        h = _registered(c, cache, "warm-a", "ns-warm", 8)
        _ssd_settled(server)
        assert _hit(c, "warm-a", h) == 8

        status, answer = server.admin("clear", {"namespace": "ns-warm", "ssd": False})
        assert status == 200 and answer["namespace"] == "ns-warm" and answer["dram_blocks"] == 8, answer
        assert answer["ssd_records"] == 0 and answer["dram_bytes"] == 8 * 16384
        assert server.metric("pegaflow_admin_cleared_blocks_total") >= 8
        ns = {n["namespace"]: n for n in server.admin("status")[1]["namespaces"]}
        assert ns["ns-warm"]["blocks"] == 0, "the namespace's DRAM index is empty"
        q = c.query("warm-a", h)
        assert q.pending_blocks == 8 and q.hit_blocks == 0, "DRAM cleared: the query reads back from SSD"
        assert _read_back(c, "warm-a", h) == 8

        server.admin("clear", {"namespace": "ns-warm", "ssd": False})
        warmed = server.metric("pegaflow_admin_warmed_blocks_total")
        status, answer = server.admin("warm", _prefix("ns-warm", h))
        assert (status, answer) == (200, {"resident": 0, "reading": 8}), answer
        wait_until(lambda: server.admin("warm", _prefix("ns-warm", h))[1]["resident"] == 8,
                   "the warmed prefix resident")
        assert server.metric("pegaflow_admin_warmed_blocks_total") - warmed == 8
        q = c.query("warm-a", h)
        assert (q.pending_blocks, q.hit_blocks) == (0, 8), "after a warm the first query hits at once"
        c.release("warm-a", q.lease)

        status, answer = server.admin("clear", {"all": True})
        assert status == 200 and answer["namespace"] is None and answer["ssd_records"] >= 8, answer
        assert server.metric("pegaflow_ssd_blocks") == 0 and server.metric("pegaflow_cache_resident_blocks") == 0
        assert server.metric("pegaflow_admin_cleared_ssd_blocks_total") >= 8
        assert _hit(c, "warm-a", h) == 0, "cleared from both tiers: a plain miss, nothing to read back"
        c.unregister_instance("warm-a")


def test_drop_instance_unregisters_it_and_its_client_sees_it_gone(server):
    cache = Cache()
    with EngineClient(server.endpoint) as c:
        h = _registered(c, cache, "drop-a", "ns-drop", 2)
        held = c.query("drop-a", h)
        assert held.hit_blocks == 2 and server.metric("pegaflow_active_leases") >= 1
        assert "drop-a" in server.instances()
        status, answer = server.admin("drop-instance", {"instance_id": "drop-a"})
        assert (status, answer) == (200, {"instance_id": "drop-a", "dropped": True})
        assert "drop-a" not in server.instances() and "drop-a" not in server.admin("status")[1]["instances"]
        assert server.metric("pegaflow_active_leases") == 0, "its lease went with it"
        with pytest.raises(errors.UnknownInstanceError):
            c.query("drop-a", h)
        status, answer = server.admin("drop-instance", {"instance_id": "drop-a"})
        assert status == 404 and "drop-a" in answer["error"]


BAD = [
    ("clear", b"{not json", 400, "body is not JSON: malformed JSON at line 1 column 3 path $."),
    ("clear", b'{"all": tru}', 400, "body is not JSON: "),
    ("clear", b"", 400, "body is empty; expected a JSON object"),
    ("clear", b"[1]", 400, "expected a JSON object"),
    ("clear", b'{"all": true} {"all": true}', 400, "body is not JSON: malformed JSON at line 1 column 16"),
    ("clear", b'{"namespace": "a"\xff}', 400, "not UTF-8"),
    ("clear", {}, 400, "fields 'namespace' and 'all': expected exactly one"),
    ("clear", {"namespace": "a", "all": True}, 400, "fields 'namespace' and 'all': expected exactly one"),
    ("clear", {"all": "yes"}, 400, "field 'all' is \"yes\"; expected true or false"),
    ("clear", {"all": True, "dram": False, "ssd": False}, 400, "fields 'dram' and 'ssd': both false"),
    ("clear", {"all": True, "tier": "dram"}, 400, "unknown field 'tier'; expected only namespace, all, dram, ssd"),
    ("clear", {"namespace": 7}, 400, "field 'namespace' is 7; expected a string"),
    ("clear", {"namespace": "a\nb"}, 400, "field 'namespace' of 3 characters has U+000A"),
    ("clear", {"namespace": "x" * 300}, 400, "(Limits.MAX_NAME_BYTES)"),
    ("clear", {"namespace": "never-registered"}, 404, "namespace 'never-registered' is unknown"),
    ("pin", {"namespace": "ns-bad"}, 400, "field 'hashes' is missing; expected a non-empty array of block hashes in hex"),
    ("pin", {"namespace": "ns-bad", "hashes": []}, 400, "field 'hashes' is []"),
    ("pin", {"namespace": "ns-bad", "hashes": "00ff"}, 400, "field 'hashes' is \"00ff\""),
    ("pin", {"namespace": "ns-bad", "hashes": ["00ff", "zz11"]}, 400, "field 'hashes'[1] is \"zz11\"; expected hex digits only"),
    ("pin", {"namespace": "ns-bad", "hashes": ["abc"]}, 400, "field 'hashes'[0] is \"abc\"; expected a string of 2..128 hex"),
    ("pin", {"namespace": "ns-bad", "hashes": ["00ff", "00"]}, 400, "field 'hashes'[1] is 1 bytes but hashes[0] is 2"),
    ("pin", {"namespace": "ns-bad", "hashes": [5]}, 400, "field 'hashes'[0] is 5"),
    ("pin", {"hashes": ["00"]}, 400, "field 'namespace' is missing; expected a string"),
    ("pin", {"namespace": "nope", "hashes": ["00"]}, 404, "namespace 'nope' is unknown"),
    ("unpin", {"namespace": "nope", "hashes": ["00"]}, 404, "namespace 'nope' is unknown"),
    ("warm", {"namespace": "nope", "hashes": ["00"]}, 404, "namespace 'nope' is unknown"),
    ("drop-instance", {}, 400, "field 'instance_id' is missing"),
    ("drop-instance", {"instance_id": "ghost"}, 404, "instance 'ghost' is not registered"),
    ("nothing-here", {}, 404, "no admin call /admin/nothing-here; expected one of [GET /admin/status, POST /admin/clear"),
]


@pytest.mark.parametrize("path,body,status,message", BAD, ids=[f"{p}-{i}" for i, (p, *_) in enumerate(BAD)])
def test_bad_input_is_a_4xx_naming_the_field_and_changes_nothing(server, path, body, status, message):
    before = server.admin("status")[1]
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    got, answer = server.admin(path, data)
    assert got == status and message in answer["error"], answer
    after = server.admin("status")[1]
    assert after == before, "a refused call changes nothing"


def test_bodies_over_1_mib_are_refused_before_reading_and_methods_are_checked(server):
    """A body over 1 MiB is refused by its Content-Length before a byte of it is read: the request
    goes out with its headers only, and the 413 comes back all the same. (Sent whole, the body
    raced the server's close: a client still writing it could see the connection reset instead.)"""
    import http.client

    from pegaflow._server import in_netns

    calls = _admin_count(server, "pin", 413)
    size = (1 << 20) + 100
    with in_netns(server.netns):
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
        try:
            conn.putrequest("POST", "/admin/pin")
            conn.putheader("Authorization", f"Bearer {server.operator_token}")
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(size))
            conn.endheaders()  # no body follows
            r = conn.getresponse()
            status, answer = r.status, json.loads(r.read())
        finally:
            conn.close()
    assert status == 413, answer
    assert f"body of {size} bytes; expected at most 1048576 (AdminEndpoints.MAX_BODY_BYTES)" in answer["error"]
    assert _admin_count(server, "pin", 413) == calls + 1
    assert server.admin("clear")[0] == 405, "GET on a POST call"
    assert server.admin("status", b"{}")[0] == 405, "POST on GET /admin/status"


def test_warm_without_an_ssd_tier_is_a_409_naming_the_flag(tmp_path):
    s = start_server(tmp_path / "pool")
    try:
        cache = Cache()
        with EngineClient(s.endpoint) as c:
            c.register_instance("nossd", "ns-nossd", 1, 1)
            c.register_worker("nossd", 0, 0, cache.regions())
            status, answer = s.admin("warm", {"namespace": "ns-nossd", "hashes": ["00" * 32]})
            assert status == 409 and "--ssd-cache-path" in answer["error"], answer
            assert s.admin("status")[1]["ssd"] is None
    finally:
        s.stop()


def test_vllm_reset_prefix_cache_with_reset_connector_clears_the_instances_namespace(engines, tmp_path):
    """vLLM's Scheduler.reset_prefix_cache(reset_connector=True) reaches the connector's reset_cache,
    which clears the instance's namespace in the server: the next identical request loads nothing."""
    pytest.importorskip("vllm")  # SimEngine runs vLLM's real scheduler
    s = start_server(tmp_path / "pool", pool_size="64mb")
    try:
        a = engines("a", {"mode": "server", "endpoint": s.endpoint})
        p = [1000 + 7 * i for i in range(70)]  # 4 full blocks of 16 and a tail
        a.add("r1", p, max_tokens=2)
        a.run()

        def namespace_blocks() -> int:
            return sum(n["blocks"] for n in s.admin("status")[1]["namespaces"])

        wait_until(lambda: namespace_blocks() >= 4, "the first request's blocks saved")
        cleared = s.metric("pegaflow_admin_cleared_blocks_total")
        assert a.scheduler.reset_prefix_cache(reset_connector=True) is True
        assert namespace_blocks() == 0, "the connector cleared the namespace in the server"
        assert s.metric("pegaflow_admin_cleared_blocks_total") - cleared >= 4
        loaded = a.stats.loaded_requests
        a.add("r2", p, max_tokens=2)
        a.run()
        assert a.stats.loaded_requests == loaded, "nothing left to load: vLLM's cache and the store's were reset"
        assert a.outputs["r2"] == a.outputs["r1"]
        a.assert_drained()
    finally:
        s.stop()


def test_events_stream_every_instances_stored_and_removed_blocks_in_order(tmp_path):
    """GET /admin/events: the store's BlockStored / BlockRemoved events (vLLM's names, medium CPU,
    vLLM's block hash) over every instance on the host, in order, resumable after `next`;
    evictions and the operator's clear are removals; the tenants' token is refused."""
    s = start_server(tmp_path / "pool", pool_size="1mb")  # 64 blocks of the test cache's 16 KiB
    try:
        a_cache, b_cache = Cache(), Cache()
        with EngineClient(s.endpoint) as a, EngineClient(s.endpoint) as b:
            ka = _registered(a, a_cache, "ev-a", "ns-ev-a", 3)
            kb = _registered(b, b_cache, "ev-b", "ns-ev-b", 2)
            a.flush()
            b.flush()  # every save ended: its block sealed
            status, first = s.admin("events")
            assert status == 200 and first["gap"] is False, first
            assert [(e["type"], e["medium"], e["namespace"], e["block_hash"]) for e in first["events"]] == \
                [("BlockStored", "CPU", "ns-ev-a", k.hex()) for k in ka] + [("BlockStored", "CPU", "ns-ev-b", k.hex()) for k in kb]
            assert [e["seq"] for e in first["events"]] == list(range(1, 6)) and first["next"] == 5

            assert s.admin("clear", {"namespace": "ns-ev-a"})[0] == 200
            status, cleared = s.admin(f"events?after={first['next']}")
            assert sorted((e["type"], e["block_hash"]) for e in cleared["events"]) == sorted(("BlockRemoved", k.hex()) for k in ka)

            more = hashes(64)  # a full pool's worth in ns-ev-a's instance: b's two blocks are evicted
            _save(a, a_cache, "ev-a", more)
            a.flush()
            status, pressure = s.admin(f"events?after={cleared['next']}&max=10000")
            removed = {e["block_hash"] for e in pressure["events"] if e["type"] == "BlockRemoved"}
            assert {k.hex() for k in kb} <= removed, "evicted blocks are reported removed"
            assert sum(e["type"] == "BlockStored" for e in pressure["events"]) == 64

        assert s.admin("events", token="tenant")[0] == 403
        for query, message in [("after=x", "query parameter 'after' is x; expected an integer"),
                               ("colour=1", "query parameter colour; expected after or max"),
                               ("max=0", "expected after >= 0 and 1..10000 events")]:
            status, answer = s.admin(f"events?{query}")
            assert status == 400 and message in answer["error"], answer
    finally:
        s.stop()
