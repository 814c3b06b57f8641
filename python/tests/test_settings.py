"""kv_connector_extra_config as the connector reads it: load_in_step's three values and what auto picks."""

import os
from types import SimpleNamespace

import pytest

from pegaflow.connector.settings import Settings
from pegaflow.errors import InvalidArgumentError


@pytest.mark.parametrize("raw, env, expected", [
    (None, None, None),  # default: auto
    ("auto", None, None),
    (True, None, True),
    (False, None, False),
    ("off", None, False),
    (None, "1", True),
    (None, "auto", None),
    ("yes", "0", True),  # the config wins over the environment
])
def test_load_in_step_is_auto_true_or_false(raw, env, expected):
    extra = {} if raw is None else {"load_in_step": raw}
    assert Settings.from_extra(extra, {} if env is None else {"PEGAFLOW_LOAD_IN_STEP": env}).load_in_step is expected


@pytest.mark.parametrize("bad", ["sometimes", 1, 0.5])
def test_a_bad_load_in_step_names_the_key_the_value_and_the_choices(bad):
    with pytest.raises(InvalidArgumentError, match=rf"load_in_step '?{bad}'?; expected auto, true or false"):
        Settings.from_extra({"load_in_step": bad}, {})


def test_cross_layer_blocks_takes_no_auto():
    with pytest.raises(InvalidArgumentError, match="cross_layer_blocks 'auto'; expected true or false"):
        Settings.from_extra({"cross_layer_blocks": "auto"}, {})


def test_auto_loads_in_the_step_on_the_cpu_runner_only():
    pytest.importorskip("vllm")
    from pegaflow.connector._vllm import in_step_loads

    auto = Settings.from_extra({}, {})
    assert in_step_loads(auto, gpu=False) is True
    assert in_step_loads(auto, gpu=True) is False
    forced = Settings.from_extra({"load_in_step": True}, {})
    assert in_step_loads(forced, gpu=True) is True
    off = Settings.from_extra({"load_in_step": False}, {})
    assert in_step_loads(off, gpu=False) is False


def test_cuda_graphs_stay_full_for_decode_and_full_graph_steps_wait_for_whole_loads():
    """vLLM keeps FULL CUDA graphs with every setting; a forward that runs no per-layer hook (a
    FULL graph's replay, V1: its context says FULL; V2: started outside the forward's context,
    no attention metadata; or no context) has its in-step loads waited for whole."""
    pytest.importorskip("vllm")
    from types import SimpleNamespace

    from vllm.config import CUDAGraphMode

    from pegaflow.connector import PegaKVConnector
    from pegaflow.connector._vllm import forward_runs_layer_hooks

    for extra in ({"load_in_step": True}, {}, {"load_in_step": False}):
        assert PegaKVConnector.requires_piecewise_for_cudagraph(extra) is False
    ctx = lambda meta, mode: SimpleNamespace(attn_metadata=meta, cudagraph_runtime_mode=mode)  # noqa: E731
    assert forward_runs_layer_hooks(ctx({}, CUDAGraphMode.NONE)) is True
    assert forward_runs_layer_hooks(ctx({"l0": object()}, CUDAGraphMode.PIECEWISE)) is True
    assert forward_runs_layer_hooks(ctx({}, CUDAGraphMode.FULL)) is False
    assert forward_runs_layer_hooks(ctx(None, CUDAGraphMode.NONE)) is False  # V2's FULL step, or no forward
    assert forward_runs_layer_hooks(None) is False
    assert forward_runs_layer_hooks(SimpleNamespace(attn_metadata={})) is True  # a context without a mode: eager


def test_load_at_alloc_is_off_unless_asked_for():
    assert Settings.from_extra({}, {}).load_at_alloc is False
    assert Settings.from_extra({"load_at_alloc": True}, {}).load_at_alloc is True
    assert Settings.from_extra({}, {"PEGAFLOW_LOAD_AT_ALLOC": "1"}).load_at_alloc is True
    with pytest.raises(InvalidArgumentError, match=r"load_at_alloc 'sometimes'; expected true or false"):
        Settings.from_extra({"load_at_alloc": "sometimes"}, {})


