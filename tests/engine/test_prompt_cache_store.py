"""The prompt cache's store on its own: budgets, least-recent-use eviction, and files that
cannot be trusted. States here are plain bytes (the store never interprets them; the real
llama.cpp states are in test_prompt_cache.py)."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from pathlib import Path

import pytest

from homelab.engine.prompt_cache import disk
from homelab.engine.prompt_cache.entry import StateEntry
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
    cache.wait_for_writes()  # the writer deletes it (load runs on the lane: no disk work there)
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
    hold at every step, and what is left is exactly the most recently used states. (The
    writer is waited for after each state: a state saved while it is behind is skipped,
    test_a_slow_disk_never_holds_up_put.)"""
    cache = PromptCache(CacheConfig(16 * KIB, 64 * KIB, tmp_path, min_tokens=1))
    recency: list[int] = []  # indexes, least recently used first
    for index in range(200):
        assert cache.put(MODEL, "alice", tokens_for(index), state_bytes(index))
        cache.wait_for_writes()
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
    past the budget sent the whole tier to disk and waited for every write, on the lane).
    The tier keeps one state's room free: the next state goes in while the writer writes."""
    cache = PromptCache(CacheConfig(16 * KIB, 1 << 20, tmp_path, min_tokens=1))
    for index in range(20):
        assert cache.put(MODEL, "alice", tokens_for(index), state_bytes(index))
        cache.wait_for_writes()
        stats = cache.stats()
        assert stats.ram_entries == min(index + 1, 15)
        assert stats.spilled == max(0, index + 1 - 15)
    assert sum(entry.in_ram for entry in cache.entries()) == 15
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


def test_one_tenant_saving_state_after_state_pushes_out_only_its_own(tmp_path: Path) -> None:
    """16 KiB of RAM over 32 KiB of disk, a quarter of each per tenant: alice saving 60
    states moves and deletes only her own; bob's one state stays in RAM and on disk."""
    cache = PromptCache(CacheConfig(16 * KIB, 32 * KIB, tmp_path, min_tokens=1))
    cache.put(MODEL, "bob", tokens_for(0), state_bytes(0))
    cache.flush()  # bob's state on disk too
    for index in range(1, 61):
        cache.put(MODEL, "alice", tokens_for(index), state_bytes(index))
        cache.wait_for_writes()
        stats = cache.stats()
        assert stats.ram_bytes <= 16 * KIB and stats.disk_bytes <= 32 * KIB
    bob = cache.lookup(MODEL, "bob", (*tokens_for(0), 7))
    assert bob is not None and bob.entry.data is not None and bob.entry.path is not None
    assert cache.load(bob) == state_bytes(0)
    assert _kept(cache) >= set(range(45, 61))  # alice keeps her newest, in RAM and on disk
    assert sum(path.stat().st_size for path in tmp_path.rglob("*.state")) <= 32 * KIB


def test_the_tenant_most_over_its_share_gives_room_first(tmp_path: Path) -> None:
    """Without a disk tier: carol (a state over her quarter) loses hers before bob (within
    his) — whichever is older — and alice, far over, loses most."""
    cache = PromptCache(CacheConfig(8 * KIB, 0, None, min_tokens=1))
    cache.put(MODEL, "bob", tokens_for(0), state_bytes(0))
    cache.put(MODEL, "carol", tokens_for(1), state_bytes(1, 3 * KIB))
    for index in range(2, 12):
        cache.put(MODEL, "alice", tokens_for(index), state_bytes(index))
    tenants = [entry.tenant for entry in cache.entries()]
    assert "bob" in tenants and "carol" in tenants
    cache.put(MODEL, "dave", tokens_for(20), state_bytes(20, 4 * KIB))  # room: alice, carol
    tenants = [entry.tenant for entry in cache.entries()]
    assert "bob" in tenants and "carol" not in tenants and "dave" in tenants


