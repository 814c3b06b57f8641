"""Which calls a worker's step makes into the store's brain (unit tier: no JVM, no vLLM).

vLLM asks ``get_block_ids_with_load_errors`` after every step's ``get_finished``; the brain
records failed block ids only for a step's in-step loads or for a load ``get_finished`` reports
failed ("F"), so every other step (a decode step) skips that call into the JVM, which costs far
more inside a step than outside one (docs/benchmarks/README.md, twelfth run).
"""

from __future__ import annotations

from pegaflow.connector.worker import WorkerCore


class RecordingBrain:
    """The worker brain's calls WorkerCore makes, with set answers (the brain itself is Java,
    tested in ConnectorBrainTest; what is under test here is which calls the worker makes)."""

    def __init__(self):
        self.calls: list[str] = []
        self.in_step = 0
        self.failed: set[str] = set()
        self.errors: set[int] = set()

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


def core_with(brain: RecordingBrain) -> WorkerCore:
    core = WorkerCore.__new__(WorkerCore)  # no store link: the brain is set directly
    core.brain, core.load_enabled, core.step_loads, core._errors_possible = brain, True, 0, False
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
