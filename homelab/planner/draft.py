"""The draft model of speculative decoding in a plan: its vocabulary, settings and memory.

The engine loads a draft (``--draft MODEL``) beside the target on a second llama.cpp context
made from the target's context parameters with ``swa_full`` on
(``engine/speculation/draft_model.py``): the same n_ctx, n_seq_max, n_batch / n_ubatch and K/V
types, and the target's ``n_gpu_layers`` (no expert offload). So the draft costs, per device,
its weights, a KV cache of the target's slot layout, its own compute buffer and (on the host)
its logits buffer — the memory model prices it with :func:`draft_settings` like any model.

A draft must speak the target's vocabulary. :func:`vocabulary` reads only the tokenizer keys
of a GGUF header (the token texts, the tokenizer type, BOS/EOS), cached by path, size and
mtime, so :func:`check_draft` can refuse a mismatch before anything is loaded and
:func:`suggest_draft` can look through the local library cheaply.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

from homelab.errors import PlanError
from homelab.gguf.model import ModelInfo
from homelab.settings import Settings

VOCAB_SLACK = 128  # padded vocabularies of one family differ by a few unused ids (the engine's)
TOKENS_KEY = "tokenizer.ggml.tokens"
_STRING, _ARRAY = 8, 9
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


@dataclass(frozen=True)
class Vocabulary:
    """A GGUF file's token texts and tokenizer type (what draft and target must share)."""

    tokenizer_model: str
    tokens: tuple[bytes, ...]

    def problem_with(self, draft: Vocabulary) -> str | None:
        """Why ``draft`` cannot draft for a target with this vocabulary; None when it can."""
        if draft.tokenizer_model != self.tokenizer_model:
            return (
                f"its tokenizer type is {draft.tokenizer_model or 'none'}, "
                f"the target's is {self.tokenizer_model or 'none'}"
            )
        if abs(len(draft.tokens) - len(self.tokens)) > VOCAB_SLACK:
            return f"it has {len(draft.tokens)} tokens, the target {len(self.tokens)}"
        for token_id, (mine, theirs) in enumerate(zip(self.tokens, draft.tokens, strict=False)):
            if mine != theirs:
                return f"token {token_id} is {theirs!r} in the draft but {mine!r} in the target"
        return None


_CACHE: dict[tuple[str, int, int], Vocabulary | None] = {}


def vocabulary(path: str | Path) -> Vocabulary | None:
    """The vocabulary in ``path``'s GGUF header; None when it is not a readable local file or
    has no token list. Cached by path, size and mtime."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError:
        return None
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _CACHE:
        try:
            with path.open("rb") as handle:
                _CACHE[key] = _read_vocabulary(handle)
        except (OSError, ValueError, struct.error, UnicodeDecodeError):
            _CACHE[key] = None
    return _CACHE[key]


def _read_vocabulary(handle: BinaryIO) -> Vocabulary | None:
    """Walk the header's key/values until the token list (stops there: tensors are not read)."""
    if handle.read(4) != b"GGUF":
        return None
    _version, _n_tensors, n_kv = struct.unpack("<IQQ", handle.read(20))
    tokenizer_model = ""
    for _ in range(n_kv):
        key = _string(handle).decode("utf-8", errors="replace")
        (value_type,) = struct.unpack("<I", handle.read(4))
        if key == TOKENS_KEY and value_type == _ARRAY:
            return Vocabulary(tokenizer_model, _string_array(handle))
        if key == "tokenizer.ggml.model" and value_type == _STRING:
            tokenizer_model = _string(handle).decode("utf-8", errors="replace")
            continue
        _skip_value(handle, value_type)
    return None


def _string(handle: BinaryIO) -> bytes:
    (length,) = struct.unpack("<Q", handle.read(8))
    return handle.read(length)


def _string_array(handle: BinaryIO) -> tuple[bytes, ...]:
    item_type, length = struct.unpack("<IQ", handle.read(12))
    if item_type != _STRING:
        raise ValueError("the token list is not an array of strings")
    return tuple(_string(handle) for _ in range(length))


def _skip_value(handle: BinaryIO, value_type: int) -> None:
    if value_type == _STRING:
        (length,) = struct.unpack("<Q", handle.read(8))
        handle.seek(length, 1)
    elif value_type == _ARRAY:
        item_type, length = struct.unpack("<IQ", handle.read(12))
        if item_type in _SCALAR_BYTES:
            handle.seek(_SCALAR_BYTES[item_type] * length, 1)
        else:
            for _ in range(length):
                _skip_value(handle, item_type)
    elif value_type in _SCALAR_BYTES:
        handle.seek(_SCALAR_BYTES[value_type], 1)
    else:
        raise ValueError(f"unknown GGUF value type {value_type}")


# --- checks --------------------------------------------------------------------------------


def check_draft(target: ModelInfo, draft: ModelInfo) -> None:
    """Refuse, before loading, a draft the engine could not use with ``target``."""
    name = Path(draft.source).name or draft.name

    def refuse(problem: str, hint: str) -> PlanError:
        return PlanError(f"The draft model {name} cannot draft for {target.name}: {problem}.",
                         hint=hint)  # fmt: skip

    family = "Use a draft from the target's model family (the same tokenizer)."
    if target.is_recurrent:
        raise refuse(
            f"the target ({target.architecture}) keeps a recurrent state, which cannot drop "
            "rejected draft tokens",
            "Plan it without --draft.",
        )
    if draft.is_recurrent:
        raise refuse(
            f"the draft ({draft.architecture}) keeps a recurrent state", "Use a transformer draft."
        )
    for what in ("bos_token_id", "eos_token_id"):
        mine, theirs = getattr(target, what), getattr(draft, what)
        if mine != theirs:
            raise refuse(f"its {what} is {theirs}, the target's is {mine}", family)
    mine_vocab, theirs_vocab = vocabulary(target.source), vocabulary(draft.source)
    if mine_vocab is None or theirs_vocab is None:
        if abs(target.n_vocab - draft.n_vocab) > VOCAB_SLACK:
            raise refuse(f"it has {draft.n_vocab} tokens, the target {target.n_vocab}", family)
        return  # a remote or catalogue target: the engine compares the token texts at load
    problem = mine_vocab.problem_with(theirs_vocab)
    if problem:
        raise refuse(problem, family)


def draft_settings(settings: Settings, draft: ModelInfo) -> Settings:
    """The settings the draft's context really gets from a target loaded with ``settings``."""
    return replace(settings, quant=draft.file_type, swa_full=True, n_cpu_moe=0)