def test_begin_at_lookup_is_on_unless_turned_off():
    assert Settings.from_extra({}, {}).begin_at_lookup is True
    assert Settings.from_extra({"begin_at_lookup": False}, {}).begin_at_lookup is False
    assert Settings.from_extra({}, {"PEGAFLOW_BEGIN_AT_LOOKUP": "0"}).begin_at_lookup is False
    with pytest.raises(InvalidArgumentError, match=r"begin_at_lookup 'maybe'; expected true or false"):
        Settings.from_extra({"begin_at_lookup": "maybe"}, {})


def test_compute_share_is_zero_unless_set_and_refuses_what_is_not_a_share():
    assert Settings.from_extra({}, {}).compute_share == 0.0
    assert Settings.from_extra({"compute_share": 0.07}, {}).compute_share == 0.07
    assert Settings.from_extra({}, {"PEGAFLOW_COMPUTE_SHARE": "0.04"}).compute_share == 0.04
    assert Settings.from_extra({"pegaflow.compute_share": "0.5"}, {"PEGAFLOW_COMPUTE_SHARE": "0.1"}).compute_share == 0.5
    for bad, why in (("half", r"compute_share 'half'; expected a number from 0 to 0.5"),
                     (0.6, r"compute_share 0.6; expected 0 to 0.5"), (-0.01, r"compute_share -0.01; expected 0 to 0.5"),
                     ("nan", r"compute_share nan; expected 0 to 0.5"), (None, r"compute_share 'None'; expected a number")):
        with pytest.raises(InvalidArgumentError, match=why):
            Settings.from_extra({"compute_share": bad}, {})


def test_a_compute_share_stays_within_vllms_largest_cuda_graph():
    """The tokens a warm step computes (the share and the prompt's tail after its servable
    blocks) stay within vLLM's largest CUDA graph, where it has them: past it the forward runs
    eagerly (the 36th GPU run: 576 tokens of an 8K prompt made the warm answer 1.5x slower)."""
    pytest.importorskip("vllm")
    from vllm.config import CUDAGraphMode

    from pegaflow.connector._vllm import graph_tokens
    from pegaflow.connector.scheduler import SchedulerCore

    def config(mode, size=512, eager=False):
        return SimpleNamespace(model_config=SimpleNamespace(enforce_eager=eager),
                               compilation_config=SimpleNamespace(cudagraph_mode=mode, max_cudagraph_capture_size=size))

    assert graph_tokens(config(CUDAGraphMode.FULL_AND_PIECEWISE)) == 512
    assert graph_tokens(config(CUDAGraphMode.PIECEWISE, 256)) == 256
    assert graph_tokens(config(CUDAGraphMode.NONE)) is None
    assert graph_tokens(config(CUDAGraphMode.PIECEWISE, eager=True)) is None
    assert graph_tokens(config(None)) is None and graph_tokens(SimpleNamespace()) is None

    def instead(share, graph, num_tokens, num_computed=0, hashes=None):
        core = SimpleNamespace(_compute_share=share, _block_size=16, _graph_tokens=graph)
        return SchedulerCore._computed_instead(core, num_tokens // 16 if hashes is None else hashes, num_tokens,
                                               num_computed)

    assert instead(0.05, None, 8192) == 25 * 16  # 511 servable blocks, no graph
    assert instead(0.05, 512, 8192) == 25 * 16  # 416 tokens in the step: within the graph
    assert instead(0.08, 512, 8192) == 31 * 16  # 40 blocks asked, 31 fit beside the 16-token tail
    assert instead(0.08, 512, 8192 + 15) == 31 * 16  # 15 tokens after the 512 servable blocks: (512 - 15) // 16
    assert instead(0.08, 512, 16384) == 31 * 16 and instead(0.08, None, 16384) == 81 * 16
    assert instead(0.08, 512, 16384, num_computed=16000) == 1 * 16  # vLLM's own hit leaves 23 servable blocks
    assert instead(0.08, 16, 8192) == 0 and instead(0.0, 512, 8192) == 0 and instead(0.5, 512, 16) == 0


def test_load_at_alloc_stays_off_under_async_scheduling(caplog):
    """Under vLLM's asynchronous scheduling the previous step's forward may still write into a
    block allocated for the next: an early copy into it would race, so the setting is refused
    there with a log line naming the way out."""
    from types import SimpleNamespace

    from pegaflow.connector._vllm import loads_at_alloc

    on = Settings.from_extra({"load_at_alloc": True}, {})
    sync, asyn = (SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=v)) for v in (False, True))
    assert loads_at_alloc(on, sync) is True
    assert loads_at_alloc(Settings.from_extra({}, {}), sync) is False
    with caplog.at_level("WARNING", logger="pegaflow.connector"):
        assert loads_at_alloc(on, asyn) is False
    assert "--no-async-scheduling" in caplog.text



