"""The store's key of each full block of a request (scheduler side).

vLLM's own block hashes are the keys wherever they agree across processes. Where the
installed vLLM drew a random ``NONE_HASH`` for this process (before 0.29 without
``PYTHONHASHSEED``; the xxhash algorithms in every minor), two vLLM processes serving the same
model would never share a block, silently. There the keys are the engine's own chain over the
token ids: vLLM's hash of the same algorithm from a fixed seed (``_compat.none_hash_seed``),
computed in Java, so every process derives the same keys for the same tokens. A request with
extra keys (LoRA, multimodal inputs, a cache salt, prompt embeddings) keeps vLLM's hashes, which only Python has:
it is shared within its process only, and that is logged once.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Sequence

from . import _compat

log = logging.getLogger("pegaflow.connector")

# Token ids the warm-up chains cover in all (BlockKeys.warm_up, whatever the block size): enough
# calls of the Java hasher for the JVM to compile it with its optimizing compiler before the first
# requests. PEGAFLOW_WARM_UP=0 turns the connector's warm-ups off (this one and the lookup's).
WARM_UP_TOKENS = 2 * 1024 * 1024
# Blocks whose keys an instance remembers by vLLM's hash of them (BlockKeys._memo): a million
# tokens of 16-token blocks, ~11 MB of Python objects.
MEMO_BLOCKS = 1 << 16
WARM_UP_ENV = "PEGAFLOW_WARM_UP"
_OLD_WARM_UP_ENV = "PEGAFLOW_KEY_WARM_UP"  # its name when it covered the keys' warm-up alone (still honoured)
_warm_up_started = False  # once per process: the JIT's work is the process's, whatever the number of instances
_warm_up_lock = threading.Lock()


def warm_up_enabled() -> bool:
    """Whether the connector warms its per-request paths up at start (``PEGAFLOW_WARM_UP``, on unless 0)."""
    return all(os.environ.get(name, "").strip() != "0" for name in (WARM_UP_ENV, _OLD_WARM_UP_ENV))


# Whether the scheduler side and the workers ask the JVM to warm the request path up
# (LookupWarmUp, once per process): python -m pegaflow.bench.lookupwarm turns it off alone in its
# "keys" arm.
LOOKUP_WARM_UP = True


def lookup_warm_up_enabled() -> bool:
    """Whether the JVM's request-path warm-up is asked for (``LOOKUP_WARM_UP`` and ``PEGAFLOW_WARM_UP``)."""
    return LOOKUP_WARM_UP and warm_up_enabled()


def has_extra_keys(request) -> bool:
    """Whether vLLM's hash of the request's blocks covers more than their token ids: LoRA,
    multimodal inputs, a cache salt, or prompt embeddings (whose positions read as token id 0)."""
    return bool(getattr(request, "lora_request", None) or getattr(request, "mm_features", None)
                or getattr(request, "cache_salt", None)) or getattr(request, "prompt_embeds", None) is not None


