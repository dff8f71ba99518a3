"""How many JSON values and objects a request body holds, counted before it is parsed.

Parsing and validating a body holds the GIL for as long as it takes (pydantic-core builds the
Python objects without letting go, and the wire types' validators are Python), off the event
loop or not: a 25 MB body of a million small objects (a tool schema of a million properties, a
million-entry ``logit_bias``) froze every route, ``/health`` included, for one to two seconds
per request (issue 39). The time grows with the values, not the bytes (a 20 MB image is one
string and costs milliseconds), and an object costs far more than a number: measured on this
machine, ~0.3 µs a token id of a prompt, ~4 µs a chat message, ~14 µs an Anthropic message.

So a body over :data:`SCAN_FROM_BYTES` is scanned first with numpy (whose loops release the
GIL): its commas and opening brackets outside strings, one per value but the first of each
container, give the number of values, its ``{`` outside strings the number of objects. More
than :data:`MAX_JSON_VALUES` values (a token-id prompt of a 512K context fits) or
:data:`MAX_JSON_OBJECTS` objects (a 128K-token agent session holds ~10,000: its turns, blocks
and tool schemas) is a 400. The bounds keep one validation's hold of the GIL to ~150 ms of
numbers or ~230 ms of the costliest messages. Smaller bodies cannot hold enough to matter and
are not scanned.
"""

from __future__ import annotations

import numpy as np

from homelab.server.errors import ApiError

MAX_JSON_VALUES = 512 * 1024
MAX_JSON_OBJECTS = 16 * 1024
SCAN_FROM_BYTES = 256 * 1024
_QUOTE, _BACKSLASH, _COMMA, _BRACE, _BRACKET = (ord(c) for c in '"\\,{[')


def check_body_shape(raw: bytes) -> None:
    """A 400 when ``raw`` holds more JSON values or objects than any real request does."""
    if len(raw) < SCAN_FROM_BYTES:
        return
    values, objects = json_shape(raw)
    if values > MAX_JSON_VALUES or objects > MAX_JSON_OBJECTS:
        raise ApiError(
            400,
            f"The request body holds about {values} JSON values in {objects} objects; this "
            f"server parses at most {MAX_JSON_VALUES} values and {MAX_JSON_OBJECTS} objects in "
            "one request. Send fewer messages, tools, inputs or entries.",
            code="body_too_complex",
        )


def json_shape(raw: bytes) -> tuple[int, int]:
    """(values, objects): commas and ``{``/``[`` outside strings, and ``{`` outside strings
    (the count of a text that is not JSON means nothing, and its parse fails quickly)."""
    data = np.frombuffer(raw, dtype=np.uint8)
    quotes = np.flatnonzero(data == _QUOTE)
    real = quotes[~_escaped(data, quotes)]  # the quotes that open or close a string
    marks = np.flatnonzero((data == _COMMA) | (data == _BRACE) | (data == _BRACKET))
    outside = np.searchsorted(real, marks) % 2 == 0  # an even count of string quotes before
    objects = np.count_nonzero(data[marks[outside]] == _BRACE)
    return int(np.count_nonzero(outside)), int(objects)


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
