"""A body's JSON values are counted from its bytes (numpy, outside strings) the way a parser
would count them, whatever its strings hold; past the bound it is a 400 before any parse."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from homelab.server.body_shape import (
    MAX_JSON_VALUES,
    SCAN_FROM_BYTES,
    check_body_shape,
    json_values,
)
from homelab.server.errors import ApiError

TRICKY_TEXT = st.text(alphabet=st.sampled_from('ab,{[]}"\\\\:é\n'), max_size=12)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TRICKY_TEXT, inner, max_size=5),
    max_leaves=40,
)


def counted(value: Any) -> int:
    """Commas and opening brackets of ``value``'s JSON text, from its structure."""
    if isinstance(value, list):
        return 1 + max(len(value) - 1, 0) + sum(counted(v) for v in value)
    if isinstance(value, dict):
        return 1 + max(len(value) - 1, 0) + sum(counted(v) for v in value.values())
    return 0


@settings(max_examples=200, deadline=None, database=None)
@given(value=JSON_VALUES, ascii_only=st.booleans(), compact=st.booleans())
def test_the_count_is_the_structures_whatever_the_strings_hold(
    value: Any, ascii_only: bool, compact: bool
) -> None:
    separators = (",", ":") if compact else (", ", ": ")
    raw = json.dumps(value, ensure_ascii=ascii_only, separators=separators).encode()
    assert json_values(raw) == counted(value)


def test_a_body_past_the_bound_is_refused_and_a_long_string_is_not() -> None:
    many = json.dumps({"logit_bias": {str(i): 1 for i in range(MAX_JSON_VALUES + 1)}}).encode()
    with pytest.raises(ApiError) as refused:
        check_body_shape(many)
    assert refused.value.status == 400 and refused.value.code == "body_too_complex"
    text = json.dumps({"content": "a, [{" * SCAN_FROM_BYTES}).encode()  # commas in a string
    check_body_shape(text)
