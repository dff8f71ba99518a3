"""The prompt cache's store on its own: budgets, least-recent-use eviction, and files that
cannot be trusted. States here are plain bytes (the store never interprets them; the real
llama.cpp states are in test_prompt_cache.py)."""

from __future__ import annotations

import errno
import logging
import shutil
from pathlib import Path

import pytest

from homelab.engine.prompt_cache import disk
from homelab.engine.prompt_cache.key import ModelKey, short_digest
from homelab.engine.prompt_cache.store import CacheConfig, PromptCache

MODEL = ModelKey("model-a", "k=f16 v=f16 fa=0 cells=512 streams=1 swa_full=0")
OTHER_MODEL = ModelKey("model-b", MODEL.layout)
KIB = 1024


def tokens_for(index: int, n_tokens: int = 64) -> tuple[int, ...]:
    return (1, index + 2, *range(100, 100 + n_tokens - 2))


def state_bytes(index: int, n_bytes: int = KIB) -> bytes:
    return bytes([index % 251]) * n_bytes


def saved_file(folder: Path, tenant: str = "alice", index: int = 0) -> Path:
    cache = PromptCache(CacheConfig(64 * KIB, 1 << 20, folder, min_tokens=1))
    cache.put(MODEL, tenant, tokens_for(index), state_bytes(index))
    cache.close()
    (path,) = folder.rglob("*.state")
    return path


def test_a_saved_state_reads_back_the_same(tmp_path: Path) -> None:
    saved_file(tmp_path)
    cache = PromptCache(CacheConfig(64 * KIB, 1 << 20, tmp_path, min_tokens=1))
    candidate = cache.lookup(MODEL, "alice", (*tokens_for(0), 7))
    assert candidate is not None and candidate.n_usable == len(tokens_for(0))
    assert cache.load(candidate) == state_bytes(0)
    assert cache.lookup(MODEL, "bob", (*tokens_for(0), 7)) is None
    assert cache.lookup(OTHER_MODEL, "alice", (*tokens_for(0), 7)) is None


@pytest.mark.parametrize("cut_bytes", [1, 40, 2000])
def test_a_truncated_file_is_dropped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, cut_bytes: int
) -> None:
    path = saved_file(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - cut_bytes])
    with caplog.at_level(logging.WARNING):
        cache = PromptCache(CacheConfig(64 * KIB, 1 << 20, tmp_path, min_tokens=1))
    assert cache.entries() == [] and not path.exists()
    assert "dropped" in caplog.text and cache.stats().dropped_files == 1


def test_a_corrupt_state_is_dropped_when_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = saved_file(tmp_path)
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01  # inside the state bytes: the header still reads fine
    path.write_bytes(bytes(data))
    cache = PromptCache(CacheConfig(64 * KIB, 1 << 20, tmp_path, min_tokens=1))
    candidate = cache.lookup(MODEL, "alice", (*tokens_for(0), 7))
    assert candidate is not None
    with caplog.at_level(logging.WARNING):
        assert cache.load(candidate) is None
    assert "checksum" in caplog.text and not path.exists()
    assert cache.lookup(MODEL, "alice", (*tokens_for(0), 7)) is None


@pytest.mark.parametrize("foreign", ["model", "tenant"])
def test_a_file_moved_into_another_models_or_tenants_folder_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, foreign: str
) -> None:
    path = saved_file(tmp_path)
    if foreign == "model":
        target = tmp_path / OTHER_MODEL.digest / short_digest("alice") / path.name
    else:
        target = tmp_path / MODEL.digest / short_digest("bob") / path.name
    target.parent.mkdir(parents=True)
    shutil.move(path, target)
    with caplog.at_level(logging.WARNING):
        cache = PromptCache(CacheConfig(64 * KIB, 1 << 20, tmp_path, min_tokens=1))
    assert cache.lookup(OTHER_MODEL, "alice", (*tokens_for(0), 7)) is None
    assert cache.lookup(MODEL, "bob", (*tokens_for(0), 7)) is None
    assert "another model, tenant or prompt" in caplog.text and not target.exists()


