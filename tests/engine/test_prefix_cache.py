"""The prefix cache is per tenant: a tenant reuses its own prompts, never another's."""

from __future__ import annotations

from engine_helpers import EngineFactory

from homelab.engine.api import GenerationRequest, SamplingParams

PROMPT = "the model reads the memory of the context cache and the layer of tokens " * 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


def run(engine, tenant: str, prompt: str = PROMPT, sampling: SamplingParams = GREEDY):  # type: ignore[no-untyped-def]
    return engine.submit(GenerationRequest(tenant, prompt, sampling)).collect()


def test_same_tenant_reuses_its_prefix_and_gets_the_same_answer(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=2)
    cold = run(engine, "alice")
    warm = run(engine, "alice")
    assert cold.finish.stats.cached_tokens == 0
    assert warm.finish.stats.cached_tokens == warm.finish.stats.prompt_tokens - 1
    assert warm.finish.stats.evaluated_tokens == 1
    assert warm.token_ids == cold.token_ids


def test_same_tenant_reuses_a_shared_beginning(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=2)
    first = run(engine, "alice", PROMPT + " hello")
    second = run(engine, "alice", PROMPT + " world")
    prompt_len = len(engine.tokenize(PROMPT))
    assert first.finish.stats.cached_tokens == 0
    assert prompt_len - 2 <= second.finish.stats.cached_tokens < second.finish.stats.prompt_tokens
    stats = second.finish.stats
    assert stats.evaluated_tokens == stats.prompt_tokens - stats.cached_tokens


def test_other_tenant_with_the_same_prompt_evaluates_everything(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=2)
    alice = run(engine, "alice")
    bob = run(engine, "bob")
    assert alice.finish.stats.cached_tokens == 0
    assert bob.finish.stats.cached_tokens == 0
    assert bob.finish.stats.evaluated_tokens == bob.finish.stats.prompt_tokens
    assert bob.token_ids == alice.token_ids
    again = run(engine, "alice")  # alice's own slot was left alone
    assert again.finish.stats.cached_tokens > 0


def test_idle_slot_of_another_tenant_is_cleared_before_reuse(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=2)
    alice = run(engine, "alice")
    states = engine.slot_states()
    alice_slot = next(s for s in states if s.tenant == "alice")
    assert alice_slot.kv_pos_max >= alice.finish.stats.prompt_tokens - 1
    # carol takes the only other slot and keeps it busy
    carol = engine.submit(
        GenerationRequest("carol", "hello", SamplingParams(temperature=0.0, max_tokens=400))
    )
    next(iter(carol))
    bob = run(engine, "bob")  # the one free slot is alice's idle one
    bob_slot = next(s for s in engine.slot_states() if s.tenant == "bob")
    assert bob_slot.seq_id == alice_slot.seq_id
    assert bob.finish.stats.cached_tokens == 0
    assert bob.finish.stats.evaluated_tokens == bob.finish.stats.prompt_tokens
    assert bob.token_ids == alice.token_ids
    back = run(engine, "alice")  # the slot now holds bob's tokens: alice starts cold too
    assert back.finish.stats.cached_tokens == 0
    assert back.finish.stats.evaluated_tokens == back.finish.stats.prompt_tokens
    carol.cancel()


def test_cleared_slot_really_has_no_old_cells(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=1)
    run(engine, "alice", PROMPT * 2)  # a long prompt fills many cells
    bob = run(engine, "bob", "hello")
    (slot,) = engine.slot_states()
    assert slot.tenant == "bob"
    expected_cells = bob.finish.stats.prompt_tokens + bob.finish.stats.completion_tokens - 1
    assert slot.kv_pos_min == 0
    assert slot.kv_pos_max == expected_cells - 1  # nothing of alice's beyond bob's tokens
    assert slot.cached_tokens == expected_cells


def test_full_prompt_hit_still_evaluates_the_last_token(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=1)
    first = run(engine, "alice", "hello world")
    second = run(engine, "alice", "hello world")
    assert second.finish.stats.evaluated_tokens == 1
    assert second.token_ids == first.token_ids


def test_recurrent_model_never_reuses_a_prefix(make_engine: EngineFactory) -> None:
    engine = make_engine("mamba", n_parallel=2)
    assert not engine.load_report.prefix_reuse
    assert "recurrent" in engine.load_report.prefix_reuse_note
    cold = run(engine, "alice")
    again = run(engine, "alice")
    assert again.finish.stats.cached_tokens == 0
    assert again.finish.stats.evaluated_tokens == again.finish.stats.prompt_tokens
    assert again.token_ids == cold.token_ids
