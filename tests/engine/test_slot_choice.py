"""Which slot a request gets: the one holding its longest prefix (same tenant only), and a
short probe (a title, a quota check, Claude Code's 1-token requests) does not cut an agent's
long conversation down to the few tokens they share."""

from __future__ import annotations

from engine_helpers import EngineFactory

from homelab.engine.api import GenerationRequest, RequestStats, SamplingParams
from homelab.engine.engine import Engine

SYSTEM = "you are a coding agent; the tools read files and run the tests of the layer " * 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


def run(engine: Engine, tenant: str, prompt: str) -> RequestStats:
    return engine.submit(GenerationRequest(tenant, prompt, GREEDY)).collect().finish.stats


def test_a_conversation_goes_to_the_slot_holding_its_longest_prefix(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(n_parallel=3)
    first = "task one: " + SYSTEM
    second = "task two, another conversation: " + SYSTEM
    run(engine, "alice", first)
    run(engine, "alice", second)
    for prompt in (second + " more", first + " more", second + " more and more"):
        stats = run(engine, "alice", prompt)
        assert stats.cached_tokens >= len(engine.tokenize(prompt)) - 4  # its own slot's prefix


def test_a_short_probe_does_not_cut_a_long_conversation(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=2)
    conversation = SYSTEM * 3 + " turn one"
    run(engine, "alice", conversation)
    run(engine, "alice", SYSTEM[:20] + " quota")  # shares a few tokens with the conversation
    stats = run(engine, "alice", conversation + " turn two")
    assert stats.cached_tokens >= len(engine.tokenize(conversation)) - 2


def test_another_tenant_reuses_nothing(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=2)
    run(engine, "alice", SYSTEM)
    assert run(engine, "bob", SYSTEM + " more").cached_tokens == 0


def test_a_second_probe_takes_the_first_probes_slot(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=2)
    conversation = SYSTEM * 3 + " turn one"
    run(engine, "alice", conversation)
    run(engine, "alice", "### Task: a title for this chat, please")  # the free slot
    run(engine, "alice", "### Task: tags for this chat")  # cuts the title short, not the chat
    stats = run(engine, "alice", conversation + " turn two")
    assert stats.cached_tokens >= len(engine.tokenize(conversation)) - 2


def test_a_probe_beside_another_tenants_slot_still_spares_the_conversation(
    make_engine: EngineFactory,
) -> None:
    """The other free slot is another tenant's and was used last: the probe clears that one
    (nothing of it is reusable), not the older conversation."""
    engine = make_engine(n_parallel=2)
    conversation = SYSTEM * 3 + " turn one"
    run(engine, "alice", conversation)
    run(engine, "bob", "an unrelated question")
    run(engine, "alice", SYSTEM[:20] + " quota")
    stats = run(engine, "alice", conversation + " turn two")
    assert stats.cached_tokens >= len(engine.tokenize(conversation)) - 2
