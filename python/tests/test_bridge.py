"""The engine inside this Python process through the C ABI: bytes, errors, threads, fork, spawn, exit."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import select
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import pegaflow
from pegaflow import PegaEngine, errors
from bridge_helpers import BLOCKS, Cache, hashes, settle, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def engine():
    with PegaEngine(pool_size="8mb", copy_threads=2) as e:
        yield e


@pytest.fixture
def cache(engine):
    c = Cache()
    engine.register_instance("inst", "ns", 1, 1)
    engine.register_worker("inst", 0, 0, c.regions())
    return c


def test_round_trip_into_other_block_ids_leaves_a_control_block_alone(engine, cache):
    src, dst, control = [0, 1, 2, 3], [9, 4, 11, 6], 13
    saved = [cache.fill(b) for b in src]
    before = cache.fill(control)
    h = hashes(4)
    result = engine.save("inst", 0, src, h).wait(timeout=10)
    assert (result.blocks, result.skipped_blocks, result.bytes) == (4, 0, 4 * 2 * 2 * 4096)
    for b in src:
        cache.fill(b)  # a load that read the source blocks would now differ
    q = engine.query("inst", h + hashes(1))
    assert q.hit_blocks == 4 and len(q.lease) == 16
    assert engine.load("inst", 0, q.lease, dst).wait().blocks == 4
    assert [cache.block(b) for b in dst] == saved
    assert cache.block(control) == before
    again = engine.save("inst", 0, src, h).wait()
    assert (again.blocks, again.skipped_blocks) == (0, 4), "resident hashes are not saved twice"
    stats = engine.stats()
    assert stats["pegaflow_cache_resident_blocks"] == 4
    assert stats["pegaflow_active_leases"] == 0


def test_an_ssd_tier_serves_a_restarted_engine_after_not_yet_answers(tmp_path):
    """Embedded engine with an SSD tier: blocks written behind the pool, the engine closed, a
    new one on the same path answers "not yet" while it reads them back, then loads them."""
    cache = Cache()
    src, dst = [0, 1, 2], [7, 8, 9]
    h = hashes(3)
    with PegaEngine(pool_size="8mb", ssd_cache_paths=[str(tmp_path)], ssd_cache_capacity="64mb") as first:
        first.register_instance("inst", "ns", 1, 1)
        first.register_worker("inst", 0, 0, cache.regions())
        saved = [cache.fill(b) for b in src]
        first.save("inst", 0, src, h).wait(timeout=10)
        wait_until(lambda: first.stats()["pegaflow_ssd_blocks"] == 3, "3 blocks written to SSD")
    with PegaEngine(pool_size="8mb", ssd_cache_paths=[str(tmp_path)], ssd_cache_capacity="64mb") as second:
        second.register_instance("inst", "ns", 1, 1)
        second.register_worker("inst", 0, 0, cache.regions())
        assert second.stats()["pegaflow_ssd_blocks"] == 3, "index rebuilt from the shard file"
        q = settle(second, "inst", h, expect_not_yet=3)
        assert q.hit_blocks == 3
        assert second.load("inst", 0, q.lease, dst).wait().blocks == 3
        assert [cache.block(b) for b in dst] == saved
        assert second.stats()["pegaflow_cache_tier_ssd_blocks_total"] == 3


def test_bad_ssd_settings_are_refused_clearly(tmp_path):
    with pytest.raises(errors.InvalidArgumentError, match=r"SSD capacity 1.0 KiB for 1 shard\(s\); expected at least"):
        PegaEngine(pool_size="8mb", ssd_cache_paths=[str(tmp_path)], ssd_cache_capacity="1kb")
    with pytest.raises(errors.InvalidArgumentError, match=r"expected a list of directories"):
        PegaEngine(pool_size="8mb", ssd_cache_paths=str(tmp_path))


def test_seen_two_admission_saves_a_prefix_the_second_time_it_was_asked_for():
    """PegaEngine(admission=...) reaches the engine: a block is written once lookups asked for it
    twice; a bad policy is refused naming it."""
    c = Cache()
    with PegaEngine(pool_size="8mb", admission="seen:2", eviction="lfu") as e:
        e.register_instance("inst", "ns", 1, 1)
        e.register_worker("inst", 0, 0, c.regions())
        for b in range(2):
            c.fill(b)
        h = hashes(2)
        for asked in (1, 2):
            assert e.query("inst", h).hit_blocks == 0
            r = e.save("inst", 0, [0, 1], h).wait(timeout=10)
            assert r.blocks == (0 if asked == 1 else 2), asked
        assert e.query("inst", h).hit_blocks == 2
        assert e.stats()["pegaflow_save_not_admitted_blocks_total"] == 2
    with pytest.raises(errors.InvalidArgumentError, match=r"admission 'sometimes'; expected all or seen:N"):
        PegaEngine(pool_size="8mb", admission="sometimes")
    with pytest.raises(errors.InvalidArgumentError, match=r"eviction 'mru'; expected lru or lfu"):
        PegaEngine(pool_size="8mb", eviction="mru")


def test_a_miss_has_no_lease(engine, cache):
    q = engine.query("inst", hashes(3))
    assert q.hit_blocks == 0 and q.lease is None


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda e, c: e.query("nope", hashes(1)), errors.UnknownInstanceError, "instance 'nope' is not registered"),
        (lambda e, c: e.release("inst", b"\x01" * 16), errors.UnknownLeaseError, "is unknown"),
        (lambda e, c: e.save("inst", 0, [BLOCKS], hashes(1)), errors.InvalidArgumentError,
         f"blockIds[0] = {BLOCKS} out of range [0, {BLOCKS})"),
        (lambda e, c: e.save("inst", 0, [1, 2], hashes(1)), errors.InvalidArgumentError, "2 block ids but 1 hashes"),
        (lambda e, c: e.release("inst", b"short"), errors.InvalidArgumentError, "expected 16 bytes"),
        (lambda e, c: e.register_instance("inst", "other-ns", 1, 1), errors.TopologyMismatchError, "re-registration"),
        (lambda e, c: e.register_worker("inst", 0, 0, c.regions()), errors.InvalidArgumentError, "already sealed"),
        (lambda e, c: (e.register_instance("half", "ns2", 1, 2), e.query("half", hashes(1))),
         errors.RegistrationIncompleteError, "0 of 2 workers"),
        (lambda e, c: e.register_worker("inst", 0, 0, [dataclasses.replace(c.regions()[0], layout="weird")]),
         errors.InvalidArgumentError, "layout 'weird'"),
        # a bad host pointer is refused at registration (the process's mappings), never a SIGSEGV at the first copy
        (lambda e, c: (e.register_instance("bad", "ns-bad", 1, 1),
                       e.register_worker("bad", 0, 0, [dataclasses.replace(c.regions()[0], base_address=0x1000)])),
         errors.InvalidArgumentError, "at 0x1000 (131072 bytes): 0x1000 is not mapped in this process"),
        (lambda e, c: PegaEngine(pool_size="12 parsecs"), errors.InvalidArgumentError, "size '12 parsecs' is not a size"),
        (lambda e, c: PegaEngine(transfer="cuda") if not os.path.exists("/dev/nvidia0") else pytest.skip("GPU host"),
         errors.CudaError, "CUDA is not available"),
    ],
    ids=["unknown-instance", "unknown-lease", "block-id-range", "length-mismatch", "lease-length",
         "topology-mismatch", "sealed", "incomplete", "bad-layout", "unmapped-region", "bad-pool-size", "no-cuda"],
)
def test_each_java_error_arrives_typed_with_its_message_and_the_engine_carries_on(engine, cache, call, error, message):
    with pytest.raises(error) as raised:
        call(engine, cache)
    assert message in str(raised.value)
    assert isinstance(raised.value, pegaflow.PegaflowError)
    h = hashes(1)
    cache.fill(0)
    assert engine.save("inst", 0, [0], h).wait().blocks == 1
    assert engine.query("inst", h).hit_blocks == 1


def test_pool_exhausted_with_everything_pinned(cache):
    with PegaEngine(pool_size="64kb") as small:
        small.register_instance("inst", "ns", 1, 1)
        small.register_worker("inst", 0, 0, cache.regions())
        h = hashes(5)
        for b in range(4):
            cache.fill(b)
        small.save("inst", 0, [0, 1, 2, 3], h[:4]).wait()  # 4 x 16 KiB fill the pool
        q = small.query("inst", h[:4])
        with pytest.raises(errors.PoolExhaustedError, match="pinned"):
            small.save("inst", 0, [4], h[4:])
        small.release("inst", q.lease)
        assert small.save("inst", 0, [4], h[4:]).wait().blocks == 1


def test_closed_engine_says_so(cache):
    e = PegaEngine(pool_size="1mb")
    e.close()
    with pytest.raises(errors.EngineClosedError):
        e.query("inst", hashes(1))


def test_two_threads_call_concurrently(engine):
    caches = {name: Cache() for name in ("a", "b")}
    for name, c in caches.items():
        engine.register_instance(name, "ns-" + name, 1, 1)
        engine.register_worker(name, 0, 0, c.regions())
    failures: list[str] = []

    def work(name: str) -> None:
        c = caches[name]
        try:
            for _ in range(30):
                h = hashes(4)
                saved = [c.fill(b) for b in range(4)]
                engine.save(name, 0, [0, 1, 2, 3], h).wait()
                q = engine.query(name, h)
                engine.load(name, 0, q.lease, [8, 9, 10, 11]).wait()
                if [c.block(b) for b in (8, 9, 10, 11)] != saved:
                    failures.append(f"{name}: loaded bytes differ")
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(f"{name}: {e!r}")

    threads = [threading.Thread(target=work, args=(n,)) for n in caches]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert failures == []


def test_a_forked_child_gets_a_clear_error_instead_of_hanging(engine, cache):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the JVM's threads did not come along
        os.close(read)
        try:
            engine.query("inst", hashes(1))
            os.write(write, b"no error")
        except errors.JvmStartError as e:
            os.write(write, str(e).encode()[:1000])
        except BaseException as e:  # noqa: BLE001
            os.write(write, repr(e).encode()[:1000])
        os._exit(0)
    os.close(write)
    ready, _, _ = select.select([read], [], [], 30)
    assert ready, "forked child hung"
    message = os.read(read, 2000).decode()
    os.waitpid(pid, 0)
    assert "forked from pid" in message and "spawn" in message, message
    assert engine.query("inst", hashes(1)).hit_blocks == 0, "the parent is unaffected"


def _spawned_round_trip(_: int) -> tuple[int, bool]:
    from bridge_helpers import Cache, hashes
    from pegaflow import PegaEngine

    c = Cache()
    with PegaEngine(pool_size="4mb") as e:
        e.register_instance("child", "ns", 1, 1)
        e.register_worker("child", 0, 0, c.regions())
        saved = c.fill(2)
        h = hashes(1)
        e.save("child", 0, [2], h).wait()
        q = e.query("child", h)
        e.load("child", 0, q.lease, [5]).wait()
        return os.getpid(), c.block(5) == saved


def test_spawned_children_each_run_their_own_jvm(engine):
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = pool.map(_spawned_round_trip, range(2), chunksize=1)
    assert all(ok for _, ok in results)
    assert len({pid for pid, _ in results}) == 2 and os.getpid() not in {pid for pid, _ in results}


def test_exit_with_copies_in_flight_is_clean(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from bridge_helpers import Cache, hashes
        from pegaflow import PegaEngine
        c = Cache()
        e = PegaEngine(pool_size="16mb")
        e.register_instance("x", "ns", 1, 1)
        e.register_worker("x", 0, 0, c.regions())
        for i in range(50):
            e.save("x", 0, list(range(16)), hashes(16))  # never waited for
        print("exiting")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "exiting"
    assert "hs_err" not in proc.stderr and "Exception" not in proc.stderr, proc.stderr


def _build_c_program(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed to prove the C ABI (install gcc)"
    from pegaflow._java import find_java

    home = find_java().home
    include = home / "include"
    if not (include / "jni.h").is_file():
        pytest.fail(f"{home} has no include/jni.h: the C program needs a JDK, not a runtime")
    exe = tmp_path / "roundtrip"
    subprocess.run(
        [cc, "-O2", "-Wall", "-Werror", f"-I{include}", f"-I{include / 'linux'}", f"-I{ROOT / 'bridge' / 'include'}",
         str(ROOT / "bridge" / "c" / "roundtrip.c"), "-ldl", "-lpthread", "-o", str(exe)],
        check=True,
    )
    return exe


def test_the_c_round_trip_program(tmp_path):
    """A native engine embedding the store on host memory: every engine entry point of the C
    ABI (bridge/c/roundtrip.c says what it checks), the JVM started through pegaflow_boot.h."""
    from pegaflow._java import find_jar

    exe = _build_c_program(tmp_path)
    proc = subprocess.run([str(exe), str(find_jar())], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "roundtrip ok" in out
    assert "bad input: code 2: instance 'no-such-instance' is not registered" in out
    for line in ("saved 4 blocks: poll, wait (73728 bytes) and callback agree",
                 "all-or-nothing: loading with 5 of 6, ready with 6 after the last save and flush",
                 "every byte matches, untouched blocks zero",
                 "loaded the same 6 blocks by the same hashes",
                 "pipeline parallel: two stages registered their layers with register_rank",
                 "then ready with 4 blocks, loaded byte-exact"):
        assert line in out, out
    assert out.count("bad call ") == 13, out


def test_the_c_host_gets_a_clear_error_without_a_java_runtime(tmp_path):
    """pegaflow_boot.h: an explicit $PEGAFLOW_JAVA_HOME that holds no Java 25 is reported with
    the place and the reason, and the program exits instead of crashing."""
    from pegaflow._java import find_jar

    exe = _build_c_program(tmp_path)
    env = dict(os.environ, PEGAFLOW_JAVA_HOME=str(tmp_path / "no-java"))
    proc = subprocess.run([str(exe), str(find_jar())], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert (f"no Java runtime >= 25 found. Tried: $PEGAFLOW_JAVA_HOME ({tmp_path / 'no-java'}): no readable release "
            "file") in proc.stderr
    proc = subprocess.run([str(exe), str(tmp_path / "missing.jar")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "engine jar " + str(tmp_path / "missing.jar") + " not found" in proc.stderr


def test_the_scheduler_side_asks_for_the_lookup_warm_up_by_a_mode_bit(monkeypatch):
    """sched_create's bit 16 starts the JVM's lookup warm-up (LookupWarmUp, on its own thread) and
    the side answers lookups meanwhile; a bit past those defined is refused, naming bits 16 and 32; an
    engine jar that refuses bit 16 (one built before it) gets the side without the warm-up."""
    import ctypes

    from pegaflow import _bridge
    from pegaflow.connector import _runtime
    from pegaflow.connector._brain import Group, SchedulerBrain

    link = _runtime.Link(_runtime.Settings(mode="embedded", pool_size="64mb"))
    try:
        brain = SchedulerBrain(link.handle, [Group("warm")], 16, True, in_step=True, warm_up=True)
        try:
            assert brain.lookup("r", [bytes(32)] * 4, 65, 0) == 0  # nothing registered, nothing stored: a miss
        finally:
            brain.close()
        out = ctypes.c_int64()
        with pytest.raises(errors.InvalidArgumentError,
                           match=r"load mode 65; .*plus 16 to warm the lookup path up, plus 32 to plan each load at the load"):
            _bridge.api().call("sched_create", link.handle, b"0 0 warm", 16, 65, ctypes.byref(out))
        planned_at_load = SchedulerBrain(link.handle, [Group("warm")], 16, True, in_step=True, begin_at_lookup=False)
        planned_at_load.close()  # bit 32 accepted

        api, modes = _bridge.api(), []

        class OlderJar:  # refuses the bit as a jar from before it does, passes the rest to the real one
            def call(self, name, *args):
                if name == "sched_create":
                    modes.append(args[3])
                    if args[3] & 16:
                        raise errors.InvalidArgumentError(f"sched_create load mode {args[3]}; expected ...")
                return api.call(name, *args)

        monkeypatch.setattr(_bridge, "api", lambda: OlderJar())
        older = SchedulerBrain(link.handle, [Group("warm")], 16, True, in_step=True, warm_up=True)
        monkeypatch.undo()
        older.close()
        assert modes == [1 | 4 | 16, 1 | 4]
    finally:
        link.close()


def test_the_scheduler_counters_go_to_the_cap_a_caller_knows():
    """sched_stats hands out min(cap, this build's counters): a caller built for ABI 9's nine gets
    nine, today's twenty-three (the lookups' staging counters after them) its twenty-three; a cap under nine
    is refused, naming both numbers."""
    import ctypes

    from pegaflow import _bridge
    from pegaflow.connector import _runtime
    from pegaflow.connector._brain import Group, SchedulerBrain

    link = _runtime.Link(_runtime.Settings(mode="embedded", pool_size="64mb"))
    try:
        brain = SchedulerBrain(link.handle, [Group("counts")], 16, True)
        try:
            assert brain.lookup("r", [bytes(32)] * 4, 65, 0) == 0
            count = ctypes.c_int32()
            for cap, expected in ((9, 9), (64, len(SchedulerBrain.STATS))):
                buf = (ctypes.c_int64 * cap)()
                _bridge.api().call("sched_stats", brain.handle, buf, cap, ctypes.byref(count))
                assert count.value == expected
            assert len(SchedulerBrain.STATS) == 25
            with pytest.raises(errors.InvalidArgumentError, match=r"sched_stats cap 8; expected >= 9 \(this build has 25 counters\)"):
                _bridge.api().call("sched_stats", brain.handle, (ctypes.c_int64 * 8)(), 8, ctypes.byref(count))
        finally:
            brain.close()
    finally:
        link.close()


def test_a_worker_process_starts_the_warm_up_once(tmp_path):
    """warm_up (a worker in a process of its own asks for it) starts the JVM's request-path
    warm-up: 1 from a fresh process's first call, 0 after; a block size out of range is refused
    naming it, before anything starts (BridgeTest checks the rest in the Java tier)."""
    script = textwrap.dedent(
        """
        import ctypes
        from pegaflow import _bridge, errors
        api, out = _bridge.api(), ctypes.c_int32(7)
        try:
            api.call("warm_up", 0, ctypes.byref(out))
        except errors.InvalidArgumentError as e:
            print("refused:", e)
        print("untouched", out.value)
        api.call("warm_up", 16, ctypes.byref(out))
        print("first", out.value)
        api.call("warm_up", 16, ctypes.byref(out))
        print("second", out.value)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["refused: warm_up block size 0; expected 1 to 65536 tokens", "untouched 7",
                                        "first 1", "second 0"]