def test_a_full_disk_skips_the_file_and_keeps_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A fake full disk: the write raises ENOSPC as a real one would (filling a real disk is
    not something a test may do)."""

    def disk_full(*_args: object) -> Path:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk, "write_state", disk_full)
    cache = PromptCache(CacheConfig(2 * KIB, 1 << 20, tmp_path, min_tokens=1))
    with caplog.at_level(logging.WARNING):
        for index in range(4):  # two fit the RAM budget; the older ones spill and fail
            cache.put(MODEL, "alice", tokens_for(index), state_bytes(index))
        cache.wait_for_writes()
    assert "disk is full" in caplog.text
    stats = cache.stats()
    assert stats.disk_problem is None  # a full disk is not a broken disk: try again later
    assert stats.ram_bytes <= 2 * KIB and stats.disk_entries == 0
    assert cache.lookup(MODEL, "alice", (*tokens_for(3), 7)) is not None  # newest kept


def test_a_small_ram_budget_holds_and_loses_only_the_least_recently_used(tmp_path: Path) -> None:
    """200 distinct prefixes through a 16 KiB RAM tier over a 64 KiB disk tier: both bounds
    hold at every step, and what is left is exactly the most recently used states."""
    cache = PromptCache(CacheConfig(16 * KIB, 64 * KIB, tmp_path, min_tokens=1))
    recency: list[int] = []  # indexes, least recently used first
    for index in range(200):
        cache.put(MODEL, "alice", tokens_for(index), state_bytes(index))
        recency.append(index)
        if index % 50 == 49:  # use an older one again (from disk): it becomes recent
            reused = index - 20
            found = cache.lookup(MODEL, "alice", (*tokens_for(reused), 7))
            assert found is not None and cache.load(found) == state_bytes(reused)
            recency.remove(reused)
            recency.append(reused)
        stats = cache.stats()
        assert stats.ram_bytes <= 16 * KIB and stats.disk_bytes <= 64 * KIB
    cache.wait_for_writes()
    kept = _kept(cache)
    assert len(kept) >= 16 + 20  # the disk tier is full, nothing else was lost
    assert kept == set(recency[-len(kept) :])
    assert sum(path.stat().st_size for path in tmp_path.rglob("*.state")) <= 64 * KIB


def test_a_full_ram_tier_sends_only_what_must_go_to_disk(tmp_path: Path) -> None:
    """Each state beyond a full RAM tier moves the least recently used one to disk, and only
    that one (the states queued for the writer once counted as staying: the first state
    past the budget sent the whole tier to disk and waited for every write, on the lane)."""
    cache = PromptCache(CacheConfig(16 * KIB, 1 << 20, tmp_path, min_tokens=1))
    for index in range(20):
        cache.put(MODEL, "alice", tokens_for(index), state_bytes(index))
        cache.wait_for_writes()
        stats = cache.stats()
        assert stats.ram_entries == min(index + 1, 16)
        assert stats.spilled == max(0, index + 1 - 16)
    assert sum(entry.in_ram for entry in cache.entries()) == 16
    found = cache.lookup(MODEL, "alice", (*tokens_for(19), 7))
    assert found is not None and found.entry.data is not None  # the newest stayed in RAM
    oldest = cache.lookup(MODEL, "alice", (*tokens_for(0), 7))
    assert oldest is not None and oldest.entry.data is None and oldest.entry.path is not None


def _kept(cache: PromptCache) -> set[int]:
    return {
        index
        for index in range(200)
        if (found := cache.lookup(MODEL, "alice", (*tokens_for(index), 7))) is not None
        and found.n_usable == len(tokens_for(index))
    }


def test_clearing_by_tenant_and_by_model(tmp_path: Path) -> None:
    cache = PromptCache(CacheConfig(64 * KIB, 1 << 20, tmp_path, min_tokens=1))
    cache.put(MODEL, "alice", tokens_for(0), state_bytes(0))
    cache.put(MODEL, "bob", tokens_for(1), state_bytes(1))
    cache.put(OTHER_MODEL, "alice", tokens_for(2), state_bytes(2))
    cache.flush()
    assert cache.clear(tenant="alice", model_id=MODEL.model_id) == 1
    assert {(e.model_id, e.tenant) for e in cache.entries()} == {
        (MODEL.model_id, "bob"),
        (OTHER_MODEL.model_id, "alice"),
    }
    assert cache.clear(model_id=OTHER_MODEL.model_id) == 1
    assert cache.clear() == 1
    assert not list(tmp_path.rglob("*.state"))


def test_a_longer_state_replaces_the_prefix_it_extends(tmp_path: Path) -> None:
    cache = PromptCache(CacheConfig(64 * KIB, 1 << 20, tmp_path, min_tokens=1))
    cache.put(MODEL, "alice", tokens_for(0, 32), state_bytes(0))
    cache.put(MODEL, "alice", tokens_for(0, 64), state_bytes(1))
    assert [e.n_tokens for e in cache.entries()] == [64]
    assert cache.covers(MODEL, "alice", tokens_for(0, 40))


def test_states_that_cannot_be_cut_back_keep_their_shorter_prefixes(tmp_path: Path) -> None:
    """A sliding-window model's state serves only prompts that extend it: a longer state
    neither stands for a shorter one nor replaces it."""
    cache = PromptCache(CacheConfig(64 * KIB, 1 << 20, tmp_path, min_tokens=1))
    cache.put(MODEL, "alice", tokens_for(0, 64), state_bytes(1), cuttable=False)
    assert not cache.covers(MODEL, "alice", tokens_for(0, 40), cuttable=False)
    assert cache.covers(MODEL, "alice", tokens_for(0, 63), cuttable=False)
    cache.put(MODEL, "alice", tokens_for(0, 40), state_bytes(0), cuttable=False)
    assert sorted(e.n_tokens for e in cache.entries()) == [40, 64]
