"""Which calls a worker's step makes into the store's brain (unit tier: no JVM, no vLLM).

vLLM asks ``get_block_ids_with_load_errors`` after every step's ``get_finished``; the brain
records failed block ids only for a step's in-step loads or for a load ``get_finished`` reports
failed ("F"), so every other step (a decode step) skips that call into the JVM, which costs far
more inside a step than outside one (docs/benchmarks/README.md, twelfth run).
"""

from __future__ import annotations

from pegaflow.connector._brain import CountersDue
from pegaflow.connector.worker import WorkerCore


class RecordingBrain:
    """The worker brain's calls WorkerCore makes, with set answers (the brain itself is Java,
    tested in ConnectorBrainTest; what is under test here is which calls the worker makes)."""

    def __init__(self):
        self.calls: list[str] = []
        self.in_step = 0
        self.failed: set[str] = set()
        self.errors: set[int] = set()
        self.idle = False  # WorkerBrain.idle: what the last get_finished's "I" line said

    def start_loads(self, plan: bytes) -> int:
        self.calls.append("start_loads")
        return self.in_step

    def get_finished(self, finished):
        self.calls.append("get_finished")
        return set(), set(), set(self.failed)

    def load_errors(self) -> set[int]:
        self.calls.append("load_errors")
        errors, self.errors = self.errors, set()
        return errors

    def submit_saves(self, plan: bytes, stream: int) -> None:
        self.calls.append("submit_saves")

    def stats(self) -> dict[str, int]:
        self.calls.append("stats")
        return {"saved_blocks": 1}


def core_with(brain: RecordingBrain) -> WorkerCore:
    core = WorkerCore.__new__(WorkerCore)  # no store link: the brain is set directly
    core.brain, core.load_enabled, core.step_loads, core._errors_possible = brain, True, 0, False
    core.save_enabled, core._stream_of = True, None
    core._pending, core._counts = True, CountersDue()
    return core


def step(core: WorkerCore, plan: bytes | None) -> set[int]:
    core.start_loads(plan)
    core.get_finished([])
    return core.load_errors()


def test_a_step_without_loads_asks_for_no_load_errors():
    brain = RecordingBrain()
    core = core_with(brain)
    assert step(core, None) == set()
    assert step(core, b"plan with saves only") == set()
    assert "load_errors" not in brain.calls


def test_a_step_with_in_step_loads_drains_its_errors_once():
    brain = RecordingBrain()
    core = core_with(brain)
    brain.in_step, brain.errors = 1, {7, 8}
    assert step(core, b"plan") == {7, 8}
    brain.in_step = 0
    assert step(core, None) == set()
    assert brain.calls.count("load_errors") == 1


def test_a_failed_asynchronous_load_is_drained_in_the_step_that_reports_it():
    brain = RecordingBrain()
    core = core_with(brain)
    brain.failed, brain.errors = {"req-1"}, {3}
    assert step(core, None) == {3}
    brain.failed = set()
    assert step(core, None) == set()
    assert brain.calls.count("load_errors") == 1


def test_a_worker_asks_for_the_warm_up_where_loads_run(monkeypatch):
    """A worker asks the JVM for the request path's warm-up (for workers in processes of their
    own): only where loads are enabled and PEGAFLOW_WARM_UP allows it; a refusal only logs."""
    from pegaflow import errors
    from pegaflow.connector import _keys

    class WarmBrain(RecordingBrain):
        def warm_up(self, block_size: int) -> bool:
            self.calls.append(f"warm_up {block_size}")
            if block_size > 65536:
                raise errors.InvalidArgumentError(f"warm_up block size {block_size}; expected 1 to 65536 tokens")
            return True

    monkeypatch.delenv("PEGAFLOW_WARM_UP", raising=False)
    monkeypatch.delenv("PEGAFLOW_KEY_WARM_UP", raising=False)
    brain = WarmBrain()
    core = core_with(brain)
    assert core.start_warm_up(32) is True
    assert core.start_warm_up(1 << 20) is False  # refused: logged, the worker carries on
    core.load_enabled = False
    assert core.start_warm_up(32) is False
    core.load_enabled = True
    monkeypatch.setenv("PEGAFLOW_WARM_UP", "0")
    assert core.start_warm_up(32) is False
    monkeypatch.delenv("PEGAFLOW_WARM_UP")
    monkeypatch.setattr(_keys, "LOOKUP_WARM_UP", False)
    assert core.start_warm_up(32) is False
    assert brain.calls == ["warm_up 32", f"warm_up {1 << 20}"]


