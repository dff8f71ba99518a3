"""Speculative decoding on real llama.cpp: same greedy output, drafts kept and dropped right.

The target is the tiny ``demo:spec`` model; drafts come from prompt lookup (``ngram``), its
generated draft ``demo:spec-draft`` (``draft``), or the target itself used as its own draft
(``self``: every greedy draft token is accepted, so long accepted runs are certain).
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from engine_helpers import tiny_settings

from homelab.engine.api import GenerationRequest, SamplingParams, TokenEvent, TokenLogprob
from homelab.engine.engine import Engine
from homelab.engine.handle import Completion, RequestHandle
from homelab.engine.speculation import SpeculationConfig, SpeculationError
from homelab.engine.speculation.acceptance import accept_or_resample
from homelab.engine.speculation.lookup import NgramDrafter

# Greedy decoding with speculation verifies a draft in one batch; on a CPU a batch's float
# sums differ from a single token's by ~1e-3 in the logits, so where the two best tokens are
# nearly tied either may win (as between any two batch shapes, see test_batching). Outputs
# are compared token by token while the reference's choice is clear, and the tests that
# need an exact ending use "clear" prompts, whose every greedy choice has a margin of at
# least CLEAR_MARGIN on this model (the ``clear`` fixture picks them among CANDIDATES).
NEAR_TIE = 0.02
LOGPROB_TOLERANCE = 0.05
CLEAR_MARGIN = 0.04
N_CLEAR = 4
PROMPTS = (
    "Hello world",
    "The memory of a homelab",
    "abc def ghi abc def ghi abc def",
    "one two three four five",
)
_WORDS = ("red", "green", "blue", "cat", "dog", "tree", "river", "stone", "light", "fox")
CANDIDATES = tuple(f"{a} {b}" for a, b in itertools.permutations(_WORDS, 2))[:40]
MAX_TOKENS = 48

Factory = Callable[..., Engine]


@pytest.fixture
def load(demo_model: Callable[..., Path]) -> Iterator[Factory]:
    """``load(speculation=None, n_parallel=1, arch="spec", **settings)`` -> a started engine."""
    engines: list[Engine] = []

    def make(
        speculation: SpeculationConfig | None = None,
        n_parallel: int = 1,
        arch: str = "spec",
        **settings: Any,
    ) -> Engine:
        engine = Engine.load(
            demo_model(arch),
            tiny_settings(n_parallel, 512, **settings),
            record_calibration=False,
            speculation=speculation,
        )
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


def config(kind: str, demo_model: Callable[..., Path], **options: Any) -> SpeculationConfig:
    """``ngram``, ``draft`` (demo:spec-draft) or ``self`` (the target drafts for itself)."""
    if kind == "ngram":
        return SpeculationConfig("ngram", **options)
    draft = demo_model("spec-draft" if kind == "draft" else "spec")
    return SpeculationConfig("draft", draft_path=draft, **options)


def greedy(max_tokens: int = MAX_TOKENS, **options: Any) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **options)


_tenants = itertools.count()


def run_all(
    engine: Engine,
    sampling: SamplingParams,
    prompts: tuple[str, ...] = PROMPTS,
    tenants: tuple[str, ...] | None = None,
) -> list[Completion]:
    """Submit every prompt at once; by default each with a new tenant (no prefix reuse, so
    every prompt is evaluated from its start, as in the ``plain`` reference)."""
    tenants = tenants or tuple(f"tenant-{next(_tenants)}" for _ in prompts)
    handles = [
        engine.submit(GenerationRequest(tenant, prompt, sampling))
        for tenant, prompt in zip(tenants, prompts, strict=True)
    ]
    return [handle.collect() for handle in handles]


def margin(logprob: TokenLogprob | None) -> float:
    assert logprob is not None
    return logprob.top[0][1] - logprob.top[1][1]


@pytest.fixture(scope="module")
def plain(demo_model: Callable[..., Path]) -> dict[str, Completion]:
    """Plain greedy decoding of PROMPTS and CANDIDATES on the target, with the two best
    logprobs of every choice."""
    prompts = PROMPTS + CANDIDATES
    with Engine.load(demo_model("spec"), tiny_settings(1, 512), record_calibration=False) as e:
        return dict(zip(prompts, run_all(e, greedy(logprobs=2), prompts), strict=True))


@pytest.fixture(scope="module")
def clear(plain: dict[str, Completion]) -> tuple[str, ...]:
    """Prompts whose every greedy choice is clear: any correct engine reproduces them."""
    found = [p for p in CANDIDATES if min(map(margin, plain[p].logprobs)) >= CLEAR_MARGIN]
    assert len(found) >= N_CLEAR, "too few clear prompts on this demo model"
    return tuple(found[:N_CLEAR])


def assert_same_greedy(reference: Completion, candidate: Completion) -> int:
    """Equal tokens (and logprobs) while the reference's choice is clear; the count compared."""
    compared = 0
    for ref_id, cand_id, ref_lp, cand_lp in zip(
        reference.token_ids, candidate.token_ids, reference.logprobs, candidate.logprobs,
        strict=True,
    ):  # fmt: skip
        if ref_id != cand_id:
            assert margin(ref_lp) < NEAR_TIE, f"token {compared} differs at a clear choice"
            return compared  # after a legitimate flip the continuations part
        assert cand_lp is not None and ref_lp is not None
        assert abs(ref_lp.logprob - cand_lp.logprob) < LOGPROB_TOLERANCE
        compared += 1
    assert candidate.finish.reason == reference.finish.reason
    return compared


