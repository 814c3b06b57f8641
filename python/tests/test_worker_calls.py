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
