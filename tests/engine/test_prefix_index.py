"""The prompt cache's prefix index answers as a comparison with every state would.

The index (``prompt_cache/prefix_index.py``) files states under the hashes of their first 16,
64, 256, 512, … tokens and compares only the states in one bucket. Here every answer is checked
against the plain scan it replaces, on histories shaped like real ones: states that branch off
one another at every length around the levels (a shared system prompt, turns of one chat, new
chats), states shorter than the first level, prompts that end exactly on a level, and states
removed again.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from homelab.engine.prompt_cache.entry import StateEntry, as_tokens, best_candidate, starts_with
from homelab.engine.prompt_cache.key import ModelKey
from homelab.engine.prompt_cache.prefix_index import PrefixIndex, level_tokens

MODEL = ModelKey("model", "layout")
BRANCH_POINTS = (0, 1, 15, 16, 17, 63, 64, 65, 255, 256, 257, 300, 511, 512, 513, 1024, 1100)


def entry(tokens: list[int], last_used_s: float) -> StateEntry:
    return StateEntry(MODEL, "tenant", as_tokens(tokens), 1, b"x", None, last_used_s)


def history(rng: random.Random, n_states: int) -> list[list[int]]:
    """States branching off earlier ones (or off nothing) at lengths around the levels."""
    states: list[list[int]] = []
    for _ in range(n_states):
        base = rng.choice(states) if states and rng.random() < 0.8 else []
        keep = min(rng.choice(BRANCH_POINTS), len(base))
        length = keep + rng.choice((0, 1, 5, 40, 200, 700))
        states.append(base[:keep] + [rng.randrange(2, 60) for _ in range(length - keep)])
    return [state for state in states if state]


def brute_best(entries: list[StateEntry], prompt: np.ndarray, at_least: int) -> object:
    found = best_candidate(entries, prompt)
    return None if found is None or found.n_usable < at_least else found


@pytest.mark.parametrize("seed", range(6))
def test_every_answer_matches_a_scan_of_every_state(seed: int) -> None:
    rng = random.Random(seed)
    states = history(rng, 120)
    entries = [entry(tokens, float(i % 7)) for i, tokens in enumerate(states)]  # recency ties
    index = PrefixIndex()
    for item in entries:
        index.add(item)
    for item in rng.sample(entries, 30):  # forgotten again: gone from every bucket
        index.remove(item)
        entries.remove(item)
    assert list(index) == entries
    probes = [*states[:40], *([*s, rng.randrange(2, 60)] for s in states[40:60])]
    levels = [level_tokens(k) for k in range(6)]  # 16, 64, 256, 512, 768, 1024
    probes += [s[:level] for s in states[:20] for level in levels if len(s) >= level]
    for probe in probes:
        ids = as_tokens(probe)
        for at_least in (1, 16, 100):
            ours, theirs = index.best(ids, at_least), brute_best(entries, ids, at_least)
            assert (ours is None) == (theirs is None)
            if ours is not None and theirs is not None:
                assert ours.n_usable == theirs.n_usable
                assert ours.entry.last_used_s == theirs.entry.last_used_s
        assert _ids(index.starting_with(ids)) == _ids(
            [e for e in entries if starts_with(e.tokens, ids)]
        )
        assert _ids(index.extended_by(ids)) == _ids(
            [e for e in entries if starts_with(ids, e.tokens)]
        )


def test_a_state_shorter_than_the_first_level_is_still_found() -> None:
    index = PrefixIndex()
    short = entry([5, 6, 7], 1.0)
    index.add(short)
    prompt = as_tokens([5, 6, 7, 8, 9])
    found = index.best(prompt, 1)
    assert found is not None and found.entry is short and found.n_usable == 3
    assert index.best(prompt, level_tokens(0)) is None  # too little to be worth a restore
    assert index.extended_by(prompt) == [short]
    index.remove(short)
    assert index.best(prompt, 1) is None and len(index) == 0


def _ids(entries: list[StateEntry]) -> set[int]:
    return {id(e) for e in entries}


def test_a_lookup_compares_only_the_states_that_share_the_deepest_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """500 chats under one 300-token system prompt: the next turn of one of them is compared
    with that chat's states alone, not with all 500 (the scan this index replaces)."""
    from homelab.engine.prompt_cache import prefix_index

    compared: list[int] = []

    def counting(entries: list[StateEntry], prompt: np.ndarray) -> object:
        compared.append(len(entries))
        return best_candidate(entries, prompt)

    monkeypatch.setattr(prefix_index, "best_candidate", counting)
    rng = random.Random(7)
    system = [rng.randrange(2, 60) for _ in range(300)]
    chats = [system + [rng.randrange(2, 60) for _ in range(1200)] for _ in range(500)]
    index = PrefixIndex()
    for i, tokens in enumerate(chats):
        index.add(entry(tokens, float(i)))
    found = index.best(as_tokens([*chats[123], 9, 9]), 1)
    assert found is not None and found.n_usable == len(chats[123])  # all of the chat
    assert compared == [1]
