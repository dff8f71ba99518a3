"""Per-request sampling through llama.cpp's sampler chains."""

from __future__ import annotations

import json
import math

import pytest

from homelab.engine.api import GenerationRequest, SamplingParams
from homelab.engine.engine import Engine
from homelab.engine.grammar import (
    JSON_OBJECT_GRAMMAR,
    MAX_GRAMMAR_NESTING,
    MAX_SCHEMA_DEPTH,
    check_grammar,
    grammar_nesting,
    schema_to_grammar,
)
from homelab.errors import EngineError
from homelab.gguf import vocab as demo_vocab


def complete(
    engine: Engine, sampling: SamplingParams, prompt: str = "hello world", tenant: str = "a"
):  # type: ignore[no-untyped-def]
    return engine.submit(GenerationRequest(tenant, prompt, sampling)).collect()


def test_same_seed_same_text_other_seed_other_text(engine: Engine) -> None:
    hot = dict(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, max_tokens=32)
    first = complete(engine, SamplingParams(seed=7, **hot))  # type: ignore[arg-type]
    again = complete(engine, SamplingParams(seed=7, **hot), tenant="b")  # type: ignore[arg-type]
    other = complete(engine, SamplingParams(seed=8, **hot))  # type: ignore[arg-type]
    assert first.token_ids == again.token_ids
    assert first.token_ids != other.token_ids


def test_top_k_1_is_greedy(engine: Engine) -> None:
    greedy = complete(engine, SamplingParams(temperature=0.0, max_tokens=24))
    top1 = complete(engine, SamplingParams(temperature=2.0, top_k=1, seed=3, max_tokens=24))
    assert greedy.token_ids == top1.token_ids


def test_logprobs_are_the_models_log_softmax(engine: Engine) -> None:
    done = complete(engine, SamplingParams(temperature=0.0, max_tokens=8, logprobs=5))
    assert len(done.logprobs) == 8
    for token_id, logprob in zip(done.token_ids, done.logprobs, strict=True):
        assert logprob is not None
        assert len(logprob.top) == 5
        values = [value for _, value in logprob.top]
        assert values == sorted(values, reverse=True)
        assert logprob.logprob == pytest.approx(values[0])  # greedy picks the best
        assert logprob.token == engine.detokenize([token_id]) or "\ufffd" in logprob.token
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-5


def test_logit_bias_forces_and_bans_tokens(engine: Engine) -> None:
    plain = complete(engine, SamplingParams(temperature=0.0, max_tokens=8))
    favourite = engine.tokenize(" water", add_bos=False)[0]
    forced = complete(
        engine, SamplingParams(temperature=0.0, max_tokens=4, logit_bias={favourite: 100.0})
    )
    assert forced.token_ids == (favourite,) * 4
    banned = complete(
        engine,
        SamplingParams(temperature=0.0, max_tokens=8, logit_bias={plain.token_ids[0]: -math.inf}),
    )
    assert banned.token_ids[0] != plain.token_ids[0]


def test_repeat_penalty_changes_a_repetitive_answer(engine: Engine) -> None:
    plain = complete(engine, SamplingParams(temperature=0.0, max_tokens=32))
    assert len(set(plain.token_ids)) < len(plain.token_ids)  # the random model repeats itself
    penalized = complete(
        engine,
        SamplingParams(temperature=0.0, max_tokens=32, repeat_penalty=1.5, presence_penalty=1.0),
    )
    assert len(set(penalized.token_ids)) > len(set(plain.token_ids))


def test_end_of_generation_stops_and_is_not_text(engine: Engine) -> None:
    eos = demo_vocab.EOS_ID
    done = complete(engine, SamplingParams(temperature=0.0, max_tokens=8, logit_bias={eos: 100.0}))
    assert done.finish.reason == "stop"
    assert done.text == ""
    assert done.finish.stats.completion_tokens == 1


def test_ignore_eos_keeps_going(engine: Engine) -> None:
    eot = demo_vocab.IM_END_ID
    sampling = SamplingParams(
        temperature=0.0, max_tokens=6, logit_bias={eot: 100.0}, ignore_eos=True
    )
    done = complete(engine, sampling)
    assert done.finish.reason == "length"
    assert eot not in done.token_ids
    assert len(done.token_ids) == 6


def test_max_tokens_is_exact(engine: Engine) -> None:
    done = complete(engine, SamplingParams(temperature=0.0, max_tokens=5))
    assert done.finish.reason == "length"
    assert done.finish.stats.completion_tokens == len(done.token_ids) == 5


def test_json_schema_output_parses_and_matches(engine: Engine) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "name": {"enum": ["alpha", "beta"]}},
        "required": ["ok", "name"],
    }
    sampling = SamplingParams(
        temperature=0.7, seed=1, max_tokens=64, grammar=schema_to_grammar(schema)
    )
    done = complete(engine, sampling)
    assert done.finish.reason == "stop"  # the grammar completed, then end-of-generation
    value = json.loads(done.text)
    assert isinstance(value["ok"], bool) and value["name"] in ("alpha", "beta")


def test_schema_and_grammar_bounds() -> None:
    deep: dict[str, object] = {"type": "string"}
    for _ in range(MAX_SCHEMA_DEPTH):
        deep = {"type": "array", "items": deep}
    with pytest.raises(EngineError, match="nests deeper"):
        schema_to_grammar(deep)
    with pytest.raises(EngineError, match="characters"):
        schema_to_grammar({"enum": ["x" * 40_000]})
    nested = "root ::= " + "(" * (MAX_GRAMMAR_NESTING + 1) + '"a"' + ")" * (MAX_GRAMMAR_NESTING + 1)
    with pytest.raises(EngineError, match="nests"):
        check_grammar(nested)
    assert grammar_nesting('root ::= ("(" [(] ( "a" ))  # ((((') == 2
    with pytest.raises(EngineError, match="not valid JSON"):
        schema_to_grammar("{nope")


def test_json_object_grammar_is_accepted_by_llama_cpp(engine: Engine) -> None:
    sampling = SamplingParams(temperature=0.0, max_tokens=8, grammar=JSON_OBJECT_GRAMMAR)
    done = complete(engine, sampling)
    assert done.finish.reason in ("length", "stop")
    assert done.text.lstrip().startswith("{")