@contextmanager
def paused(engine: Engine) -> Iterator[None]:
    """Hold the engine thread between two steps (submit and hook handles meanwhile)."""
    entered, gate = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        gate.wait(10)

    engine.run_on_engine_thread(hold)
    assert entered.wait(10)
    try:
        yield
    finally:
        gate.set()


@dataclass
class Watched:
    """Per token pushed to a handle: the engine step it came from (the tokens of one
    accepted draft share a step) and the text its event released."""

    steps: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)


def watch(engine: Engine, handle: RequestHandle, cancel_after: int | None = None) -> Watched:
    """Record ``handle``'s token events; optionally cancel right after the N-th token."""
    watched = Watched()
    push = handle.push

    def recording_push(event: Any) -> None:
        if isinstance(event, TokenEvent):
            watched.steps.append(engine.metrics().steps_total)  # the step is recorded later
            watched.texts.append(event.text)
        push(event)
        if cancel_after is not None and len(watched.steps) == cancel_after:
            handle.cancel()  # on the engine thread, between two tokens of the same step

    handle.push = recording_push  # type: ignore[method-assign]
    return watched


def submit_watched(engine: Engine, request: GenerationRequest, cancel_after: int | None = None
                   ) -> tuple[Completion, Watched]:  # fmt: skip
    with paused(engine):
        handle = engine.submit(request)
        watched = watch(engine, handle, cancel_after)
    return handle.collect(), watched


def mid_run_indices(steps: list[int], start: int = 2) -> list[int]:
    """Token indices whose neighbours on both sides came from the same step (tokens inside
    one accepted draft)."""
    found = [
        index
        for index in range(start, len(steps) - 1)
        if steps[index - 1] == steps[index] == steps[index + 1]
    ]
    assert found, f"no accepted run of three tokens in {steps}"
    return found


# --- greedy output is the target's --------------------------------------------------------