def test_a_decode_step_asks_nothing_once_the_store_said_it_is_idle():
    """After a get_finished whose answer said "idle" (no load in flight, no finished request's
    saves pending), a step without finished ids, in-step loads or a plan makes no call; a finished
    id, or a plan that may start loads, asks again (the store may then have something to report)."""
    brain = RecordingBrain()
    core = core_with(brain)
    step(core, None)
    assert brain.calls == ["get_finished"]  # a new worker asks: the store has not said it is idle
    brain.idle = True
    step(core, None)
    brain.calls.clear()
    for _ in range(3):
        step(core, b"")  # decode steps: vLLM's plan is empty
    assert brain.calls == []
    brain.idle = False  # the store, once it hears of the finished request: its saves are pending
    assert core.get_finished(["req-1"]) == (set(), set(), set())
    assert brain.calls == ["get_finished"]  # vLLM finished a request: asked at once
    core.get_finished([])
    core.get_finished([])
    assert brain.calls.count("get_finished") == 3  # asked on every step until the store is idle again
    brain.idle = True
    core.get_finished([])
    brain.calls.clear()
    step(core, b"plan with an asynchronous load")
    assert brain.calls == ["start_loads", "get_finished"]


def test_a_quiet_step_reads_no_counters_until_something_moved_them():
    """The worker's counters are read from the store only after a step that could have moved them
    (saves submitted, loads started, a get_finished that asked), or once STATS_EVERY_NS passed."""
    brain = RecordingBrain()
    core = core_with(brain)
    assert core.stats() == {"saved_blocks": 1}
    assert core.stats() == {}  # nothing since: no call
    core.submit_saves(b"plan")
    assert core.stats() == {"saved_blocks": 1}
    brain.idle = True
    step(core, b"")  # the get_finished that said idle asked the store
    assert core.stats() == {"saved_blocks": 1}
    step(core, b"")  # idle: no call, nothing moved
    assert core.stats() == {}
    core._counts.at -= CountersDue.EVERY_NS  # a quarter of a second later: read all the same
    assert core.stats() == {"saved_blocks": 1}
    assert brain.calls.count("stats") == 4


class FakeApi:
    """The bridge's call table for a SchedulerBrain without a JVM: records the calls, answers an
    empty plan and no counters."""

    def __init__(self):
        self.calls: list[str] = []

    def call(self, name, *args):
        self.calls.append(name)
        if name == "sched_build_plan":
            args[3]._obj.value = 0
        elif name == "sched_stats":
            args[3]._obj.value = 0


def test_a_scheduler_step_with_nothing_new_plans_and_counts_without_the_jvm():
    """build_plan and stats call into the JVM only when a call since their last could have changed
    what they return (lookups, allocations, schedules, preemptions, ends); a decode step inside a
    block makes neither call. The counters are read at least every STATS_EVERY_NS all the same."""
    import ctypes

    from pegaflow.connector._brain import SchedulerBrain

    brain = SchedulerBrain.__new__(SchedulerBrain)
    brain._api, brain.handle = FakeApi(), 1
    brain._buf = ctypes.create_string_buffer(64)
    brain._plan_due, brain._counts = True, CountersDue()
    assert brain.build_plan() == b"" and brain.stats() == {}
    assert brain._api.calls == ["sched_build_plan", "sched_stats"]
    for _ in range(3):
        assert brain.build_plan() == b"" and brain.stats() == {}
    assert len(brain._api.calls) == 2
    brain.preempted("req-1")
    brain.build_plan()
    brain.stats()
    assert brain._api.calls[2:] == ["sched_preempted", "sched_build_plan", "sched_stats"]
    brain.finished([], [])  # nothing finished: no call, nothing changed
    brain.failed_blocks([])
    brain.build_plan()
    assert len(brain._api.calls) == 5
    brain.finished(["req-1"], [])
    brain.build_plan()
    assert brain._api.calls[5:] == ["sched_finished", "sched_build_plan"]
    brain._counts.at -= CountersDue.EVERY_NS
    brain.stats()  # read after a quarter of a second all the same
    assert brain._api.calls[-1] == "sched_stats"
