"""One tenant's saved states on one model, found by prefix without comparing every state.

Each state is filed under the hashes of its first 16, 64, 256, 512, 768, … tokens (every
``BLOCK_TOKENS`` after 256; each hash chains the one before it, so it covers the whole prefix:
two states that share one level's hash share every shorter level too). The states sharing the
most of a prompt are then in the bucket of the deepest level the prompt shares with any state —
a state outside it shares fewer tokens than that level, one inside at least that many — and
only those are compared token by token. So the questions the cache asks at every admission
(the best prefix for a prompt, whether a state already holds a slot's tokens, which shorter
states a new one extends) cost a dictionary lookup per level, not a comparison per state:
1,000 states of 6K tokens took 16 ms a lookup on the compute lane before
(benchmarks/cache_index_bench.py). A state shorter than the first level is in no bucket and
always compared.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from homelab.engine.prompt_cache.entry import Candidate, StateEntry, best_candidate, starts_with

BLOCK_TOKENS = 256
FIRST_LEVELS = (16, 64)  # finer below the first block (short prompts, small min_tokens)


def level_tokens(level: int) -> int:
    """How many tokens the ``level``-th prefix hash covers: 16, 64, 256, 512, 768, …"""
    if level < len(FIRST_LEVELS):
        return FIRST_LEVELS[level]
    return BLOCK_TOKENS * (level - len(FIRST_LEVELS) + 1)


def prefix_hashes(tokens: np.ndarray) -> tuple[int, ...]:
    """The hash of ``tokens``' first ``level_tokens(k)`` tokens for each level they reach,
    each chaining the previous one (linear in the tokens)."""
    data = memoryview(tokens.tobytes())  # one copy; its slices are hashed without copying
    size, n_tokens = tokens.itemsize, len(tokens)
    hashes: list[int] = []
    start, level, previous = 0, 0, 0
    while (end := level_tokens(level)) <= n_tokens:
        previous = hash((previous, data[size * start : size * end]))
        hashes.append(previous)
        start, level = end, level + 1
    return tuple(hashes)


class PrefixIndex:
    """The states of one (model, tenant), filed by prefix hash; iterates them in the order they
    were added."""

    def __init__(self) -> None:
        self._entries: list[StateEntry] = []
        self._hashes: dict[int, tuple[int, ...]] = {}  # id(entry) -> its prefix hashes
        # (level, prefix hash) -> the states whose first level_tokens(level) tokens hash to it
        self._sharing: dict[tuple[int, int], list[StateEntry]] = {}
        # (level, hash) -> the states whose own deepest level it is (what a longer state extends)
        self._deepest: dict[tuple[int, int], list[StateEntry]] = {}
        self._short: list[StateEntry] = []  # shorter than the first level: in no bucket

    def __iter__(self) -> Iterator[StateEntry]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, entry: object) -> bool:
        return id(entry) in self._hashes  # an entry here is alive: no other object has its id

    def add(self, entry: StateEntry) -> None:
        hashes = prefix_hashes(entry.tokens)
        self._entries.append(entry)
        self._hashes[id(entry)] = hashes
        for level, value in enumerate(hashes):
            self._sharing.setdefault((level, value), []).append(entry)
        if hashes:
            self._deepest.setdefault((len(hashes) - 1, hashes[-1]), []).append(entry)
        else:
            self._short.append(entry)

    def remove(self, entry: StateEntry) -> None:
        """Forget ``entry`` (nothing when it is not here)."""
        hashes = self._hashes.pop(id(entry), None)
        if hashes is None:
            return
        _drop(self._entries, entry)
        for level, value in enumerate(hashes):
            _drop_from_bucket(self._sharing, (level, value), entry)
        if hashes:
            _drop_from_bucket(self._deepest, (len(hashes) - 1, hashes[-1]), entry)
        else:
            _drop(self._short, entry)

    # --- the cache's questions ---------------------------------------------------------------

    def best(self, prompt: np.ndarray, at_least: int) -> Candidate | None:
        """The state serving the most of ``prompt`` (the most recently used of equals), if it
        serves ``at_least`` tokens; else None."""
        hashes = prefix_hashes(prompt[:-1])  # the last token is always evaluated: never served
        for level in range(len(hashes) - 1, -1, -1):
            bucket = self._sharing.get((level, hashes[level]))
            if bucket:
                return _at_least(best_candidate(bucket, prompt), at_least)
        if at_least >= level_tokens(0):  # every state shares fewer tokens than the first level
            return None
        return _at_least(best_candidate(self._entries, prompt), at_least)

    def starting_with(self, tokens: np.ndarray) -> list[StateEntry]:
        """The states whose tokens begin with all of ``tokens``."""
        hashes = prefix_hashes(tokens)
        pool = self._sharing.get((len(hashes) - 1, hashes[-1]), []) if hashes else self._entries
        return [entry for entry in pool if starts_with(entry.tokens, tokens)]

    def extended_by(self, tokens: np.ndarray) -> list[StateEntry]:
        """The states whose tokens are a prefix of ``tokens`` (a longer state supersedes them)."""
        hashes = prefix_hashes(tokens)
        pool = [*self._short]
        for level, value in enumerate(hashes):
            pool.extend(self._deepest.get((level, value), ()))
        return [entry for entry in pool if starts_with(tokens, entry.tokens)]


def _at_least(candidate: Candidate | None, at_least: int) -> Candidate | None:
    return candidate if candidate is not None and candidate.n_usable >= at_least else None


def _drop(entries: list[StateEntry], entry: StateEntry) -> None:
    for index, other in enumerate(entries):
        if other is entry:
            del entries[index]
            return


def _drop_from_bucket(buckets: dict[Any, list[StateEntry]], key: object, entry: StateEntry) -> None:
    bucket = buckets.get(key)
    if bucket is not None:
        _drop(bucket, entry)
        if not bucket:
            del buckets[key]