@pytest.mark.parametrize("n_parallel", [1, 3])
@pytest.mark.parametrize("kind", ["ngram", "draft", "self"])
@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed-k", "adaptive"])
def test_greedy_output_is_identical(
    load: Factory,
    demo_model: Callable[..., Path],
    plain: dict[str, Completion],
    clear: tuple[str, ...],
    kind: str,
    n_parallel: int,
    adaptive: bool,
) -> None:
    engine = load(config(kind, demo_model, adaptive=adaptive, max_draft_tokens=4), n_parallel)
    prompts = PROMPTS + clear
    got = run_all(engine, greedy(logprobs=2), prompts)
    compared = [assert_same_greedy(plain[p], c) for p, c in zip(prompts, got, strict=True)]
    assert sum(compared) >= 0.8 * MAX_TOKENS * len(prompts)
    for prompt, completion in zip(prompts, got, strict=True):
        if prompt in clear:
            assert completion.token_ids == plain[prompt].token_ids
            assert completion.text == plain[prompt].text
    metrics = engine.metrics()
    assert metrics.draft_tokens_total > 0  # it did speculate
    if not adaptive:
        assert metrics.accepted_draft_tokens_total > 0


def test_prompt_lookup_with_longer_drafts(
    load: Factory, plain: dict[str, Completion], clear: tuple[str, ...]
) -> None:
    engine = load(SpeculationConfig("ngram", adaptive=False, max_draft_tokens=16), 3)
    prompts = PROMPTS + clear
    got = run_all(engine, greedy(logprobs=2), prompts)
    compared = sum(assert_same_greedy(plain[p], c) for p, c in zip(prompts, got, strict=True))
    assert compared >= 0.7 * MAX_TOKENS * len(prompts)
    assert engine.metrics().tokens_per_target_step > 1.5  # type: ignore[operator]


def test_sliding_window_target_speculates_with_a_full_window_cache(load: Factory) -> None:
    plain_gemma = load(None, 1, arch="gemma3", swa_full=True)
    expected = run_all(plain_gemma, greedy(40, logprobs=2))
    spec = load(SpeculationConfig("ngram", adaptive=False), 1, arch="gemma3", swa_full=True)
    got = run_all(spec, greedy(40, logprobs=2))
    compared = sum(map(assert_same_greedy, expected, got))
    assert compared >= 0.8 * 40 * len(PROMPTS)
    assert spec.metrics().accepted_draft_tokens_total > 0


# --- requests that end in the middle of an accepted draft --------------------------------


@pytest.mark.parametrize("kind", ["ngram", "self"])
@pytest.mark.parametrize("max_tokens", [1, 2, 7, 23])
def test_max_tokens_ends_inside_a_draft(
    load: Factory,
    demo_model: Callable[..., Path],
    plain: dict[str, Completion],
    clear: tuple[str, ...],
    kind: str,
    max_tokens: int,
) -> None:
    engine = load(config(kind, demo_model, adaptive=False, max_draft_tokens=8), len(clear))
    tenants = tuple(f"alice-{i}" for i in range(len(clear)))  # one slot each
    first = run_all(engine, greedy(max_tokens), clear, tenants)
    for prompt, completion in zip(clear, first, strict=True):
        assert completion.token_ids == plain[prompt].token_ids[:max_tokens]
        assert completion.finish.reason == "length"
        assert completion.finish.stats.completion_tokens == max_tokens
    # the cache was rolled back to what was kept: the same prompts again, reusing it
    for prompt, completion in zip(clear, run_all(engine, greedy(), clear, tenants), strict=True):
        assert completion.finish.stats.cached_tokens > 0
        assert completion.token_ids == plain[prompt].token_ids