def test_a_slow_disk_never_holds_up_put(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``put`` runs on the compute lane. Each file write is made to take 2 s (a slow disk
    cannot be ordered up in a test): ``put`` still returns at once — it never writes and never
    waits for the writer — while the states it pushed out of RAM are written behind it; what
    finds the RAM full of states not yet written is skipped and counted; then the written
    states are on disk and read back."""
    real_write = disk.write_state

    def slow_write(root: Path, entry: StateEntry, data: bytes | bytearray) -> Path:
        time.sleep(2.0)
        return real_write(root, entry, data)

    monkeypatch.setattr(disk, "write_state", slow_write)
    cache = PromptCache(CacheConfig(4 * KIB, 1 << 20, tmp_path / "a", min_tokens=1))
    whole = PromptCache(CacheConfig(4 * KIB, 1 << 20, tmp_path / "b", min_tokens=1))
    started = time.perf_counter()
    big = whole.put(MODEL, "bob", tokens_for(9), state_bytes(9, 5 * KIB))  # > the RAM budget
    kept = [cache.put(MODEL, "alice", tokens_for(i), state_bytes(i)) for i in range(8)]
    elapsed_s = time.perf_counter() - started
    assert elapsed_s < 1.0, f"put waited {elapsed_s:.1f} s for the disk"
    stats = cache.stats()
    assert big and stats.skipped == kept.count(False) > 0 and stats.ram_bytes <= 4 * KIB
    cache.wait_for_writes()
    whole.wait_for_writes()
    on_disk = [e for e in cache.entries() if e.on_disk]
    assert on_disk and len(list(tmp_path.glob("a/*/*/*.state"))) == len(on_disk)
    first = cache.lookup(MODEL, "alice", (*tokens_for(0), 7))
    assert first is not None and cache.load(first) == state_bytes(0)
    found = whole.lookup(MODEL, "bob", (*tokens_for(9), 7))
    assert found is not None and whole.load(found) == state_bytes(9, 5 * KIB)
    assert whole.stats().ram_bytes == 0  # written, then let go


def test_states_unused_for_the_ttl_are_deleted(tmp_path: Path) -> None:
    """When the cache opens the folder (a file's time is its state's last use), and while it
    runs (looked for at most once a minute, on a lookup or a save)."""
    path = saved_file(tmp_path)
    week_ago_s = time.time() - 8 * 24 * 3600
    os.utime(path, (week_ago_s, week_ago_s))
    cache = PromptCache(CacheConfig(64 * KIB, 1 << 20, tmp_path, min_tokens=1))
    assert cache.entries() == [] and not path.exists() and cache.stats().expired == 1
    now = [time.time()]
    config = CacheConfig(64 * KIB, 1 << 20, tmp_path, min_tokens=1, ttl_s=3600)
    cache = PromptCache(config, clock=lambda: now[0])
    cache.put(MODEL, "alice", tokens_for(0), state_bytes(0))
    cache.put(MODEL, "alice", tokens_for(1), state_bytes(1))
    cache.flush()
    now[0] += 1800
    used = cache.lookup(MODEL, "alice", (*tokens_for(1), 7))
    assert used is not None and cache.load(used) == state_bytes(1)  # restored: it stays
    now[0] += 2400
    assert cache.lookup(MODEL, "alice", (*tokens_for(0), 7), at_least=2) is None
    cache.wait_for_writes()
    assert [e.n_tokens for e in cache.entries()] == [len(tokens_for(1))]
    assert len(list(tmp_path.rglob("*.state"))) == 1 and cache.stats().expired == 1


def test_a_live_processs_temporary_file_is_left_alone(tmp_path: Path) -> None:
    """A cache opening the folder deletes the temporary files of writers that are gone, not
    the one a running server is writing now (its pid is alive: this test's own parent)."""
    saved_file(tmp_path)
    folder = next(tmp_path.glob("*/*"))
    live = folder / f"{'a' * 24}.state{disk.TEMP_MARK}{os.getppid()}"
    dead = folder / f"{'b' * 24}.state{disk.TEMP_MARK}{2**22 + 1}"  # above Linux's pid_max
    live.write_bytes(b"half a state")
    dead.write_bytes(b"half a state")
    cache = PromptCache(CacheConfig(64 * KIB, 1 << 20, tmp_path, min_tokens=1))
    assert live.exists() and not dead.exists() and len(cache.entries()) == 1


def test_a_file_deleted_while_written_does_not_turn_the_disk_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another program deleting the temporary file (``homelab prompt-cache`` used to) makes
    the rename fail with ENOENT: that state is not saved, the disk tier stays on."""

    def vanished(*_args: object) -> Path:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory")

    monkeypatch.setattr(disk, "write_state", vanished)
    cache = PromptCache(CacheConfig(64 * KIB, 1 << 20, tmp_path, min_tokens=1))
    cache.put(MODEL, "alice", tokens_for(0), state_bytes(0))
    cache.flush()
    assert cache.stats().disk_problem is None
