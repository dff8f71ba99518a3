"""Benchmark prompts never share a prefix, so no request can hit another's prefix cache."""

from __future__ import annotations

from homelab.bench.prompts import PromptSource


def test_prompts_have_exact_lengths_distinct_starts_and_fresh_tenants() -> None:
    source = PromptSource(list(range(1000)))
    prompts = [source.prompt(64) for _ in range(40)]
    assert all(len(p) == 64 for p in prompts)
    assert len({p[0] for p in prompts}) == 40
    assert len({source.tenant() for _ in range(40)}) == 40


def test_short_text_wraps_around() -> None:
    source = PromptSource([1, 2, 3])
    assert source.prompt(7) == (1, 2, 3, 1, 2, 3, 1)
