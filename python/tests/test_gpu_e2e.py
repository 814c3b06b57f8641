"""GPU end to end: a real transformer's K/V through the worker connector and back.

A small Llama from ``transformers`` with seeded random weights prefills a prompt; its K/V
are scattered into paged GPU tensors laid out exactly as vLLM 0.33 allocates them (one int8
buffer, per-layer views ``[num_blocks, kv_heads, block_size, 2*head_dim]`` in the default
``LBNHC`` order: ``vllm/v1/worker/utils.py:allocate_kv_cache`` and
``vllm/v1/kv_cache_interface.py:create_kv_cache_views``), saved through the connector's
worker side (``WorkerCore`` running the scheduler brain's plans), wiped, loaded into
*different* block ids, gathered back, and the next tokens are decoded. The logits must be
identical to decoding from the original cache bytes, and the loaded bytes identical to the
saved ones; a block nobody loaded stays zero.

vLLM itself is not needed (the GPU machine has PyTorch and transformers but no vLLM): the
scheduler side is driven with plain data in vLLM's call order (lookup, then
update_state_after_alloc, then build_connector_meta; request_finished before freeing).
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.gpu]

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BS = 16  # vLLM's block size on CUDA
NB = 64
PROMPT_BLOCKS = 5


def block_hashes(tokens: list[int], n: int) -> list[bytes]:
    """Chained per-block hashes, as vLLM's hash_block_tokens chains them (opaque keys here)."""
    out, parent = [], b"none"
    for i in range(n):
        parent = hashlib.sha256(parent + json.dumps(tokens[i * BS:(i + 1) * BS]).encode()).digest()
        out.append(parent)
    return out


def vllm_layout_views(num_layers: int, heads: int, head_dim: int, dtype, device) -> tuple[object, dict]:
    """One int8 buffer; layer l's view [B, H, N, 2D] over bytes [l*NB*page, (l+1)*NB*page),
    physical order B, N, H, C (LBNHC)."""
    es = torch.tensor([], dtype=dtype).element_size()
    page = BS * heads * 2 * head_dim * es
    buf = torch.zeros(num_layers * NB * page, dtype=torch.int8, device=device)
    views = {}
    for layer in range(num_layers):
        raw = buf[layer * NB * page:(layer + 1) * NB * page].view(dtype)
        views[f"model.layers.{layer}.self_attn.attn"] = raw.view(NB, BS, heads, 2 * head_dim).permute(0, 2, 1, 3)
    return buf, views


def poll(core, finished, kind: str, req: str, timeout_s: float = 30) -> None:
    end = time.monotonic() + timeout_s
    while True:
        sending, recving = core.get_finished(finished)
        finished = []
        if req in (sending if kind == "S" else recving):
            return
        if time.monotonic() > end:
            raise TimeoutError(f"{kind} {req} not reported")
        time.sleep(0.001)


def layer_kv(cache, layer: int):
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