def test_a_workers_registration_starts_the_warm_up(tmp_path):
    """WorkerCore.register asks the JVM for the warm-up (a worker in a process of its own, fresh
    here): a later WorkerBrain.warm_up then answers False (started already); with
    PEGAFLOW_WARM_UP=0 registration leaves it alone and that call starts it (True)."""
    script = textwrap.dedent(
        """
        import torch
        from pegaflow.connector import _runtime
        from pegaflow.connector.worker import WorkerCore
        core = WorkerCore(_runtime.Settings(mode="embedded", pool_size="16mb"), "warm-worker")
        caches = {f"model.layers.{l}.self_attn.attn": torch.zeros(2, 8, 16, 2, 8, dtype=torch.float16) for l in range(2)}
        core.register(caches, 8, mla=False, facts={"model": "m", "block_size": 16})
        print("warm_up after register:", core.brain.warm_up(16))
        """
    )
    for setting, answer in (("1", "False"), ("0", "True")):
        env = dict(os.environ, PEGAFLOW_WARM_UP=setting)
        env.pop("PEGAFLOW_KEY_WARM_UP", None)
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                              cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().splitlines()[-1] == f"warm_up after register: {answer}", (setting, proc.stdout)


def test_a_server_mode_workers_registration_warms_up_as_a_servers_client(tmp_path):
    """In one process with the scheduler (vLLM on one GPU) the worker's registration starts the
    process's warm-up before the scheduler exists; with a server-mode link (here no server
    answers) that warm-up runs as a client of a scratch server, as the scheduler's would, and
    says so in its one info line."""
    script = textwrap.dedent(
        """
        import sys, time, torch
        from pegaflow.connector import _runtime
        from pegaflow.connector.worker import WorkerCore
        core = WorkerCore(_runtime.Settings(mode="server", endpoint="127.0.0.1:1", deadline_ms=200, pool_size="16mb"),
                          "warm-worker")
        caches = {f"model.layers.{l}.self_attn.attn": torch.zeros(2, 8, 16, 2, 8, dtype=torch.float16) for l in range(2)}
        core.register(caches, 8, mla=False, facts={"model": "m", "block_size": 16})
        time.sleep(8)  # the warm-up's thread: at most 3 s of rounds, then its line
        """
    )
    env = dict(os.environ, PEGAFLOW_WARM_UP="1")
    env.pop("PEGAFLOW_KEY_WARM_UP", None)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    lines = [l for l in (proc.stdout + proc.stderr).splitlines() if "lookup warm-up:" in l]
    assert len(lines) == 1 and "as a client of a scratch server" in lines[0], proc.stdout + proc.stderr


