"""The engine's vLLM block hasher (Java, C ABI ``block_hashes``) against vLLM's own
``hash_block_tokens`` from the installed vllm 0.33, for each of its prefix-caching hash
algorithms and seeds, on seeded random token lists: a native engine that hashes its tokens
this way shares a namespace with vLLM instances (wave 2, 8/8)."""

from __future__ import annotations

import random

import pytest

pytestmark = pytest.mark.integration

kv_cache_utils = pytest.importorskip("vllm.v1.core.kv_cache_utils", reason="needs vllm==0.33.0 (make setup)")
pytest.importorskip("xxhash", reason="vLLM's xxhash algorithms need the xxhash package (the test extra has it)")

from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402

from pegaflow.engine import vllm_block_hashes  # noqa: E402
from pegaflow.errors import InvalidArgumentError  # noqa: E402

ALGOS = ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]


def vllm_chain(algo: str, seed: str | None, tokens: list[int], block_size: int, monkeypatch) -> list[bytes]:
    """What vLLM computes: NONE_HASH from the seed as init_none_hash derives it, then the chain."""
    if seed is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", seed)
    fn = get_hash_fn_by_name(algo)
    kv_cache_utils.init_none_hash(fn)
    out, parent = [], None
    for i in range(len(tokens) // block_size):
        parent = kv_cache_utils.hash_block_tokens(fn, parent, tokens[i * block_size:(i + 1) * block_size])
        out.append(bytes(parent))
    return out


@pytest.mark.parametrize("algo", ALGOS)
def test_the_java_hasher_matches_vllms_hash_block_tokens(algo, monkeypatch):
    rnd = random.Random(f"vllm-hash-{algo}")
    seeds = ["0", "42", "pegaflow"] + ([None] if algo.startswith("sha256") else [])
    for seed in seeds:
        for _ in range(6):
            block_size = rnd.choice([1, 3, 16, 32, 64, 256])
            n = rnd.randrange(0, 8 * block_size + 5)
            # token ids of every encoding width (1, 2, 4 bytes; past 2^31 is not a token id)
            tokens = [rnd.choice([rnd.randrange(256), rnd.randrange(65536), rnd.randrange(2**31)]) for _ in range(n)]
            want = vllm_chain(algo, seed, tokens, block_size, monkeypatch)
            assert vllm_block_hashes(tokens, block_size, algo, seed) == want, (algo, seed, block_size, n)
            if len(want) > 1:  # continuing from a parent gives the rest of the chain
                rest = tokens[block_size:]
                assert vllm_block_hashes(rest, block_size, algo, seed, parent=want[0]) == want[1:]


def test_a_block_larger_than_a_pickle_frame_and_pegainfers_golden_vector(monkeypatch):
    """A block whose pickle spans two 64 KiB frames (CPython commits a frame at the first
    object boundary past 64 KiB); and NONE_HASH for seed "0" under xxhash_cbor, the value
    PegaInfer pins in its tests (1ebe3657...aaeca, ../shared/reference/pegainfer-embedding.md)."""
    rnd = random.Random(7)
    tokens = [rnd.randrange(40000, 60000) for _ in range(30000)]
    for algo in ("sha256", "xxhash"):
        assert vllm_block_hashes(tokens, 30000, algo, "1") == vllm_chain(algo, "1", tokens, 30000, monkeypatch)
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    kv_cache_utils.init_none_hash(get_hash_fn_by_name("xxhash_cbor"))
    none = bytes(kv_cache_utils.NONE_HASH).hex()
    assert none.startswith("1ebe3657") and none.endswith("aaeca")
    first = vllm_block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, "xxhash_cbor", "0")
    assert first[0].hex().startswith("0a8577df") and first[0].hex().endswith("c52e")
    assert first[1].hex().startswith("d152782c") and first[1].hex().endswith("5e23")


