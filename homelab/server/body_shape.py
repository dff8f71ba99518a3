"""How many JSON values a request body holds, counted before it is parsed.

Parsing and validating a body holds the GIL for as long as it takes (pydantic-core builds the
Python objects without letting go), off the event loop or not: a 25 MB body of a million small
objects (a tool schema of a million properties, a million-entry ``logit_bias``) froze every
route, ``/health`` included, for one to two seconds per request (issue 39). The time grows
with the values, not the bytes: a 20 MB image is one string and costs milliseconds.

So a body over :data:`SCAN_FROM_BYTES` is scanned first with numpy (whose loops release the
GIL): its commas and opening brackets outside strings, one per value but the first of each
container, give the number of values, and more than :data:`MAX_JSON_VALUES` is a 400. Real
requests hold a few thousand (an agent's 200 turns and 20 tools: ~10,000); the bound keeps the
GIL held by one validation under about 60 ms on this machine. Smaller bodies cannot hold
enough values to matter and are not scanned.
"""

from __future__ import annotations

import numpy as np

from homelab.server.errors import ApiError

MAX_JSON_VALUES = 100_000
SCAN_FROM_BYTES = 256 * 1024
_QUOTE, _BACKSLASH, _COMMA, _BRACE, _BRACKET = (ord(c) for c in '"\\,{[')


def check_body_shape(raw: bytes) -> None:
    """A 400 when ``raw`` holds more JSON values than any real request does."""
    if len(raw) < SCAN_FROM_BYTES:
        return
    values = json_values(raw)
    if values > MAX_JSON_VALUES:
        raise ApiError(
            400,
            f"The request body holds about {values} JSON values; this server parses at most "
            f"{MAX_JSON_VALUES} in one request. Send fewer tools, messages or entries.",
            code="body_too_complex",
        )


def json_values(raw: bytes) -> int:
    """Commas and ``{``/``[`` outside strings: about one per value of a JSON document (the
    count of a text that is not JSON means nothing, and its parse fails quickly)."""
    data = np.frombuffer(raw, dtype=np.uint8)
    quotes = np.flatnonzero(data == _QUOTE)
    real = quotes[~_escaped(data, quotes)]  # the quotes that open or close a string
    marks = np.flatnonzero((data == _COMMA) | (data == _BRACE) | (data == _BRACKET))
    before = np.searchsorted(real, marks)  # the string quotes before each mark
    return int(np.count_nonzero(before % 2 == 0))


def _escaped(data: np.ndarray, quotes: np.ndarray) -> np.ndarray:
    """Which quotes follow an odd run of backslashes (``\\"`` is a quote inside a string)."""
    slashes = np.flatnonzero(data == _BACKSLASH)
    if not len(slashes):
        return np.zeros(len(quotes), dtype=bool)
    first = np.ones(len(slashes), dtype=bool)
    first[1:] = np.diff(slashes) != 1
    run_first = np.maximum.accumulate(np.where(first, np.arange(len(slashes)), 0))
    at = np.minimum(np.searchsorted(slashes, quotes - 1), len(slashes) - 1)
    after_slash = slashes[at] == quotes - 1  # the backslash run ending just before the quote
    run_length = np.where(after_slash, at - run_first[at] + 1, 0)
    escaped: np.ndarray = run_length % 2 == 1
    return escaped