def test_more_jvm_options_reach_the_in_process_jvm_which_then_takes_no_aot_cache(tmp_path):
    """PEGAFLOW_JVM_OPTIONS reaches the JVM a fresh process starts (here a GC log, which the JVM
    writes), and with it set no AOT cache is used or trained (a cache trained under other heap
    options stopped the JVM on the GPU machine); without it the process trains its cache as before."""
    script = textwrap.dedent(
        """
        import ctypes
        from pegaflow import _bridge
        api, out = _bridge.api(), ctypes.c_int32(0)
        api.call("warm_up", 16, ctypes.byref(out))
        print("started", out.value)
        """
    )
    log = tmp_path / "gc.log"
    env = dict(os.environ, PEGAFLOW_CACHE_DIR=str(tmp_path / "cache"), PEGAFLOW_JVM_OPTIONS=f"-Xms64m -Xmn32m -Xlog:gc:file={log}")
    env.pop("PEGAFLOW_PRESTAGE_MIB", None)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "started 1", proc.stdout
    assert "Using Serial" in log.read_text()  # the option reached the JVM
    time.sleep(3)  # a training run, had one started, would have its file by now
    assert not (tmp_path / "cache" / "aot").exists() or not any((tmp_path / "cache" / "aot").iterdir())
    env.pop("PEGAFLOW_JVM_OPTIONS")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    deadline = time.monotonic() + 60  # the cache is trained in the background after the start
    while not any((tmp_path / "cache" / "aot").glob("*.aot")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert any((tmp_path / "cache" / "aot").glob("*.aot")), "without added options the process trains its AOT cache"
