"""KV-cache geometry from the tensors vLLM registers, and the namespace derived from it.

Nothing here trusts a layout name: each layer's :class:`~pegaflow.engine.LayerRegion` comes
from the tensor's shape, strides and storage offset (``data_ptr`` includes it), so every
physical order the pinned vLLM can allocate is described the same way. vLLM 0.33 gives each
layer a view ``[num_blocks, heads, tokens, content]`` of one shared buffer, in the order the
resolved ``KVCacheLayout`` says (``LBNHC`` by default; ``LBHNC``, ``BLNHC``, ``BLHNC`` too);
the older per-layer split ``[2, num_blocks, ...]`` (K plane, then V plane) is described as
two segments. Layouts whose block is not one dense run (``LHBNC``, ``BHLNC``: heads outside
blocks) are refused with the tensor's geometry in the message.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass

from ..engine import LayerRegion
from ..errors import InvalidArgumentError


@dataclass(frozen=True)
class LayerGeometry:
    """One layer's region plus what the namespace must capture about its bytes."""

    region: LayerRegion
    device: str  # "cpu" or "cuda:N"
    dtype: str
    inner_order: str  # the dims inside a block, outermost first, e.g. "H16xN16xC128"


def _dense_order(name: str, shape: tuple[int, ...], stride: tuple[int, ...], dims: range) -> str:
    """Checks that ``dims`` of the tensor pack densely (one contiguous run) and returns their
    order by stride, outermost first. Size-1 dims carry no layout and are skipped."""
    live = [d for d in dims if shape[d] != 1]
    live.sort(key=lambda d: stride[d])
    expected = 1
    for d in live:
        if stride[d] != expected:
            raise InvalidArgumentError(
                f"layer '{name}': KV tensor of shape {shape} and strides {stride}: dimension {d} has stride "
                f"{stride[d]} where a dense block needs {expected}; expected each block's bytes to be one "
                "contiguous run (vLLM layouts LBNHC, LBHNC, BLNHC, BLHNC, or per-layer [2, num_blocks, ...]; "
                "LHBNC and BHLNC put heads outside blocks and are not supported)"
            )
        expected *= shape[d]
    return "x".join(f"{chr(ord('a') + d)}{shape[d]}" for d in reversed(live)) or "scalar"


def describe_layer(name: str, tensor, num_blocks: int, mla: bool) -> LayerGeometry:
    """The region of one layer's KV tensor holding ``num_blocks`` blocks."""
    shape = tuple(int(s) for s in tensor.shape)
    stride = tuple(int(s) for s in tensor.stride())
    es = int(tensor.element_size())
    if num_blocks < 1:
        raise InvalidArgumentError(f"layer '{name}': num_blocks {num_blocks}; expected >= 1")
    if len(shape) >= 2 and shape[0] == 2 and shape[1] == num_blocks and num_blocks != 2:
        # per-layer split: [2, num_blocks, ...] with the K plane before the V plane
        if mla:
            raise InvalidArgumentError(f"layer '{name}': MLA layer with a K/V-split tensor of shape {shape}; "
                                       "expected [num_blocks, ...] (MLA has one latent per token)")
        order = _dense_order(name, shape, stride, range(2, len(shape)))
        seg = math.prod(shape[2:]) * es
        layout, block_stride, seg_offset, segments = "split_kv", stride[1] * es, stride[0] * es, 2
    elif len(shape) >= 1 and shape[0] == num_blocks:
        order = _dense_order(name, shape, stride, range(1, len(shape)))
        seg = math.prod(shape[1:]) * es
        layout, block_stride, seg_offset, segments = ("mla" if mla else "combined"), stride[0] * es, 0, 1
    else:
        raise InvalidArgumentError(
            f"layer '{name}': KV tensor of shape {shape}; expected [num_blocks={num_blocks}, ...] "
            f"or [2, num_blocks={num_blocks}, ...]"
        )
    if num_blocks > 1 and block_stride < seg:
        raise InvalidArgumentError(
            f"layer '{name}': block stride {block_stride} B is smaller than a block's {seg} B (shape {shape}, "
            f"strides {stride}); expected blocks that do not overlap"
        )
    extent = (num_blocks - 1) * block_stride + (segments - 1) * seg_offset + seg
    storage = tensor.untyped_storage()
    available = storage.nbytes() - (tensor.data_ptr() - storage.data_ptr())
    if extent > available:
        raise InvalidArgumentError(
            f"layer '{name}': {num_blocks} blocks of stride {block_stride} B reach {extent} B past the tensor's "
            f"start but its storage holds {available} B there; expected num_blocks to match the KV cache"
        )
    region = LayerRegion(
        name=name, layout=layout, base_address=int(tensor.data_ptr()), region_bytes=extent,
        num_blocks=num_blocks, block_stride=block_stride, segment_bytes=seg, segment_offset=seg_offset,
    )
    return LayerGeometry(region, str(tensor.device), str(tensor.dtype).removeprefix("torch."), order)