class BlockKeys:
    """Per request, the keys of its full blocks (as many as ``request.block_hashes`` has)."""

    def __init__(self, algo: str, block_size: int):
        self.algo = algo
        self.block_size = block_size
        self._own: bool | None = None  # decided at the first request: vLLM seeds NONE_HASH after building us
        self._keys: dict[str, list[bytes]] = {}
        # vLLM's hash of a block in this process -> the store's key of it, for the chains this
        # process derived (MEMO_BLOCKS at most, the least recently used dropped first): a request
        # over a prefix seen here before (a multi-turn conversation, a shared system prompt, a
        # prompt this process saved) takes its keys from here instead of hashing its tokens again
        # on vLLM's scheduling thread. vLLM's hash of a block covers its tokens and every block
        # before it, as the key does, so equal hashes give equal keys (the trust vLLM's own prefix
        # cache puts in them).
        self._memo: dict = {}
        self._warned = False

    @property
    def own_chain(self) -> bool:
        if self._own is None:
            self._own = not _compat.none_hash_is_reproducible(self.algo)
            if self._own:
                log.info("vLLM's block hashes differ per process here (PYTHONHASHSEED is not set); the store keys "
                         "blocks by its own chain over the token ids (%s from seed '%s'), so other vLLM "
                         "processes share them", self.algo, _compat.none_hash_seed())
        return self._own

    def of(self, request) -> Sequence[bytes]:
        hashes = request.block_hashes
        if not self.own_chain:
            return hashes
        if has_extra_keys(request):
            if not self._warned:
                self._warned = True
                log.warning("request %s carries LoRA, multimodal inputs, a cache salt or prompt embeddings: its blocks keep vLLM's "
                            "per-process hashes and are shared within this process only; set PYTHONHASHSEED to "
                            "the same value in every vLLM process to share them across processes",
                            request.request_id)
            return hashes
        keys = self._keys.setdefault(request.request_id, [])
        n, bs = len(hashes), self.block_size
        if len(keys) < n:
            memo, i = self._memo, len(keys)
            while i < n:
                known = memo.pop(hashes[i], None)
                if known is None:
                    break
                memo[hashes[i]] = known  # used: to the young end, so eviction takes older prefixes first
                keys.append(known)
                i += 1
            if i < n:
                from ..engine import vllm_block_hashes

                new = vllm_block_hashes(request.all_token_ids[i * bs:n * bs], bs, self.algo,
                                        _compat.none_hash_seed(), keys[-1] if keys else None)
                keys.extend(new)
                self._remember(hashes[i:i + len(new)], new)
        return keys if len(keys) == n else keys[:n]

    def _remember(self, hashes: Sequence, keys: Sequence[bytes]) -> None:
        memo = self._memo
        if len(memo) + len(keys) > MEMO_BLOCKS:
            # the oldest eighth (or what the new chain needs) goes: one pass, not one per block
            drop = max(MEMO_BLOCKS // 8, len(memo) + len(keys) - MEMO_BLOCKS)
            for h in list(itertools.islice(memo, drop)):
                del memo[h]
        memo.update(zip(hashes, keys[:MEMO_BLOCKS]))

    def forget(self, req_id: str) -> None:
        self._keys.pop(req_id, None)

    def warm_up(self, chain_tokens: int = 16384) -> threading.Thread | None:
        """Where this process will key blocks by its own chain (vLLM's minor and ``PYTHONHASHSEED``
        say so; the first request decides for good), computes throwaway chains of
        ``chain_tokens`` token ids, ``WARM_UP_TOKENS`` in all, on a daemon thread: the JVM
        compiles the hasher from the connector's start on instead of during the first requests'
        lookups, which compute a prompt's whole chain on vLLM's scheduling thread
        (docs/benchmarks/README.md, "Block-key warm-up": ``python -m pegaflow.bench.keywarm``
        sets fresh processes with and without it side by side). The ids span the vocabularies of
        current models, so the hasher's encodings of large ids are compiled too. Returns the
        thread, or None where vLLM's own hashes are the keys, ``PEGAFLOW_WARM_UP=0``, or it
        started in this process before (once per process). A failure only logs: the keys are
        computed the same without it."""
        global _warm_up_started
        if not warm_up_enabled():
            return None
        try:
            if _compat.none_hash_is_reproducible(self.algo):
                return None
            with _warm_up_lock:
                if _warm_up_started:
                    return None
                _warm_up_started = True
            algo, bs, seed = self.algo, self.block_size, _compat.none_hash_seed()
            n = max(bs, chain_tokens // bs * bs)

            def run() -> None:
                try:
                    from ..engine import vllm_block_hashes

                    tokens = [(i * 7919) % 151_000 + 1 for i in range(n)]
                    for _ in range(max(1, WARM_UP_TOKENS // n)):
                        vllm_block_hashes(tokens, bs, algo, seed)
                except Exception as e:  # noqa: BLE001 - an optimisation only
                    log.debug("block key warm-up stopped: %s", e)

            t = threading.Thread(target=run, name="pegaflow-key-warm-up", daemon=True)
            t.start()
            return t
        except Exception as e:  # noqa: BLE001 - an optimisation only
            log.debug("block key warm-up skipped: %s", e)
            return None