def test_bad_requests_name_the_value():
    with pytest.raises(InvalidArgumentError, match="hash algorithm 'md5'; expected sha256, sha256_cbor, xxhash"):
        vllm_block_hashes([1, 2], 1, "md5")
    with pytest.raises(InvalidArgumentError, match="xxhash without a seed.*PYTHONHASHSEED"):
        vllm_block_hashes([1, 2], 1, "xxhash")
    with pytest.raises(InvalidArgumentError, match="block size 0; expected >= 1"):
        vllm_block_hashes([1, 2], 0, "sha256")
    with pytest.raises(InvalidArgumentError, match=r"token id 1099511627776; expected integers from 0 to 2147483647"):
        vllm_block_hashes([1, 1 << 40], 1, "sha256")
    with pytest.raises(InvalidArgumentError, match=r"token id 'x'; expected integers"):
        vllm_block_hashes([1, "x"], 1, "sha256")


def test_the_key_warm_up_runs_only_where_the_process_keys_its_own_chain(monkeypatch):
    """BlockKeys.warm_up computes throwaway chains on a daemon thread where the connector keys
    blocks by its own chain, and nothing where vLLM's hashes are the keys; the keys of a request
    afterwards are the chain of its tokens, as without it; it starts once per process;
    PEGAFLOW_WARM_UP=0 turns it off (PEGAFLOW_KEY_WARM_UP=0 too, its former name)."""
    import types

    from pegaflow.connector import _compat, _keys

    monkeypatch.setattr(_keys, "WARM_UP_TOKENS", 1024)
    monkeypatch.setattr(_keys, "_warm_up_started", False)
    monkeypatch.setattr(_compat, "none_hash_is_reproducible", lambda algo: True)
    assert _keys.BlockKeys("sha256", 16).warm_up() is None
    monkeypatch.setattr(_compat, "none_hash_is_reproducible", lambda algo: False)
    import pegaflow.engine

    chains = []

    def counted(tokens, *args, **kwargs):
        chains.append((len(tokens), max(tokens), args[1:3]))
        return vllm_block_hashes(tokens, *args, **kwargs)

    monkeypatch.setattr(pegaflow.engine, "vllm_block_hashes", counted)
    keys = _keys.BlockKeys("sha256", 16)
    t = keys.warm_up(chain_tokens=128)
    assert t is not None and t.daemon and t.name == "pegaflow-key-warm-up"
    t.join(30)
    assert not t.is_alive()
    # 1,024 ids in chains of 128 through the Java hasher, with the process's algorithm and seed,
    # and ids past 65,535 among them (the hasher's longer encodings compiled too)
    assert len(chains) == 8 and all(n == 128 and top > 65535 for n, top, _ in chains)
    assert {a for _, _, a in chains} == {("sha256", _compat.none_hash_seed())}
    assert _keys.BlockKeys("sha256", 16).warm_up() is None  # once per process
    monkeypatch.undo()
    monkeypatch.setattr(_compat, "none_hash_is_reproducible", lambda algo: False)
    rng = random.Random(5)
    tokens = [rng.randrange(50000) for _ in range(64)]
    req = types.SimpleNamespace(request_id="r", block_hashes=[b"v"] * 4, all_token_ids=tokens, lora_request=None,
                                mm_features=None, cache_salt=None)
    assert list(keys.of(req)) == vllm_block_hashes(tokens, 16, "sha256", _compat.none_hash_seed())
    monkeypatch.setattr(_keys, "_warm_up_started", False)
    for name in ("PEGAFLOW_WARM_UP", "PEGAFLOW_KEY_WARM_UP"):
        monkeypatch.setenv(name, "0")
        assert not _keys.warm_up_enabled()
        assert _keys.BlockKeys("sha256", 16).warm_up() is None
        monkeypatch.delenv(name)
    assert _keys.warm_up_enabled()



