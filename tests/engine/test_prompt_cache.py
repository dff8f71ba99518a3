"""The prompt cache on real engines: a slot's prefix outlives the slot (other tenants' work,
the engine closed and reloaded, a new process on the same data folder), only for its tenant,
and greedy output is the same token for token whether the prefix was restored or prefilled."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from engine_helpers import tiny_settings

from homelab.engine.api import GenerationRequest, RequestStats, SamplingParams
from homelab.engine.engine import Engine
from homelab.engine.prompt_cache.key import ModelKey
from homelab.engine.prompt_cache.store import CacheConfig, PromptCache
from homelab.units import MIB

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
LONG = "the agent reads the layer map, then the scheduler, then the slot table; " * 12
OTHER = "an unrelated question about the weather in a city far away " * 3
MIN_TOKENS = 32

Run = tuple[tuple[int, ...], RequestStats]
OpenEngine = Callable[..., Engine]


def cache_at(folder: Path | None, ram_mib: int = 64) -> PromptCache:
    return PromptCache(CacheConfig(ram_mib * MIB, 256 * MIB, folder, min_tokens=MIN_TOKENS))


@pytest.fixture
def open_engine(demo_model: Callable[..., Path]) -> Iterator[OpenEngine]:
    """``open_engine(cache, arch="llama", n_parallel=1, **settings)``, closed after the test."""
    engines: list[Engine] = []

    def make(
        cache: PromptCache | None, arch: str = "llama", n_parallel: int = 1, **settings: object
    ) -> Engine:
        engine = Engine.load(
            demo_model(arch),
            tiny_settings(n_parallel, 512, **settings),
            record_calibration=False,
            prompt_cache=cache,
        )
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


def run(engine: Engine, tenant: str, prompt: str) -> Run:
    completion = engine.submit(GenerationRequest(tenant, prompt, GREEDY)).collect()
    return completion.token_ids, completion.finish.stats


def test_a_prefix_comes_back_after_other_tenants_took_the_slot(
    open_engine: OpenEngine, tmp_path: Path
) -> None:
    cache = cache_at(tmp_path)
    engine = open_engine(cache)
    cold_tokens, cold = run(engine, "alice", LONG)
    assert cold.cached_tokens == 0
    run(engine, "bob", OTHER)  # the only slot: alice's prefix is saved, then cleared
    tokens, stats = run(engine, "alice", LONG)
    assert stats.cached_tokens == stats.prompt_tokens - 1  # all but the last token restored
    assert stats.evaluated_tokens == 1
    assert tokens == cold_tokens  # greedy: the same tokens as when it was prefilled
    assert cache.stats().hits_ram == 1


def test_another_tenants_identical_prompt_restores_nothing(
    open_engine: OpenEngine, tmp_path: Path
) -> None:
    cache = cache_at(tmp_path)
    engine = open_engine(cache)
    alice_tokens, _ = run(engine, "alice", LONG)
    run(engine, "bob", OTHER)  # alice's state is now only in the cache
    tokens, stats = run(engine, "carol", LONG)
    assert stats.cached_tokens == 0
    assert tokens == alice_tokens
    assert cache.stats().hits_ram + cache.stats().hits_disk == 0


def test_a_closed_engine_leaves_its_prefixes_to_the_next_load(
    open_engine: OpenEngine, tmp_path: Path
) -> None:
    """What the fleet does: evict the model (close), load it again later."""
    cache = cache_at(tmp_path)
    first = open_engine(cache)
    cold_tokens, cold = run(first, "alice", LONG)
    first.close()
    _, stats = run(open_engine(cache), "alice", LONG + " and the tests")
    assert stats.cached_tokens >= cold.prompt_tokens - 1
    assert cache.stats().hits_ram == 1
    again, _ = run(open_engine(None), "alice", LONG)
    assert again == cold_tokens


def test_a_new_process_restores_from_disk(open_engine: OpenEngine, tmp_path: Path) -> None:
    cache = cache_at(tmp_path)
    engine = open_engine(cache)
    cold_tokens, _ = run(engine, "alice", LONG)
    engine.close()
    cache.close()  # the server stopping: what is only in RAM goes to disk
    files = list(tmp_path.rglob("*.state"))
    assert files and all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    assert all(d.stat().st_mode & 0o777 == 0o700 for d in tmp_path.rglob("*") if d.is_dir())
    restarted = cache_at(tmp_path)  # a new process: only the files are left
    tokens, stats = run(open_engine(restarted), "alice", LONG)
    assert stats.cached_tokens == stats.prompt_tokens - 1
    assert tokens == cold_tokens
    assert restarted.stats().hits_disk == 1


def test_another_cache_layout_restores_nothing(open_engine: OpenEngine, tmp_path: Path) -> None:
    """Other K/V types: another key, so the q8_0 engine never sees the f16 states."""
    cache = cache_at(tmp_path)
    engine = open_engine(cache)
    run(engine, "alice", LONG)
    engine.close()
    quantized = open_engine(cache, type_k="q8_0", type_v="q8_0", flash_attn=True)
    _, stats = run(quantized, "alice", LONG)
    assert stats.cached_tokens == 0


def test_a_corrupt_file_is_dropped_and_the_prompt_prefilled(
    open_engine: OpenEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = cache_at(tmp_path)
    engine = open_engine(cache)
    cold_tokens, _ = run(engine, "alice", LONG)
    engine.close()
    cache.close()
    (state_file,) = tmp_path.rglob("*.state")
    data = bytearray(state_file.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the K/V data
    state_file.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="homelab.engine.prompt_cache"):
        tokens, stats = run(open_engine(cache_at(tmp_path)), "alice", LONG)
    assert stats.cached_tokens == 0 and tokens == cold_tokens
    assert "checksum" in caplog.text and not state_file.exists()


def test_a_data_folder_that_cannot_be_written_turns_the_disk_tier_off(
    open_engine: OpenEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The tests run as root, for whom a 0500 folder is still writable: a plain file where
    the cache folder should be makes every write fail the same way (ENOTDIR, not EROFS).
    States that fit the RAM budget are still restored; one larger than it is not kept."""
    blocker = tmp_path / "data"
    blocker.write_text("not a folder")
    cache = PromptCache(CacheConfig(4 * MIB, 256 * MIB, blocker / "prompt-cache", MIN_TOKENS))
    engine = open_engine(cache)
    cold_tokens, _ = run(engine, "alice", LONG)
    run(engine, "bob", OTHER)
    tokens, stats = run(engine, "alice", LONG)
    assert stats.cached_tokens == stats.prompt_tokens - 1 and tokens == cold_tokens
    with caplog.at_level(logging.WARNING, logger="homelab.engine.prompt_cache"):
        cache.flush()  # what a stopping server does: the write fails
        assert "disk tier is off" in caplog.text
        small = PromptCache(CacheConfig(MIB // 2, 256 * MIB, blocker / "prompt-cache", 32))
        too_big = open_engine(small)
        run(too_big, "alice", LONG)
        _, again = run(too_big, "bob", OTHER)  # ~1 MiB state: over the RAM budget, no disk
    assert again.prompt_tokens > 0  # still serving
    assert small.stats().disk_problem is not None and small.stats().ram_bytes == 0
    assert small.lookup(engine.prompt_states.model, "alice", engine.tokenize(LONG)) is None  # type: ignore[union-attr]


def test_a_recurrent_model_serves_without_the_cache(
    open_engine: OpenEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = cache_at(tmp_path)
    with caplog.at_level(logging.INFO, logger="homelab.engine"):
        engine = open_engine(cache, arch="mamba")
    assert "prompt cache off" in caplog.text
    run(engine, "alice", LONG)
    run(engine, "bob", OTHER)
    _, stats = run(engine, "alice", LONG)
    assert stats.cached_tokens == 0 and cache.stats().saves == 0


def test_a_sliding_window_state_is_not_cut_back(open_engine: OpenEngine, tmp_path: Path) -> None:
    """llama.cpp saves a window layer's cells only within the window of the state's last
    position (even with swa_full): a state that would be cut back by more than a token is
    not restored — the prompt is prefilled, and the reply is the same."""
    cache = cache_at(tmp_path)
    engine = open_engine(cache, arch="gemma3", swa_full=True)
    cold_tokens, _ = run(engine, "alice", LONG)
    run(engine, "bob", OTHER)
    tokens, stats = run(engine, "alice", LONG)  # the state holds LONG and 7 reply tokens
    assert stats.cached_tokens == 0
    assert tokens == cold_tokens


@pytest.mark.parametrize("swa_full", [True, False])
def test_a_sliding_window_model_restores_a_conversation_that_goes_on(
    open_engine: OpenEngine, tmp_path: Path, swa_full: bool
) -> None:
    cache = cache_at(tmp_path)
    engine = open_engine(cache, arch="gemma3", swa_full=swa_full)
    prompt = tuple(engine.tokenize(LONG))
    reply = engine.submit(GenerationRequest("alice", prompt, GREEDY)).collect().token_ids
    run(engine, "bob", OTHER)
    next_turn = (*prompt, *reply, *engine.tokenize(" and the tests", add_bos=False))
    completion = engine.submit(GenerationRequest("alice", next_turn, GREEDY)).collect()
    assert completion.finish.stats.cached_tokens == len(prompt) + len(reply) - 1
    cold = open_engine(None, arch="gemma3", swa_full=swa_full)
    assert (
        completion.token_ids
        == cold.submit(GenerationRequest("alice", next_turn, GREEDY)).collect().token_ids
    )


def test_many_prefixes_through_a_small_budget_keep_the_bounds_and_the_recent_ones(
    open_engine: OpenEngine, tmp_path: Path
) -> None:
    """40 distinct ~300-token prefixes (~600 KiB of state each) through 1 MiB of RAM over
    4 MiB of disk: both bounds hold after every request, the process does not grow by more
    than the budget (plus allocator slack), and the prefixes left are the latest ones."""
    import psutil

    cache = PromptCache(CacheConfig(1 * MIB, 4 * MIB, tmp_path, min_tokens=MIN_TOKENS))
    engine = open_engine(cache)
    prompts = [f"prompt {index}: " + LONG[: 500 + index] for index in range(40)]
    run(engine, "alice", prompts[0])
    rss_before = psutil.Process().memory_info().rss
    for prompt in prompts[1:]:
        run(engine, "alice", prompt)  # the previous prompt's slot state is saved
        stats = cache.stats()
        assert stats.ram_bytes <= 1 * MIB and stats.disk_bytes <= 4 * MIB
    cache.wait_for_writes()
    assert psutil.Process().memory_info().rss - rss_before < 1 * MIB + 24 * MIB
    files = sum(path.stat().st_size for path in tmp_path.rglob("*.state"))
    assert files <= 4 * MIB
    kept = [
        index
        for index, prompt in enumerate(prompts[:-1])  # the last one is still in its slot
        if (found := cache.lookup(engine_key(engine), "alice", engine.tokenize(prompt + " more")))
        and found.n_usable >= len(engine.tokenize(prompt)) - 1
    ]
    stats = cache.stats()
    assert len(kept) == stats.ram_entries + stats.disk_entries >= 5
    assert kept == list(range(kept[0], len(prompts) - 1))  # a run of the newest
    assert cache.stats().evicted >= 1


def engine_key(engine: Engine) -> ModelKey:
    assert engine.prompt_states is not None
    return engine.prompt_states.model


@pytest.mark.parametrize("arch", ["deepseek2", "moe", "qwen3"])
def test_other_cache_kinds_restore_to_the_same_reply(
    open_engine: OpenEngine, tmp_path: Path, arch: str
) -> None:
    """MLA (deepseek2: a K-only latent cache), MoE and qwen3 (per-head norms) as llama."""
    cache = cache_at(tmp_path)
    engine = open_engine(cache, arch=arch)
    cold_tokens, _ = run(engine, "alice", LONG)
    run(engine, "bob", OTHER)
    tokens, stats = run(engine, "alice", LONG)
    assert stats.cached_tokens == stats.prompt_tokens - 1
    assert tokens == cold_tokens


def test_a_restore_slower_than_prefilling_is_skipped(
    open_engine: OpenEngine, tmp_path: Path
) -> None:
    """The restore rate is set to 1 byte/s, as if measured on a hopeless device: the state
    is kept, but the prompt is prefilled (the engine's real prefill rate is far higher)."""
    cache = cache_at(tmp_path)
    engine = open_engine(cache)
    cold_tokens, _ = run(engine, "alice", LONG)
    run(engine, "bob", OTHER)
    assert engine.prompt_states is not None
    engine.prompt_states.restore_bytes_s["ram"] = 1.0
    tokens, stats = run(engine, "alice", LONG)
    assert stats.cached_tokens == 0 and tokens == cold_tokens
    assert cache.stats().hits_ram == 0 and cache.stats().ram_entries >= 1


def test_a_state_llama_cpp_refuses_is_dropped_and_the_prompt_prefilled(
    open_engine: OpenEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Bytes that are no state, filed under this engine's key (the store never reads them):
    llama.cpp refuses them, the entry is dropped, the prompt is prefilled, same reply."""
    cache = cache_at(tmp_path)
    engine = open_engine(cache)
    cold_tokens, _ = run(engine, "alice", LONG)
    run(engine, "bob", OTHER)
    cache.clear(tenant="alice")
    cache.put(engine_key(engine), "alice", engine.tokenize(LONG), bytearray(b"\x01" * 4096))
    with caplog.at_level(logging.WARNING, logger="homelab.engine.prompt_cache"):
        tokens, stats = run(engine, "alice", LONG)
    assert stats.cached_tokens == 0 and tokens == cold_tokens
    assert "refused" in caplog.text and cache.lookup(engine_key(engine), "alice", [1, 2]) is None
    assert not [e for e in cache.entries() if e.tenant == "alice" and e.n_bytes == 4096]