@pytest.mark.parametrize("kind", ["ngram", "self"])
def test_end_of_generation_ends_inside_a_draft(
    load: Factory, demo_model: Callable[..., Path], clear: tuple[str, ...], kind: str
) -> None:
    reference = load()
    eos = reference.bos_token_id + 1  # the demo vocabulary's </s>
    assert eos in reference.eog_tokens

    def run(prompt: str, bias: float) -> Completion:
        sampling = SamplingParams(temperature=0.0, max_tokens=60, logit_bias={eos: bias})
        return reference.submit(GenerationRequest("alice", prompt, sampling)).collect()

    # A biased run equals the clear unbiased one until </s> wins; that choice is clear when
    # moving the bias by NEAR_TIE either way changes nothing.
    cases = []
    for prompt, bias in itertools.product(clear, (7.0, 8.0, 9.0, 10.0, 11.0)):
        expected = run(prompt, bias)
        if expected.finish.reason == "stop" and 4 <= len(expected.token_ids) < MAX_TOKENS:
            nearby = {run(prompt, bias + shift).token_ids for shift in (-NEAR_TIE, NEAR_TIE)}
            if nearby == {expected.token_ids}:
                cases.append((prompt, bias, expected))
    assert cases, "no clear prompt stops at an end-of-generation token"
    engine = load(config(kind, demo_model, adaptive=False, max_draft_tokens=8))
    for prompt, bias, expected in cases:
        sampling = SamplingParams(temperature=0.0, max_tokens=60, logit_bias={eos: bias})
        got = engine.submit(GenerationRequest("alice", prompt, sampling)).collect()
        assert (got.token_ids, got.text) == (expected.token_ids, expected.text)
        assert got.finish.reason == "stop"
    assert engine.metrics().accepted_draft_tokens_total > 0


@pytest.mark.parametrize("kind", ["ngram", "self"])
@pytest.mark.parametrize("which", [0, 1])
def test_stop_string_inside_an_accepted_draft(
    load: Factory, demo_model: Callable[..., Path], plain: dict[str, Completion],
    clear: tuple[str, ...], kind: str, which: int,
) -> None:  # fmt: skip
    prompt = clear[which]
    engine = load(config(kind, demo_model, adaptive=False, max_draft_tokens=8))
    probe, watched = submit_watched(engine, GenerationRequest("alice", prompt, greedy()))
    assert probe.token_ids == plain[prompt].token_ids
    stop, index = stop_completed_inside_a_run(probe.text, watched)
    request = GenerationRequest("alice", prompt, greedy(stop=(stop,)))
    expected = load().submit(request).collect()
    got = engine.submit(request).collect()
    assert got.finish.reason == expected.finish.reason == "stop"
    assert got.text == expected.text == probe.text[: probe.text.find(stop)]
    assert got.token_ids == expected.token_ids == probe.token_ids[: index + 1]


def stop_completed_inside_a_run(text: str, watched: Watched) -> tuple[str, int]:
    """A stop string whose first occurrence in ``text`` is completed by a token inside an
    accepted run (more tokens of its step follow it), and that token's index."""
    ends = list(itertools.accumulate(len(piece) for piece in watched.texts))
    inside = set(mid_run_indices(watched.steps))
    for length in range(2, 40):  # prompt lookup copies earlier text: a stop must reach back
        for start in range(len(text) - length):
            stop = text[start : start + length]
            first = text.find(stop)
            completing = next(i for i, end in enumerate(ends) if end >= first + length)
            if completing in inside:
                return stop, completing
    raise AssertionError("no stop string is completed inside an accepted run")


@pytest.mark.parametrize("kind", ["ngram", "self"])
def test_cancel_inside_an_accepted_draft(
    load: Factory, demo_model: Callable[..., Path], plain: dict[str, Completion],
    clear: tuple[str, ...], kind: str,
) -> None:  # fmt: skip
    prompt = clear[0]
    engine = load(config(kind, demo_model, adaptive=False, max_draft_tokens=8))
    request = GenerationRequest("alice", prompt, greedy())
    _, watched = submit_watched(engine, request)
    index = mid_run_indices(watched.steps)[0]
    cancelled, _ = submit_watched(engine, request, cancel_after=index)
    assert cancelled.finish.reason == "cancelled"
    assert cancelled.token_ids == plain[prompt].token_ids[:index]  # nothing after the cancel
    stopped, _ = submit_watched(load(), request, cancel_after=index)
    assert (stopped.token_ids, stopped.finish.reason) == (cancelled.token_ids, "cancelled")
    # the slot's cache holds exactly what was kept: reusing it gives the whole answer
    again = engine.submit(request).collect()
    assert again.finish.stats.cached_tokens > 0
    assert again.token_ids == plain[prompt].token_ids