def round_trip(device: str) -> dict:
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    from pegaflow.connector import _runtime
    from pegaflow.connector._brain import SchedulerBrain
    from pegaflow.connector.worker import WorkerCore

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=64, vocab_size=1000, max_position_embeddings=1024)
    model = LlamaForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).eval()
    L, H, D = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
    tokens = torch.randint(3, cfg.vocab_size, (1, PROMPT_BLOCKS * BS + 1), generator=torch.Generator().manual_seed(1))
    prompt = tokens[0].tolist()
    cached = PROMPT_BLOCKS * BS
    with torch.no_grad():
        cold = model(tokens[:, :cached].to(device), use_cache=True).past_key_values
    kv_cold = [tuple(t.detach().clone() for t in layer_kv(cold, layer)) for layer in range(L)]

    buf, views = vllm_layout_views(L, H, D, torch.bfloat16, device)
    src = [3, 7, 8, 20, 21]  # where "the model" wrote the prompt's blocks
    names = sorted(views)
    for layer, name in enumerate(names):
        k, v = kv_cold[layer]
        for i, b in enumerate(src):
            views[name][b, :, :, :D] = k[0, :, i * BS:(i + 1) * BS, :]
            views[name][b, :, :, D:] = v[0, :, i * BS:(i + 1) * BS, :]

    settings = _runtime.Settings(mode="embedded", pool_size="256mb")
    core = WorkerCore(settings, "e2e")
    namespace = core.register(views, NB, mla=False, facts={"model": "tiny-random-llama", "block_size": BS})
    sched = SchedulerBrain(core.link.handle, "e2e", BS, True)
    hashes = block_hashes(prompt, PROMPT_BLOCKS)
    try:
        # request a: cold; its 5 full blocks are saved after "the forward"
        assert sched.lookup("a", hashes, len(prompt), 0) == 0
        sched.after_alloc("a", src + [30], 0)
        sched.schedule("a", hashes, 0, src + [30], True, 0, len(prompt))
        t0 = time.perf_counter()
        core.submit_saves(sched.build_plan())
        assert sched.request_finished("a"), "blocks held until their saves finish"
        poll(core, ["a"], "S", "a")
        save_s = time.perf_counter() - t0
        sched.finished(["a"], [])
        saved = {(name, i): views[name][b].contiguous().view(torch.int8).clone()
                 for name in names for i, b in enumerate(src)}

        buf.zero_()  # wipe the GPU cache
        dst = [40, 41, 50, 51, 60]  # different block ids
        hit = sched.lookup("b", hashes, len(prompt), 0)
        assert hit == cached
        sched.after_alloc("b", dst + [61], hit)
        t0 = time.perf_counter()
        core.start_loads(sched.build_plan())
        poll(core, [], "R", "b")
        load_s = time.perf_counter() - t0
        assert core.load_errors() == set()
        for (name, i), want in saved.items():
            assert torch.equal(views[name][dst[i]].contiguous().view(torch.int8), want), (name, i)
        assert all(int(views[n][src[0]].abs().sum()) == 0 for n in names), "an unloaded block stays zero"

        warm = DynamicCache()
        again = DynamicCache()
        for layer, name in enumerate(names):
            k = torch.cat([views[name][b, :, :, :D] for b in dst], dim=1).unsqueeze(0)
            v = torch.cat([views[name][b, :, :, D:] for b in dst], dim=1).unsqueeze(0)
            assert torch.equal(k, kv_cold[layer][0]) and torch.equal(v, kv_cold[layer][1])
            warm.update(k.contiguous(), v.contiguous(), layer)
            again.update(kv_cold[layer][0].clone(), kv_cold[layer][1].clone(), layer)

        def decode(cache, steps=4):
            logits, nxt = [], tokens[:, cached:].to(device)
            with torch.no_grad():
                for _ in range(steps):
                    out = model(nxt, past_key_values=cache, use_cache=True)
                    logits.append(out.logits[:, -1].float())
                    nxt = out.logits[:, -1:].argmax(-1)
            return torch.cat(logits)

        ref, got = decode(again), decode(warm)
        assert torch.equal(ref, got), "decoding from loaded KV must be bit-identical"
        nbytes = sum(t.numel() for t in saved.values())
        return {"device": device, "namespace": namespace, "layers": L, "blocks": PROMPT_BLOCKS, "bytes": nbytes,
                "save_ms": round(save_s * 1e3, 3), "load_ms": round(load_s * 1e3, 3),
                "logits_equal": True, "next_tokens": ref.argmax(-1).tolist()}
    finally:
        sched.close()
        core.close()
        _runtime.close_all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_llama_kv_saved_wiped_loaded_elsewhere_decodes_identically():
    result = round_trip("cuda:0")
    out = os.environ.get("PEGAFLOW_E2E_JSON")
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=2)
    print("E2E " + json.dumps(result))