def test_keys_of_a_prefix_seen_before_come_from_the_memo(monkeypatch):
    """A request over a prefix this process keyed before takes those keys by vLLM's hashes of its
    blocks instead of hashing its tokens again; a longer one hashes only its new blocks, chained
    from the remembered key; the keys equal a fresh chain's every time; the memo stays bounded."""
    import types

    import pegaflow.engine
    from pegaflow.connector import _compat, _keys

    monkeypatch.setattr(_compat, "none_hash_is_reproducible", lambda algo: False)
    rng = random.Random(11)
    tokens = [rng.randrange(50000) for _ in range(16 * 12)]
    this_process = vllm_chain("sha256", "7", tokens, 16, monkeypatch)  # vLLM's hashes here (any seed)
    hashed = []

    def counted(toks, *args, **kwargs):
        hashed.append(len(toks))
        return vllm_block_hashes(toks, *args, **kwargs)

    monkeypatch.setattr(pegaflow.engine, "vllm_block_hashes", counted)

    def req(rid, blocks):
        return types.SimpleNamespace(request_id=rid, block_hashes=this_process[:blocks],
                                     all_token_ids=tokens[:blocks * 16], lora_request=None, mm_features=None,
                                     cache_salt=None)

    expected = vllm_block_hashes(tokens, 16, "sha256", _compat.none_hash_seed())
    keys = _keys.BlockKeys("sha256", 16)
    assert list(keys.of(req("a", 8))) == expected[:8] and hashed == [128]
    assert list(keys.of(req("b", 8))) == expected[:8] and hashed == [128]  # every key from the memo
    assert list(keys.of(req("c", 12))) == expected and hashed == [128, 64]  # the four new blocks only
    monkeypatch.setattr(_keys, "MEMO_BLOCKS", 6)
    small = _keys.BlockKeys("sha256", 16)
    assert list(small.of(req("d", 12))) == expected and len(small._memo) == 6
    assert list(small.of(req("e", 12))) == expected and len(small._memo) == 6
    assert hashed == [128, 64, 192, 96]  # e: the first six from the memo, the rest hashed
    # least recently used first out: a prefix used again outlives one that was not
    monkeypatch.setattr(_keys, "MEMO_BLOCKS", 10)
    lru = _keys.BlockKeys("sha256", 16)
    other = [rng.randrange(50000) for _ in range(16 * 4)]
    other_hashes = vllm_chain("sha256", "7", other, 16, monkeypatch)
    assert list(lru.of(req("f", 4))) == expected[:4]
    assert list(lru.of(types.SimpleNamespace(request_id="g", block_hashes=other_hashes, all_token_ids=other,
                                             lora_request=None, mm_features=None, cache_salt=None))) \
        == vllm_block_hashes(other, 16, "sha256", _compat.none_hash_seed())
    assert list(lru.of(req("h", 4))) == expected[:4]  # f's prefix used again: now the youngest
    del hashed[:]
    assert list(lru.of(req("i", 8))) == expected[:8] and hashed == [64]  # 4 more blocks: g's oldest go
    assert all(h in lru._memo for h in this_process[:8]) and len(lru._memo) <= 10
    del hashed[:]
    assert list(lru.of(req("j", 8))) == expected[:8] and hashed == []  # a third time: every key remembered


def test_prompt_embeddings_keep_vllms_hashes(monkeypatch):
    """A request of prompt embeddings (its embedded positions read as token id 0) keeps vLLM's
    hashes, which cover the embeddings: two such prompts of one length never share keys."""
    import types

    from pegaflow.connector import _compat, _keys

    monkeypatch.setattr(_compat, "none_hash_is_reproducible", lambda algo: False)
    req = types.SimpleNamespace(request_id="e", block_hashes=[b"x" * 32, b"y" * 32], all_token_ids=[0] * 32,
                                lora_request=None, mm_features=None, cache_salt=None, prompt_embeds=object())
    assert _keys.has_extra_keys(req)
    assert list(_keys.BlockKeys("sha256", 16).of(req)) == [b"x" * 32, b"y" * 32]