# --- prefix cache and tenants -------------------------------------------------------------


def test_draft_cache_follows_the_targets_prefix_cache(
    load: Factory, demo_model: Callable[..., Path], plain: dict[str, Completion],
    clear: tuple[str, ...],
) -> None:  # fmt: skip
    prompt = clear[0]
    engine = load(config("draft", demo_model, adaptive=False))
    draft = engine._speculator.draft_model  # type: ignore[union-attr]
    assert draft is not None
    first = engine.submit(GenerationRequest("alice", prompt, greedy())).collect()
    again = engine.submit(GenerationRequest("alice", prompt, greedy())).collect()
    assert first.token_ids == again.token_ids == plain[prompt].token_ids
    assert again.finish.stats.cached_tokens > 0
    cached = engine.run_on_engine_thread(lambda: draft.cached_tokens(0)).result(5)
    tokens = engine.tokenize(prompt)
    assert cached[: len(tokens)] == tokens

    def admit_for_another_tenant() -> list[int]:
        # the target reuses all of it for bob (a restored prompt cache may grant that): the
        # draft still keeps nothing of alice's
        draft.admit(0, tokens, n_cached=len(tokens), tenant="bob")
        return draft.cached_tokens(0)

    assert engine.run_on_engine_thread(admit_for_another_tenant).result(5) == []
    other = engine.submit(GenerationRequest("bob", prompt, greedy())).collect()
    assert other.finish.stats.cached_tokens == 0
    assert other.token_ids == plain[prompt].token_ids


# --- adaptivity -------------------------------------------------------------------------


def test_adaptive_drafting_backs_off_a_draft_that_disagrees(
    load: Factory, demo_model: Callable[..., Path], plain: dict[str, Completion],
    clear: tuple[str, ...],
) -> None:  # fmt: skip
    """demo:llama has the target's vocabulary but unrelated weights: its drafts fail."""
    bad = demo_model("llama")
    fixed = load(SpeculationConfig("draft", draft_path=bad, adaptive=False, max_draft_tokens=4))
    adaptive = load(SpeculationConfig("draft", draft_path=bad, max_draft_tokens=4))
    for engine in (fixed, adaptive):
        for prompt, completion in zip(clear, run_all(engine, greedy(), clear), strict=True):
            assert completion.token_ids == plain[prompt].token_ids
    tried, backed_off = fixed.metrics(), adaptive.metrics()
    assert tried.acceptance_rate is not None and tried.acceptance_rate < 0.3
    assert backed_off.draft_tokens_total < tried.draft_tokens_total / 3


# --- prompt lookup ------------------------------------------------------------------------


def test_ngram_drafter_copies_what_followed_the_longest_recent_match() -> None:
    drafter = NgramDrafter(2, 3)
    drafter.sync([5, 1, 2, 3, 9, 9, 1, 2, 4, 7, 8, 0, 1], last=2)
    assert drafter.propose(3) == (4, 7, 8)  # "1 2" last seen before "4 7 8"
    drafter.sync([5, 1, 2, 3, 9, 9, 1, 2, 4, 7, 8, 0, 1, 2], last=3)
    assert drafter.propose(2) == (9, 9)  # "1 2 3" (longer) beats the newer "1 2"
    loop = NgramDrafter(2, 4)
    loop.sync([7, 8, 7, 8, 7], last=8)
    assert loop.propose(5) == (7, 8, 7, 8, 7)  # a loop keeps proposing its next turns
    fresh = NgramDrafter(2, 4)
    fresh.sync([1, 2, 3, 4], last=5)
    assert fresh.propose(4) == ()