def test_the_low_ttft_preset_sets_the_fastest_measured_loads_and_each_explicit_setting_wins():
    """preset low_ttft: in-step loads begun at allocation with a 3% compute share (the bench's
    _instepxr3 set-up) where the caller set none of them; each key or variable of its own wins."""
    plain = Settings.from_extra({}, {})
    assert (plain.preset, plain.load_in_step, plain.load_at_alloc, plain.compute_share) == ("none", None, False, 0.0)
    for extra, env in (({"preset": "low_ttft"}, {}), ({}, {"PEGAFLOW_PRESET": "LOW_TTFT"}),
                       ({"pegaflow.preset": "low_ttft"}, {"PEGAFLOW_PRESET": "none"})):
        s = Settings.from_extra(extra, env)
        assert (s.preset, s.load_in_step, s.load_at_alloc, s.compute_share) == ("low_ttft", True, True, 0.03), (extra, env)
    s = Settings.from_extra({"preset": "low_ttft", "load_at_alloc": False, "compute_share": 0},
                            {"PEGAFLOW_LOAD_IN_STEP": "auto"})
    assert (s.load_in_step, s.load_at_alloc, s.compute_share) == (None, False, 0.0)
    assert Settings.from_extra({"preset": "low_ttft"}, {"PEGAFLOW_COMPUTE_SHARE": "0.05"}).compute_share == 0.05
    assert Settings.from_extra({"preset": "none"}, {}).load_at_alloc is False
    for bad in ("fast", "", 1):
        with pytest.raises(InvalidArgumentError, match=rf"preset '{bad}'; expected one of \['none', 'low_ttft'\]"):
            Settings.from_extra({"preset": bad}, {})


def test_the_low_ttft_preset_sets_the_copy_engines_lead_and_staging_where_they_apply():
    low = Settings.from_extra({"preset": "low_ttft"}, {})
    lead = {"PEGAFLOW_CUDA_LAYER_LEAD_MIB": "16384", "PEGAFLOW_CUDA_LAYER_LEAD_PACED": "1"}
    assert low.engine_env(gpu=True, zeroing=False) == {**lead, "PEGAFLOW_PRESTAGE_MIB": "4096"}
    # where vLLM zeroes new blocks a lead's bytes would be wiped (the connector refuses one there)
    assert low.engine_env(gpu=True, zeroing=True) == {"PEGAFLOW_PRESTAGE_MIB": "4096"}
    # without a GPU: no CUDA lead, and the host engine's staging buffer is host memory, kept small
    assert low.engine_env(gpu=False, zeroing=False) == {"PEGAFLOW_PRESTAGE_MIB": "256"}
    assert Settings.from_extra({}, {}).engine_env(gpu=True, zeroing=False) == {}


def test_a_preset_leaves_the_processs_own_engine_variables_as_they_are(monkeypatch, caplog):
    pytest.importorskip("vllm")
    from pegaflow.connector._vllm import apply_preset

    for k in ("PEGAFLOW_CUDA_LAYER_LEAD_MIB", "PEGAFLOW_CUDA_LAYER_LEAD_PACED", "PEGAFLOW_PRESTAGE_MIB"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("PEGAFLOW_PRESTAGE_MIB", "1024")
    low = Settings.from_extra({"preset": "low_ttft"}, {})
    with caplog.at_level("INFO", logger="pegaflow.connector"):
        applied = apply_preset(low, SimpleNamespace(needs_kv_cache_zeroing=False), gpu=True)
    assert applied == {"PEGAFLOW_CUDA_LAYER_LEAD_MIB": "16384", "PEGAFLOW_CUDA_LAYER_LEAD_PACED": "1"}
    assert os.environ["PEGAFLOW_PRESTAGE_MIB"] == "1024" and os.environ["PEGAFLOW_CUDA_LAYER_LEAD_MIB"] == "16384"
    assert "preset low_ttft" in caplog.text and "the process's own PEGAFLOW_PRESTAGE_MIB=1024" in caplog.text
    monkeypatch.delenv("PEGAFLOW_CUDA_LAYER_LEAD_MIB")
    assert apply_preset(Settings.from_extra({}, {}), None, gpu=True) == {}
    assert "PEGAFLOW_CUDA_LAYER_LEAD_MIB" not in os.environ
