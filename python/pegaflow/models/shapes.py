"""Model folders holding only a ``config.json``, for vLLM's ``load_format="dummy"`` (random
weights, no download) with token-id prompts (``skip_tokenizer_init=True``): the KV geometry of
real models without their weights. ``pegaflow-bench ttft`` runs Llama-3.1-8B's shape; the GPU
tier an MLA model of DeepSeek-V2-Lite's attention shape.

    python -m pegaflow.models.shapes llama-3.1-8b out/llama-3.1-8b-shape
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "head_dim": 128,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "bos_token_id": 128000, "eos_token_id": 128001, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "attention_bias": False, "mlp_bias": False, "hidden_act": "silu",
}

# DeepSeek-V2-Lite's attention (MLA: a 512-wide latent plus 64 rope dims per token, one copy
# for every head) and width; every layer's MLP dense, so no MoE kernel is needed.
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 2048,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "kv_lora_rank": 512, "q_lora_rank": None,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64,
    "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 27, "moe_layer_freq": 1,
    "norm_topk_prob": False, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "topk_method": "greedy",
    "n_group": 1, "topk_group": 1, "vocab_size": 102400, "max_position_embeddings": 163840,
    "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "bos_token_id": 100000, "eos_token_id": 100001,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "attention_bias": False, "hidden_act": "silu",
}

SHAPES = {"llama-3.1-8b": LLAMA_31_8B, "deepseek-v2-lite": DEEPSEEK_V2_LITE}


def tiny_deepseek_v2(layers: int = 4, vocab: int = 1000) -> dict:
    """DeepSeek-V2-Lite's attention shape over a few dense layers and a small vocabulary."""
    return dict(DEEPSEEK_V2_LITE, num_hidden_layers=layers, first_k_dense_replace=layers, vocab_size=vocab,
                bos_token_id=1, eos_token_id=2)


def kv_bytes_per_token(config: dict, dtype_bytes: int = 2) -> int:
    """KV bytes one token takes over all layers (MLA: the latent and the rope dims, once)."""
    layers = int(config["num_hidden_layers"])
    if "kv_lora_rank" in config:
        return layers * (int(config["kv_lora_rank"]) + int(config["qk_rope_head_dim"])) * dtype_bytes
    head_dim = int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    return layers * 2 * int(config["num_key_value_heads"]) * head_dim * dtype_bytes


def write(path: str | Path, config: dict) -> Path:
    """A model folder with ``config`` as its ``config.json`` (rewritten only when it changed)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    target = path / "config.json"
    text = json.dumps(config, indent=1, sort_keys=True)
    if not target.exists() or target.read_text() != text:
        target.write_text(text)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in SHAPES:
        sys.exit(f"usage: python -m pegaflow.models.shapes {{{','.join(SHAPES)}}} DIR")
    print(write(sys.argv[2], SHAPES[sys.argv[1]]))