# --- sampling: the standard acceptance rule ---------------------------------------------


def test_acceptance_rule_leaves_the_target_distribution() -> None:
    rng = np.random.default_rng(7)
    p_ids, p = np.array([0, 1, 2, 3]), np.array([0.5, 0.3, 0.15, 0.05])
    q_ids, q = np.array([1, 2, 3, 4]), np.array([0.6, 0.1, 0.1, 0.2])
    counts = np.zeros(5)
    drafts = np.zeros(5)
    n = 40000
    for _ in range(n):
        drafted = int(rng.choice(q_ids, p=q))
        drafts[drafted] += 1
        token, kept = accept_or_resample(p_ids, p, q_ids, q, drafted, rng)
        assert kept == (token == drafted) or not kept
        counts[token] += 1
    target = np.array([0.5, 0.3, 0.15, 0.05, 0.0])
    assert np.abs(counts / n - target).sum() / 2 < 0.01  # total variation distance
    assert np.abs(drafts / n - target).sum() / 2 > 0.3  # (the draft alone would be far off)


def test_shaped_distribution_is_what_the_chain_samples(load: Factory) -> None:
    from homelab.engine.sampling import SamplerChain

    engine = load()
    params = SamplingParams(temperature=0.9, top_k=12, top_p=0.9, seed=3)

    def sample_many() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        from homelab.llamacpp.batch import Batch

        context = engine.context
        prompt = engine.tokenize("The memory of a homelab")
        batch = Batch(64)
        batch.add_run(prompt, 0, 0, output_last=True)
        assert context.decode(batch) == 0
        chain = SamplerChain(params, engine._vocab, engine.n_vocab, engine.eog_tokens)
        ids, probs = chain.distribution(context, len(prompt) - 1)
        counts = np.zeros(engine.n_vocab)
        for _ in range(4000):
            counts[chain.sample(context, len(prompt) - 1)] += 1
        chain.close()
        batch.close()
        context.memory.clear_sequence(0)
        return ids, probs, counts

    ids, probs, counts = engine.run_on_engine_thread(sample_many).result(60)
    assert 1 < len(ids) <= 12 and probs.sum() == pytest.approx(1.0)
    expected = np.zeros(engine.n_vocab)
    expected[ids] = probs
    assert np.abs(counts / counts.sum() - expected).sum() / 2 < 0.04


def test_sampled_drafts_run_and_repeat_with_a_seed(
    load: Factory, demo_model: Callable[..., Path]
) -> None:
    sampling = SamplingParams(temperature=0.8, seed=11, max_tokens=40, ignore_eos=True)
    outputs = []
    for _ in range(2):
        engine = load(config("self", demo_model, adaptive=False, max_draft_tokens=4))
        completion = engine.submit(GenerationRequest("alice", PROMPTS[1], sampling)).collect()
        assert completion.finish.reason == "length" and len(completion.token_ids) == 40
        metrics = engine.metrics()
        assert metrics.acceptance_rate is not None and 0.3 < metrics.acceptance_rate <= 1.0
        outputs.append(completion.token_ids)
    assert outputs[0] == outputs[1]


# --- metrics ------------------------------------------------------------------------------


def test_metrics_report_acceptance_and_tokens_per_step(
    load: Factory, demo_model: Callable[..., Path]
) -> None:
    engine = load(config("self", demo_model, adaptive=False, max_draft_tokens=4))
    completion = engine.submit(GenerationRequest("alice", PROMPTS[0], greedy())).collect()
    stats = completion.finish.stats
    assert stats.accepted_draft_tokens == stats.draft_tokens  # the target agrees with itself
    assert 0 < stats.accepted_draft_tokens < stats.completion_tokens
    metrics = engine.metrics()
    assert metrics.speculation == "draft"
    assert metrics.acceptance_rate == 1.0
    assert metrics.draft_tokens_total == metrics.accepted_draft_tokens_total == stats.draft_tokens
    assert metrics.tokens_per_target_step == pytest.approx(
        metrics.decode_tokens_total / (metrics.steps_total - 1)  # one step was the prefill
    )
    assert metrics.tokens_per_target_step > 3  # type: ignore[operator]
    plain = load().metrics()
    assert plain.speculation is None and plain.acceptance_rate is None
    assert plain.draft_tokens_total == 0


