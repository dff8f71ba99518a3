"""One saved state and the rule that finds the longest usable one for a prompt."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from homelab.engine.prompt_cache.key import ModelKey

TOKEN_DTYPE = np.dtype("<i4")  # 4 bytes a token (Python ints in a tuple: ~36)


def as_tokens(tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    """Token ids as a compact, read-only int32 array (what entries hold and compare)."""
    array = np.array(tokens, dtype=TOKEN_DTYPE)
    array.flags.writeable = False
    return array


@dataclass(eq=False)  # an entry is itself: compared by identity
class StateEntry:
    """A sequence state for ``tokens`` (their K/V cells), held in RAM, on disk, or both."""

    model: ModelKey
    tenant: str
    tokens: np.ndarray  # int32 (as_tokens)
    n_bytes: int  # the state's size
    data: bytes | bytearray | None = None  # in RAM (None: on disk only)
    path: Path | None = None  # on disk (None: not written yet)
    last_used_s: float = 0.0  # time.time() of the last save or restore
    file_bytes: int = 0  # its file's size, once on disk
    spilling: bool = False  # queued for the disk writer (its bytes still count in RAM)


@dataclass(frozen=True)
class Candidate:
    """An entry and how many of a prompt's tokens it can stand for."""

    entry: StateEntry
    n_usable: int


def common_prefix(first: np.ndarray, second: np.ndarray, limit: int) -> int:
    """How many leading ids the two arrays share, at most ``limit``."""
    limit = min(limit, len(first), len(second))
    if limit <= 0:
        return 0
    differ = np.flatnonzero(first[:limit] != second[:limit])
    return int(differ[0]) if differ.size else limit


def usable_tokens(cached: np.ndarray, prompt: np.ndarray) -> int:
    """Prompt tokens a state of ``cached`` serves: the common prefix, short of the prompt's
    last token (it is always evaluated, for the first sample's logits)."""
    return common_prefix(cached, prompt, len(prompt) - 1)


def best_candidate(entries: Iterable[StateEntry], prompt: np.ndarray) -> Candidate | None:
    """The entry serving the most prompt tokens (the most recently used of equals)."""
    best: Candidate | None = None
    for entry in entries:
        n_usable = usable_tokens(entry.tokens, prompt)
        if n_usable == 0:
            continue
        if (
            best is None
            or n_usable > best.n_usable
            or (n_usable == best.n_usable and entry.last_used_s > best.entry.last_used_s)
        ):
            best = Candidate(entry, n_usable)
    return best


def starts_with(longer: np.ndarray, prefix: np.ndarray) -> bool:
    return len(longer) >= len(prefix) and common_prefix(longer, prefix, len(prefix)) == len(prefix)
