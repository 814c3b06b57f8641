"""vLLM's KV-cache groups as the connector stores them (vLLM's hybrid KV cache manager).

A model has one group (full attention or MLA) or several: sliding-window attention beside full
attention (Gemma 2/3, gpt-oss, Mistral-style windows), or attention beside Mamba / linear
attention layers (Jamba, Bamba, Qwen3-Next...) when vLLM keeps their states per block
(``mamba_cache_mode='align'``). Each group is its own store instance, so a group's blocks hold
its own layers and nothing else: group 0 keeps the engine's instance id, group ``g`` is
``<instance>/g<g>``. What a hit needs from each kind is decided in Java
(``io.pegaflow.connector.CacheGroup``); this file only reads vLLM's specs and refuses, with the
reason, what is not supported.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._brain import FULL, RECURRENT, SLIDING, Group


@dataclass(frozen=True)
class GroupPlan:
    index: int
    group: Group
    layer_names: tuple[str, ...]
    spec: str  # vLLM's spec class name (logs, namespaces)


def _kind(spec) -> tuple[int, int]:
    """(kind, window tokens) of one group's spec; ValueError with the reason when unsupported."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, MLAAttentionSpec, SlidingWindowSpec

    name = type(spec).__name__
    if type(spec) in (FullAttentionSpec, MLAAttentionSpec):
        return FULL, 0
    if type(spec) is SlidingWindowSpec:
        # vLLM keeps the window's tokens plus the ones it retains past them (get_num_skipped_tokens)
        return SLIDING, int(spec.sliding_window) + int(getattr(spec, "extra_retained_tokens", 0) or 0)
    if isinstance(spec, MambaSpec):
        mode = getattr(spec, "mamba_cache_mode", "none")
        if mode != "align":
            raise ValueError(
                f"KV-cache group {name} with mamba_cache_mode '{mode}': vLLM then keeps one state per request, not "
                "per block, so there is no state to store at a block boundary; expected mamba_cache_mode 'align' "
                "(vLLM's --mamba-cache-mode align, with prefix caching on)"
            )
        if int(getattr(spec, "num_speculative_blocks", 0) or 0):
            raise ValueError(f"KV-cache group {name} with speculative blocks: recurrent states of speculative decoding "
                             "are not stored; expected num_speculative_blocks 0")
        return RECURRENT, 0
    raise ValueError(
        f"KV-cache group {name} is not supported (supported: FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec, "
        "MambaSpec in align mode). Start vLLM with --disable-hybrid-kv-cache-manager if the model allows it, or use "
        "another connector for this model"
    )


def plan(kv_cache_config, block_size: int, instance_id: str) -> list[GroupPlan]:
    """The groups of ``kv_cache_config`` in vLLM's order, or ValueError naming what is not supported."""
    groups = kv_cache_config.kv_cache_groups
    if not groups:
        raise ValueError("vLLM's kv_cache_config has no KV-cache group; expected at least one")
    out = []
    for i, g in enumerate(groups):
        spec = g.kv_cache_spec
        kind, window = _kind(spec)
        if int(spec.block_size) != block_size:
            raise ValueError(
                f"KV-cache group {i} ({type(spec).__name__}) has block size {spec.block_size} where the scheduler hashes "
                f"blocks of {block_size} tokens; expected one block size for every group (one hash per block)"
            )
        instance = instance_id if i == 0 else f"{instance_id}/g{i}"
        out.append(GroupPlan(i, Group(instance, kind, window), tuple(g.layer_names), type(spec).__name__))
    return out