# --- refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("draft", "problem"),
    [
        (("llama", "bench"), "it has 32000 tokens, the target 1024"),
        (("reasoning", "tiny"), "token 1022 is b'<think>' in the draft"),
        (("bert", "tiny"), "its tokenizer type is 3"),
    ],
)
def test_a_draft_with_another_vocabulary_is_refused(
    demo_model: Callable[..., Path], draft: tuple[str, str], problem: str
) -> None:
    speculation = SpeculationConfig("draft", draft_path=demo_model(*draft))
    with pytest.raises(SpeculationError, match="cannot draft for this target") as refused:
        Engine.load(demo_model("spec"), tiny_settings(1, 512), speculation=speculation)
    assert problem in str(refused.value)
    assert "same tokenizer" in str(refused.value)


def test_a_recurrent_target_refuses_speculation(demo_model: Callable[..., Path]) -> None:
    with pytest.raises(SpeculationError, match="keeps a recurrent state"):
        Engine.load(demo_model("mamba"), tiny_settings(1, 512), speculation=SpeculationConfig())


def test_a_recurrent_draft_is_refused(demo_model: Callable[..., Path]) -> None:
    speculation = SpeculationConfig("draft", draft_path=demo_model("mamba"))
    with pytest.raises(SpeculationError, match=r"draft model .* keeps a recurrent state"):
        Engine.load(demo_model("spec"), tiny_settings(1, 512), speculation=speculation)


def test_a_trimmed_sliding_window_cache_refuses_speculation(
    demo_model: Callable[..., Path],
) -> None:
    with pytest.raises(SpeculationError, match="swa_full"):
        Engine.load(
            demo_model("gemma3"),
            tiny_settings(1, 512, swa_full=False),
            speculation=SpeculationConfig(),
        )


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"kind": "draft"}, "needs the draft's path"),
        ({"kind": "eagle"}, "unknown speculation kind"),
        ({"max_draft_tokens": 0}, "max_draft_tokens"),
        ({"ngram_min": 3, "ngram_max": 2}, "ngram_min"),
    ],
)
def test_impossible_configurations_are_refused(changes: dict[str, Any], problem: str) -> None:
    with pytest.raises(SpeculationError, match=problem):
        SpeculationConfig(**changes).checked()


# --- the command line ---------------------------------------------------------------------


@pytest.mark.parametrize("flag", [["--spec", "ngram"], ["--draft", "demo:spec-draft:tiny"]])
def test_run_speculates_with_the_flags(capsys: pytest.CaptureFixture[str], flag: list[str]) -> None:
    from homelab.cli import main

    common = ["run", "demo:spec:tiny", "--prompt", "red tree", "--max-tokens", "32"]
    common += ["--temperature", "0", "--ignore-eos", "--threads", "1", "--ctx", "256"]
    assert main([*common, *flag, "--draft-max", "4"]) == 0
    _, err = capsys.readouterr()
    assert "drafts kept" in err  # the stats line says what speculation did
    assert main([*common, *flag, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["stats"]["draft_tokens"] > 0


def test_run_refuses_a_draft_with_another_vocabulary(capsys: pytest.CaptureFixture[str]) -> None:
    from homelab.cli import main

    code = main(["run", "demo:spec:tiny", "--prompt", "hi", "--draft", "demo:bert", "--ctx", "256"])
    assert code != 0
    err = capsys.readouterr().err
    assert "Cannot plan" in err  # refused by the planner, from the headers, before loading
    assert "cannot draft for homelab-demo-spec" in err