def required_layout(vllm_config, cross_layer_blocks: bool) -> str | None:
    """The KV layout the connector asks vLLM for (see ``PegaKVConnector.get_required_kvcache_layout``)."""
    if not cross_layer_blocks:
        return None
    if getattr(vllm_config.model_config, "use_mla", False):
        return None  # one latent per token: PegaFlow and vLLM's own connectors leave MLA alone
    try:
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            return None  # the CPU attention backend takes LBHNC only
    except Exception:  # noqa: BLE001 - no platform: let vLLM decide
        pass
    return "BLNHC"


def cross_layer_views(kv_cache, attn_backend, kv_cache_config) -> dict:
    """vLLM 0.26-0.28's one tensor for all layers as the per-layer views its model reads: the
    tensor is allocated in the backend's physical order with the layer dimension included
    (``get_kv_cache_stride_order(include_num_layers_dimension=True)``, identity where the backend
    has none), so the logical order comes back by the inverse permutation, layer ``i`` being
    ``kv_cache_config.kv_cache_tensors[i]`` (every layer that shares it)."""
    try:
        order = tuple(attn_backend.get_kv_cache_stride_order(include_num_layers_dimension=True))
        if len(order) != kv_cache.dim():
            raise ValueError
    except (AttributeError, NotImplementedError, ValueError, TypeError):
        order = tuple(range(kv_cache.dim()))
    logical = kv_cache.permute(*[order.index(i) for i in range(len(order))])
    tensors = kv_cache_config.kv_cache_tensors
    if logical.shape[0] != len(tensors):
        raise InvalidArgumentError(
            f"cross-layer KV tensor of shape {tuple(kv_cache.shape)} (stride order {order}) has {logical.shape[0]} "
            f"layers where vLLM's kv_cache_config has {len(tensors)} KV tensors; expected one per layer")
    return {name: logical[i] for i, t in enumerate(tensors) for name in t.shared_by}


def layer_order(name: str) -> tuple:
    """Sort key of a layer name in the model's forward order: its numbers compared as numbers
    (``model.layers.9`` before ``model.layers.10``), the rest as text."""
    # re.split with a group alternates text and digit runs: odd indices are the digits
    return tuple((0, int(part), "") if i % 2 else (1, 0, part) for i, part in enumerate(re.split(r"([0-9]+)", name)) if part)


def describe_kv_caches(kv_caches: dict, num_blocks: int, mla: bool) -> list[LayerGeometry]:
    """Every registered layer in the model's forward order (``layer_order`` of its name, then
    its base address). A layer-wise load copies the regions in this order, so the first layer
    vLLM's forward waits for lands first. Address order copied layer 0 last on the H200 with
    vLLM 0.26, which allocates each layer's tensor on its own, and every layer's attention then
    waited for the whole load (docs/benchmarks/README.md, "Sixth H200 run"). Under the
    cross-layer layout (BLNHC) forward order is memory order: a block's layers stay one run on
    both sides and copy as one piece. They must share one device and dtype."""
    if not kv_caches:
        raise InvalidArgumentError("no KV cache tensors were registered; expected one per attention layer")
    out = []
    seen: dict[tuple, str] = {}
    for name in sorted(kv_caches, key=lambda n: (layer_order(n), int(kv_caches[n].data_ptr()))):
        t = kv_caches[name]
        key = (int(t.data_ptr()), tuple(t.shape), tuple(t.stride()), str(t.dtype))
        if key in seen:
            continue  # a layer sharing another layer's KV cache (vLLM's KV sharing): stored once
        seen[key] = name
        out.append(describe_layer(name, t, num_blocks, mla))
    devices = {g.device for g in out}
    if len(devices) != 1:
        raise InvalidArgumentError(f"KV cache tensors on several devices {sorted(devices)}; expected one per worker")
    return out


def namespace_facts(vllm_config) -> dict:
    """What a namespace must capture from vLLM's config (plain data)."""
    mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    return {
        "model": str(mc.model),
        "revision": str(getattr(mc, "revision", None)),
        "dtype": str(mc.dtype),
        "kv_cache_dtype": str(cc.cache_dtype),
        "block_size": int(cc.block_size),
        "pp": int(pc.pipeline_parallel_size),
        "hash_algo": str(getattr(cc, "prefix_caching_hash_algo", "")),
    }


def derive_namespace(facts: dict, layers: list[LayerGeometry], store_tp_size: int) -> str:
    """A name that differs whenever cached bytes would not be interchangeable: ``facts``
    (model and revision, dtypes, block size, pipeline split, prefix-hash algorithm: hashes of
    different algorithms never meet, but the namespace keeps their pools apart), per-layer
    geometry and byte order, and the store's TP split."""
    geometry = sorted({(g.region.layout, g.region.segment_bytes, g.dtype, g.inner_order) for g in layers})
    # not the regions' order: the store names a block's slots by layer name and keeps each
    # block's own slot offsets, so a block saved in one region order reads back in any other
    payload = dict(facts, geometry=geometry, layers=len(layers), tp=store_tp_size)
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]
    model = str(facts.get("model", "model")).rstrip("/").rsplit("/", 1)[-1] or "model"
    return f"{model}:bs{facts.get('block_size', '?')}:tp{store_tp_size}:{digest}"
