"""A tiny random-weight Llama with its own BPE tokenizer, built locally (no model hub).

``build(path)`` writes a Hugging Face model folder vLLM loads like any other: ``config.json``
(``CONFIG``: 4 layers, 2 KV heads of 64), ``model.safetensors`` (weights drawn from a
seeded generator, so every build is the same model), and a byte-level BPE tokenizer trained
with ``tokenizers`` on text this module generates (``tokenizer.json``, ``tokenizer_config.json``
with a chat template), so vLLM's OpenAI server answers text prompts. The folder is rebuilt
only when its ``BUILD`` stamp differs from this module's recipe.

    python -m pegaflow.models.tiny out/tiny-llama
    python -m pegaflow.models.tiny out/tiny-llama-swa --sliding-window 64
    python -m pegaflow.models.tiny out/tiny-granite-hybrid --mamba

``sliding_window=W`` builds the same model with every other layer's attention limited to the
last ``W`` tokens (``layer_types`` alternating ``full_attention`` / ``sliding_attention``, the
Gemma 2/3 and gpt-oss pattern, which vLLM's Llama reads): vLLM's hybrid KV cache manager then
keeps two KV-cache groups, a full-attention one and a sliding-window one.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

RECIPE = "tiny-llama/5"  # bump when anything below changes what is built
# vLLM's CPU attention kernels take head sizes from 32 up (16 is refused), and block sizes that are
# multiples of 32; this geometry runs on both the CPU builds and the CUDA build. The shape keeps a
# real model's balance between compute and KV bytes closer than a minimal model would (GQA: 8 query
# heads share 2 KV heads, a 4x MLP): a prefill costs enough that loading its KV is worth it, as on
# a real model, while a 1,000-token prompt still runs in a fraction of a second on 2 cores.
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512, "intermediate_size": 2048,
    "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 4, "head_dim": 64,
    "max_position_embeddings": 4096, "vocab_size": 1000, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}

_WORDS = (
    "the a an of to in for on with from by about system user assistant cache block token prefix store "
    "server engine request answer question model memory layer vector page copy load save share reuse "
    "fast slow first last next turn conversation prompt reply history context window value key head "
    "alpha beta gamma delta sun moon river stone tree cloud rain wind light dark red green blue one two "
    "three four five six seven eight nine ten hundred thousand please thanks yes no maybe always never"
).split()

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def corpus(seed: int = 7, lines: int = 4000) -> list[str]:
    """Deterministic training text: sentences over a small vocabulary, digits and punctuation."""
    rnd = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rnd.choice(_WORDS) for _ in range(rnd.randint(4, 16))]
        if rnd.random() < 0.3:
            words.insert(rnd.randrange(len(words)), str(rnd.randrange(10_000)))
        out.append(" ".join(words).capitalize() + rnd.choice(".?!,;:"))
    return out


def _tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def build(path: str | Path, force: bool = False, sliding_window: int | None = None) -> Path:
    """Builds (or keeps, when its stamp matches) the tiny model folder at ``path``; with
    ``sliding_window``, the hybrid variant (see the module doc)."""
    path = Path(path)
    stamp = path / "BUILD"
    recipe = RECIPE if sliding_window is None else f"{RECIPE}+swa{sliding_window}"
    if not force and stamp.exists() and stamp.read_text().strip() == recipe:
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    config = dict(CONFIG)
    tok = _tokenizer(config["vocab_size"])
    if tok.get_vocab_size() > config["vocab_size"]:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens; the model's vocab_size is "
                           f"{config['vocab_size']}")
    config.update(bos_token_id=tok.token_to_id("<s>"), eos_token_id=tok.token_to_id("</s>"),
                  pad_token_id=tok.token_to_id("<pad>"))
    torch.manual_seed(20261130)
    model = LlamaForCausalLM(LlamaConfig(**config)).to(torch.bfloat16)
    with torch.no_grad():  # a wider spread than the default init, so greedy outputs vary with the prompt
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.04)
    model.save_pretrained(path, safe_serialization=True)
    if sliding_window is not None:
        saved = json.loads((path / "config.json").read_text())
        saved.update(sliding_window=sliding_window, layer_types=[
            "full_attention" if i % 2 == 0 else "sliding_attention" for i in range(config["num_hidden_layers"])])
        (path / "config.json").write_text(json.dumps(saved, indent=1))
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
        "add_bos_token": False, "model_max_length": config["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    }, indent=1))
    (path / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                              "pad_token": "<pad>"}))
    stamp.write_text(recipe + "\n")
    return path


MAMBA_RECIPE = "tiny-granite-hybrid/1"


def build_mamba_hybrid(path: str | Path, force: bool = False) -> Path:
    """A tiny random-weight attention + Mamba2 hybrid (IBM Granite 4 hybrid layout:
    ``layer_types`` mamba, attention, mamba, attention; no experts) with this module's
    tokenizer: vLLM keeps a Mamba KV-cache group beside the attention one. vLLM's CPU build
    runs it only without prefix caching (its CPU SSD kernel has no per-chunk states for
    ``mamba_cache_mode='align'``), which is the case the connector refuses."""
    path = Path(path)
    stamp = path / "BUILD"
    if not force and stamp.exists() and stamp.read_text().strip() == MAMBA_RECIPE:
        return path
    import torch
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(CONFIG["vocab_size"])
    config = GraniteMoeHybridConfig(
        vocab_size=CONFIG["vocab_size"], hidden_size=256, intermediate_size=512, shared_intermediate_size=512,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        layer_types=["mamba", "attention", "mamba", "attention"], num_local_experts=0, num_experts_per_tok=0,
        mamba_n_heads=8, mamba_d_head=32, mamba_d_state=16, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=1,
        mamba_chunk_size=64, max_position_embeddings=CONFIG["max_position_embeddings"],
        position_embedding_type="rope", tie_word_embeddings=False, bos_token_id=tok.token_to_id("<s>"),
        eos_token_id=tok.token_to_id("</s>"), pad_token_id=tok.token_to_id("<pad>"))
    torch.manual_seed(20261201)
    model = GraniteMoeHybridForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.04)
    model.save_pretrained(path, safe_serialization=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
        "add_bos_token": False, "model_max_length": CONFIG["max_position_embeddings"], "chat_template": CHAT_TEMPLATE,
    }, indent=1))
    stamp.write_text(MAMBA_RECIPE + "\n")
    return path


if __name__ == "__main__":
    args = sys.argv[1:]
    window = int(args[args.index("--sliding-window") + 1]) if "--sliding-window" in args else None
    target = next((a for i, a in enumerate(args) if not a.startswith("--") and (i == 0 or args[i - 1] != "--sliding-window")),
                  "out/tiny-llama")
    if "--mamba" in args:
        print(build_mamba_hybrid(target, force="--force" in args))
    else:
        print(build(target, force="--force" in args, sliding_window=window))
