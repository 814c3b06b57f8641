"""The connector checks each KV tensor's storage bounds before its pointer leaves Python.

Unit tier: torch on CPU, no vLLM, no JVM. Every region the connector registers comes from
``_layout.describe_kv_caches`` (``worker.WorkerCore.register``), so a region reaching past its
tensor's storage is refused there, naming the numbers, instead of crashing the engine later.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pegaflow.connector import _layout  # noqa: E402
from pegaflow.errors import InvalidArgumentError  # noqa: E402


def test_views_ending_exactly_at_the_storage_end_pass():
    # vLLM's default: each layer is a view of one shared buffer [num_blocks, layers, ...].
    buf = torch.zeros(10, 3, 16, 32, dtype=torch.float16)
    layers = _layout.describe_kv_caches({f"l{i}": buf[:, i] for i in range(3)}, 10, mla=False)
    last = layers[-1].region
    end = last.base_address + last.region_bytes
    assert end == buf.untyped_storage().data_ptr() + buf.untyped_storage().nbytes()


def test_a_tensor_whose_storage_shrank_is_refused_with_the_numbers():
    t = torch.zeros(10, 4, 8, dtype=torch.float16)  # 10 blocks of 64 B
    t.untyped_storage().resize_(100)  # the tensor's metadata now reaches past its storage
    with pytest.raises(InvalidArgumentError, match=r"layer 'l0': 10 blocks of stride 64 B reach 640 B past the "
                                                   r"tensor's start but its storage holds 100 B there"):
        _layout.describe_kv_caches({"l0": t}, 10, mla=False)


def test_a_view_near_the_storage_end_counts_its_offset():
    buf = torch.zeros(20, 4, 8, dtype=torch.float16)
    view = buf[10:]
    buf.untyped_storage().resize_(15 * 64)  # view starts at 640 B: 320 B left for 640 B of blocks
    with pytest.raises(InvalidArgumentError, match=r"reach 640 B .* its storage holds 320 B there"):
        _layout.describe_layer("l0", view, 10, mla=False)


def test_the_legacy_split_layout_is_bounded_by_its_v_plane():
    t = torch.zeros(2, 10, 16, 2, 8, dtype=torch.float16)  # K plane then V plane, 5120 B each
    t.untyped_storage().resize_(10240 - 512)  # the last V block is gone
    with pytest.raises(InvalidArgumentError, match=r"reach 10240 B .* holds 9728 B there"):
        _layout.describe_layer("l0", t, 10, mla=False)


def test_pytorchs_default_stream_reaches_the_store_as_the_legacy_stream_never_as_a_blocking_zero():
    """PyTorch reports its default stream as 0, which the store's calls take as "block this
    thread": an in-step load would then stall vLLM's thread layer by layer and a save would not
    be ordered after the forward's writes."""
    from pegaflow.connector.worker import CU_STREAM_LEGACY, cuda_stream_handle

    assert CU_STREAM_LEGACY == 1  # cuda.h: #define CU_STREAM_LEGACY ((CUstream)0x1)
    assert cuda_stream_handle(0) == CU_STREAM_LEGACY
    assert cuda_stream_handle(0x7F00DEAD) == 0x7F00DEAD
