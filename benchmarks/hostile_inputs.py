"""The hostile requests of issue 39, built once: the soak (``benchmarks/hostile_soak.py``)
sends them in a loop, and the tests (``tests/server/test_hostile_requests.py``,
``tests/images/test_hostile_corpus.py``) check each one alone.

Each builder returns a body (raw bytes where the spelling matters) for a model name; none
does any I/O.
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

PADDING_BYTES = 6 * 1024 * 1024  # well under the 20 MiB image cap
HUGE_SCHEMA_PROPERTIES = 1_000_000  # ~25 MB of body, under the 32 MiB cap
MANY_TURNS = 16_000  # messages of one body: under server.body_shape.MAX_JSON_OBJECTS
BAD_TOOL_TYPES = ("web_search_é€", "web\r\nX-Evil: 1", "ok\x00")
ABSURD_KEEP_ALIVES: tuple[Any, ...] = (int("9" * 400), "9" * 400, 1e308, "99999999h")


def rle8_bmp_with_noops(padding_bytes: int = PADDING_BYTES) -> bytes:
    """A 2x2 RLE8 BMP whose pixel data is millions of 'delta (0, 0)' commands, then the end:
    Pillow walks each command in Python."""
    pixels = b"\x00\x02\x00\x00" * (padding_bytes // 4) + b"\x02\x01\x00\x00\x00\x01"
    palette = b"\x00\x00\x00\x00" * 256
    offset = 14 + 40 + len(palette)
    header = struct.pack("<2sIHHI", b"BM", offset + len(pixels), 0, 0, offset)
    info = struct.pack("<IiiHHIIiiII", 40, 2, 2, 1, 8, 1, len(pixels), 0, 0, 256, 0)
    return header + info + palette + pixels


def escaped_image_body(model: str, image: bytes, max_tokens: int = 1) -> bytes:
    """A chat request whose image part is spelled so the raw body never holds the bytes
    'image' (``"\\u0069mage_url"``, a MIME-less data URL): a check of the raw bytes misses it."""
    url = "data:;base64," + base64.b64encode(image).decode()
    part = {"type": "image_url", "image_url": {"url": url}}
    body = {
        "model": model,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": [part]}],
    }
    raw = json.dumps(body).replace("image_url", "\\u0069mage_url").encode()
    assert b"image" not in raw
    return raw


def image_url_body(model: str, url: str) -> dict[str, Any]:
    part = {"type": "image_url", "image_url": {"url": url}}
    return {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": [part]}]}


def hosted_tool_body(
    model: str, tool_type: str, stream: bool, max_output_tokens: int = 300
) -> dict[str, Any]:
    """A Responses request with a hosted tool whose type would break a header."""
    return {
        "model": model,
        "input": "tell me a long story",
        "max_output_tokens": max_output_tokens,
        "stream": stream,
        "tools": [{"type": tool_type}, {"type": "function", "name": "f", "parameters": {}}],
    }


def many_properties_body(model: str, n_properties: int = HUGE_SCHEMA_PROPERTIES) -> bytes:
    """A forced ``tool_choice`` over one tool of ``n_properties`` integer properties."""
    properties = {f"p{i}": {"type": "integer"} for i in range(n_properties)}
    tool = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": properties}},
    }
    body = {
        "model": model,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [tool],
        "tool_choice": "required",
    }
    return json.dumps(body, separators=(",", ":")).encode()


def many_turns_body(model: str, n_turns: int = MANY_TURNS) -> bytes:
    """Anthropic Messages of ``n_turns`` one-word turns: just under the body's object bound,
    the costliest body per byte that is parsed (~14 µs a turn of Python validators)."""
    turns = [{"role": ("user", "assistant")[i % 2], "content": f"w{i}"} for i in range(n_turns | 1)]
    body = {"model": model, "max_tokens": 1, "messages": turns}
    return json.dumps(body, separators=(",", ":")).encode()


def keep_alive_body(model: str, keep_alive: Any) -> bytes:
    """Ollama's chat with an absurd ``keep_alive`` (a 400-digit integer is legal JSON)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
        "options": {"num_predict": 2},
        "keep_alive": keep_alive,
    }
    return json.dumps(body).encode()


def malformed_bodies(model: str) -> list[tuple[str, bytes]]:
    """(path, raw body) pairs no route may answer with a 5xx."""
    chat = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    return [
        ("/v1/chat/completions", chat[: len(chat) // 2].encode()),  # cut short
        ("/v1/chat/completions", b"\xff\xfe" + chat.encode()),  # not UTF-8
        ("/v1/chat/completions", b"[" * 100_000 + b"]" * 100_000),  # deep nesting
        ("/v1/chat/completions", chat.replace('"hi"', "NaN").encode()),
        ("/v1/chat/completions", chat.replace('"hi"', "1" * 5000).encode()),
        ("/v1/messages", b'{"model": "%s", "max_tokens": 1e999}' % model.encode()),
        ("/v1/responses", b'{"model": "%s", "input": {"\\ud800": 1}}' % model.encode()),
        ("/api/chat", b'{"model": "%s", "messages": "hi"}' % model.encode()),
        ("/api/generate", b'{"model": "%s", "prompt": "x", "options": []}' % model.encode()),
        ("/v1/embeddings", b'{"model": "%s", "input": [[-1, 99999999999]]}' % model.encode()),
    ]
