"""A body's JSON values and objects are counted from its bytes (numpy, outside strings) the way
a parser would count them, whatever its strings hold; past a bound it is a 400 before any parse;
a token-id prompt of a long context and an agent session's objects are within the bounds."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from homelab.server.body_shape import (
    MAX_JSON_OBJECTS,
    MAX_JSON_VALUES,
    SCAN_FROM_BYTES,
    check_body_shape,
    json_shape,
)
from homelab.server.errors import ApiError

TRICKY_TEXT = st.text(alphabet=st.sampled_from('ab,{[]}"\\\\:é\n'), max_size=12)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TRICKY_TEXT, inner, max_size=5),
    max_leaves=40,
)


def counted(value: Any) -> tuple[int, int]:
    """Commas and opening brackets of ``value``'s JSON text, and its objects, from its
    structure."""
    if not isinstance(value, (list, dict)):
        return 0, 0
    inner = [counted(v) for v in (value if isinstance(value, list) else value.values())]
    values = 1 + max(len(value) - 1, 0) + sum(v for v, _ in inner)
    return values, int(isinstance(value, dict)) + sum(o for _, o in inner)


@settings(max_examples=200, deadline=None, database=None)
@given(value=JSON_VALUES, ascii_only=st.booleans(), compact=st.booleans())
def test_the_count_is_the_structures_whatever_the_strings_hold(
    value: Any, ascii_only: bool, compact: bool
) -> None:
    separators = (",", ":") if compact else (", ", ": ")
    raw = json.dumps(value, ensure_ascii=ascii_only, separators=separators).encode()
    assert json_shape(raw) == counted(value)


def test_a_body_past_the_bound_is_refused_and_a_long_string_is_not() -> None:
    many = json.dumps({"logit_bias": {str(i): 1 for i in range(MAX_JSON_VALUES + 1)}}).encode()
    with pytest.raises(ApiError) as refused:
        check_body_shape(many)
    assert refused.value.status == 400 and refused.value.code == "body_too_complex"
    text = json.dumps({"content": "a, [{" * SCAN_FROM_BYTES}).encode()  # commas in a string
    check_body_shape(text)


def test_too_many_objects_are_refused_though_the_values_are_few_enough() -> None:
    turns = [{"role": "user", "content": "hi"}] * (MAX_JSON_OBJECTS + 1)
    raw = json.dumps({"messages": turns}).encode()
    assert json_shape(raw)[0] < MAX_JSON_VALUES
    with pytest.raises(ApiError) as refused:
        check_body_shape(raw)
    assert refused.value.code == "body_too_complex" and "objects" in refused.value.message


def test_long_token_id_prompts_and_agent_sessions_are_within_the_bounds() -> None:
    check_body_shape(json.dumps({"prompt": list(range(100_000, 100_000 + 256 * 1024))}).encode())
    use = {"type": "tool_use", "id": "t", "name": "Read", "input": {"file_path": "/a"}}
    result = {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "x"}]}
    rounds = [  # ~7 objects a round: 1,300 rounds of ~100 tokens fill a 128K context
        turn
        for _ in range(1_300)
        for turn in (
            {"role": "assistant", "content": [{"type": "text", "text": "Reading."}, use]},
            {"role": "user", "content": [result]},
        )
    ]
    raw = json.dumps({"messages": rounds}).encode()
    assert len(raw) > SCAN_FROM_BYTES and json_shape(raw)[1] > 8_000
    check_body_shape(raw)
