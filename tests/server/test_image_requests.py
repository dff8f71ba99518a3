"""Images in requests, in all three dialects, through the session's real server.

The hostile-image table runs against each dialect (chat's ``image_url`` part, Anthropic's
``image`` block, Responses' ``input_image``): every case is a 400 in that dialect's error
shape with a message naming what was wrong (the unmodified openai and anthropic SDKs raise
their own BadRequestError), and the server answers a normal request afterwards. Valid images
are decoded into the common form (``{"type": "image", "image": DecodedImage}``) that the chat
preparation takes. Fetching ``http(s)`` image URLs (only with
``allow_image_urls``) runs against a real local HTTP server (pytest-httpserver).
"""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import anthropic
import httpx
import openai
import pytest
from PIL import Image
from pytest_httpserver import HTTPServer
from server_helpers import ALICE_KEY, MODEL_ID, alice_headers, assert_still_serving

from homelab.images.decoded import DecodedImage
from homelab.server.anthropic import chat_inputs as anthropic_inputs
from homelab.server.anthropic_protocol import MessagesRequest
from homelab.server.chat import chat_inputs
from homelab.server.image_parts import ImagePolicy, image_context
from homelab.server.protocol import ChatCompletionRequest
from homelab.server.responses import chat_inputs as responses_inputs
from homelab.server.responses_protocol import ResponsesRequest
from homelab.server.runner import ServerHandle


def encoded(fmt: str = "PNG", size_px: tuple[int, int] = (8, 6), mode: str = "RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size_px, (200, 10, 10) if mode == "RGB" else 0).save(buffer, fmt)
    return buffer.getvalue()


def bomb_png(width_px: int = 100_000, height_px: int = 100_000) -> bytes:
    """A small valid PNG whose header (CRC fixed) declares a huge size."""
    data = bytearray(encoded())
    ihdr = struct.pack(">II", width_px, height_px) + bytes(data[24:29])
    data[16:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return bytes(data)


PNG = encoded()
SVG = b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"><script>x</script></svg>'


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


# --- one image (or URL) in each dialect's request --------------------------------------------


def chat_body(*urls: str) -> dict[str, Any]:
    parts = [{"type": "text", "text": "what is this?"}]
    parts += [{"type": "image_url", "image_url": {"url": url, "detail": "high"}} for url in urls]
    return {"model": MODEL_ID, "max_tokens": 2, "messages": [{"role": "user", "content": parts}]}


def anthropic_body(*urls: str) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [{"type": "image", "source": _source(url)} for url in urls]
    content = [*blocks, {"type": "text", "text": "what is this?"}]
    return {"model": MODEL_ID, "max_tokens": 2, "messages": [{"role": "user", "content": content}]}


def _source(url: str) -> dict[str, Any]:
    if not url.startswith("data:"):
        return {"type": "url", "url": url}
    head, _, data = url.partition(",")
    return {"type": "base64", "media_type": head[5:].split(";")[0], "data": data}


def responses_body(*urls: str) -> dict[str, Any]:
    parts = [{"type": "input_text", "text": "what is this?"}]
    parts += [{"type": "input_image", "image_url": url, "detail": "auto"} for url in urls]
    return {"model": MODEL_ID, "input": [{"role": "user", "content": parts}]}


@dataclass(frozen=True)
class Dialect:
    name: str
    path: str
    body: Callable[..., dict[str, Any]]

    def headers(self) -> dict[str, str]:
        if self.name == "anthropic":
            return {"x-api-key": ALICE_KEY}
        return alice_headers()


DIALECTS = [
    Dialect("chat", "/v1/chat/completions", chat_body),
    Dialect("anthropic", "/v1/messages", anthropic_body),
    Dialect("responses", "/v1/responses", responses_body),
]


@dataclass(frozen=True)
class Hostile:
    name: str
    urls: tuple[str, ...]
    says: str  # part of the message: what was wrong


HOSTILE = [
    Hostile("truncated png", (data_url(PNG[: len(PNG) // 2]),), "truncated"),
    Hostile(
        "corrupt jpeg", (data_url(encoded("JPEG")[:20] + b"\x00" * 400, "image/jpeg"),), "corrupt"
    ),
    Hostile("decompression bomb", (data_url(bomb_png()),), "decompression bomb"),
    Hostile("bomb below pillow's guard", (data_url(bomb_png(9000, 9000)),), "9000x9000"),
    Hostile("wrong mime", (data_url(encoded("JPEG"), "image/png"),), "bytes are JPEG"),
    Hostile("svg", (data_url(SVG, "image/svg+xml"),), "SVG"),
    Hostile("not an image", (data_url(b"hello world, no image here"),), "not an image"),
    Hostile("not base64", ("data:image/png;base64,@@@@",), "base64"),
    Hostile("101 images", (data_url(PNG),) * 101, "101 images"),
    Hostile("over the byte cap", (data_url(b"\x89PNG" + b"\x00" * (21 << 20)),), "bytes"),
    Hostile("http url without the flag", ("https://example.com/cat.png",), "does not fetch"),
    Hostile("local path", ("/etc/hostname",), "never read"),
    Hostile("file url", ("file:///etc/hostname",), "never read"),
]
HOSTILE_IDS = [case.name for case in HOSTILE]


def assert_dialect_400(dialect: Dialect, response: httpx.Response, says: str) -> None:
    assert response.status_code == 400, response.text
    body = response.json()
    if dialect.name == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    else:
        assert body["error"]["type"] == "invalid_request_error"
    message = body["error"]["message"]
    assert says.lower() in message.lower(), message
    assert "Traceback" not in message


@pytest.mark.parametrize("dialect", DIALECTS, ids=[d.name for d in DIALECTS])
def test_hostile_images_are_a_400_and_the_server_stays_up(
    dialect: Dialect, http: httpx.Client
) -> None:
    for case in HOSTILE:
        if dialect.name == "anthropic" and case.name in ("local path", "file url"):
            continue  # a url source takes http(s) only: below
        response = http.post(dialect.path, json=dialect.body(*case.urls), headers=dialect.headers())
        assert_dialect_400(dialect, response, case.says)
    assert_still_serving(http)


def test_refusals_only_in_their_dialect(http: httpx.Client) -> None:
    """What one dialect cannot express: a Responses ``file_id``, an Anthropic ``file``
    source, a data URL given as an Anthropic url source, images in an assistant turn."""
    responses = DIALECTS[2]
    body = responses_body()
    body["input"][0]["content"].append({"type": "input_image", "file_id": "file-123"})
    response = http.post(responses.path, json=body, headers=responses.headers())
    assert_dialect_400(responses, response, "file_id")
    anthropic = DIALECTS[1]
    for source, says in (
        ({"type": "file", "file_id": "f"}, "file sources"),
        ({"type": "url", "url": data_url(PNG)}, "base64 source"),
        ({"type": "url", "url": "file:///etc/hostname"}, "never read"),
    ):
        content = [{"type": "image", "source": source}, {"type": "text", "text": "hi"}]
        body = {**anthropic_body(), "messages": [{"role": "user", "content": content}]}
        response = http.post(anthropic.path, json=body, headers=anthropic.headers())
        assert_dialect_400(anthropic, response, says)
    chat = DIALECTS[0]
    body = chat_body()
    image = {"type": "image_url", "image_url": {"url": data_url(PNG)}}
    body["messages"] += [{"role": "assistant", "content": [image]}]
    response = http.post(chat.path, json=body, headers=chat.headers())
    assert_dialect_400(chat, response, "user messages")
    assert_still_serving(http)


# --- valid images: the common form -----------------------------------------------------------


def _images_of(messages: list[dict[str, Any]]) -> list[DecodedImage]:
    return [
        part["image"]
        for message in messages
        if isinstance(message["content"], list)
        for part in message["content"]
        if part["type"] == "image"
    ]


def test_each_dialect_gives_the_common_form() -> None:
    """The same picture as PNG and as BMP: the same pixels, the same digest."""
    urls = (data_url(PNG), data_url(encoded("BMP"), "image/bmp"))
    raw = json.dumps(chat_body(*urls))
    chat = chat_inputs(
        ChatCompletionRequest.model_validate_json(raw, context=image_context(ImagePolicy()))
    )
    anthropic = anthropic_inputs(
        MessagesRequest.model_validate(anthropic_body(*urls), context=image_context(ImagePolicy()))
    )
    responses = ResponsesRequest.model_validate(
        responses_body(*urls), context=image_context(ImagePolicy())
    )
    for inputs in (chat, anthropic, responses_inputs(responses)):
        images = _images_of(inputs.messages)
        assert [(i.width_px, i.height_px) for i in images] == [(8, 6), (8, 6)]
        assert images[0].digest == images[1].digest  # same pixels, other file format
        assert images[0].rgb[:3] == bytes((200, 10, 10))
    assert chat.messages[0]["content"][0] == {"type": "text", "text": "what is this?"}
    assert anthropic.messages[0]["content"][-1] == {"type": "text", "text": "what is this?"}


def test_a_valid_image_on_a_text_only_model_is_a_400_naming_it(http: httpx.Client) -> None:
    """Parsed and decoded by each dialect, then refused by the chat path: this session's
    model has no projector."""
    for dialect in DIALECTS:
        body = dialect.body(data_url(PNG))
        response = http.post(dialect.path, json=body, headers=dialect.headers())
        assert_dialect_400(dialect, response, "does not take images")
    assert_still_serving(http)


# --- http(s) URLs, only where the server allows them -----------------------------------------


def _chat_with(url: str, policy: ImagePolicy) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate_json(
        json.dumps(chat_body(url)), context=image_context(policy)
    )


def test_allowed_urls_are_fetched_within_limits(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/cat.png").respond_with_data(PNG, content_type="image/png")
    httpserver.expect_request("/big.png").respond_with_data(PNG + b"\x00" * 4096)
    httpserver.expect_request("/moved").respond_with_data("", 302, {"Location": "/cat.png"})
    httpserver.expect_request("/lies.png").respond_with_data(PNG, content_type="image/jpeg")
    allowed = ImagePolicy(allow_urls=True, allow_private_urls=True)  # the server is local
    request = _chat_with(httpserver.url_for("/cat.png"), allowed)
    image = request.messages[0].template_content()[1]["image"]
    assert (image.width_px, image.height_px) == (8, 6)
    small = replace(allowed, max_image_bytes=len(PNG) + 100)
    for url, policy, says in (
        (httpserver.url_for("/big.png"), small, "more than the"),
        (httpserver.url_for("/moved"), allowed, "HTTP 302"),
        (httpserver.url_for("/lies.png"), allowed, "declared as 'image/jpeg'"),
        (httpserver.url_for("/cat.png"), ImagePolicy(), "does not fetch"),
        (httpserver.url_for("/cat.png"), ImagePolicy(allow_urls=True), "local or private"),
        ("http://169.254.169.254/latest", ImagePolicy(allow_urls=True), "local or private"),
    ):
        with pytest.raises(ValueError, match=says):
            _chat_with(url, policy)


def test_the_model_card_says_whether_images_are_read(demo_model: Callable[..., Any]) -> None:
    from fake_engine import FakeEngine

    from homelab.gguf.reader import read_model
    from homelab.server.app import model_details

    engine = FakeEngine(read_model(demo_model("llama")), 512)
    assert model_details(engine)["supports"]["vision"] is False
    engine.image_marker = "<__media__>"  # what a loaded projector's marker looks like
    details = model_details(engine)
    assert details["supports"]["vision"] is True and "vision" in details["capabilities"]
    assert details["architecture"]["input_modalities"] == ["text", "image"]


async def test_a_body_over_the_cap_is_refused_before_parsing(
    demo_model: Callable[..., Any],
) -> None:
    """An upload larger than the body cap: 413 in each dialect's shape (the cap is checked
    before anything is parsed or decoded)."""
    from fake_engine import FakeEngine
    from server_helpers import make_keys

    from homelab.gguf.reader import read_model
    from homelab.server.app import create_app
    from homelab.server.config import ServerConfig

    engine = FakeEngine(read_model(demo_model("llama")), 512)
    config = ServerConfig(model_id=MODEL_ID, keys=make_keys(), max_body_bytes=64 * 1024)
    app = create_app(lambda: engine, config)
    big = data_url(encoded("BMP", (160, 160)))  # 77 KB of pixels: over the 64 KiB cap
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        for dialect in DIALECTS:
            response = await client.post(
                dialect.path, json=dialect.body(big), headers=dialect.headers()
            )
            assert response.status_code == 413, response.text
            body = response.json()
            anthropic = dialect.name == "anthropic"
            assert body["error"]["type"] == (
                "request_too_large" if anthropic else "invalid_request_error"
            )
            assert ("type" in body) == anthropic  # Anthropic's envelope, else OpenAI's
            assert "larger than this server accepts" in body["error"]["message"]


def test_decoding_runs_off_the_event_loop(
    http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decode made to take a second (a huge photo) must not stall other requests: the
    server answers /health meanwhile."""
    import threading
    import time

    from homelab.server import image_parts

    real_decode = image_parts.decode_image

    def slow_decode(*args: Any, **kwargs: Any) -> DecodedImage:
        time.sleep(1.0)  # blocking, as Pillow is
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(image_parts, "decode_image", slow_decode)
    chat = DIALECTS[0]
    done: list[float] = []

    def upload() -> None:
        started = time.perf_counter()
        http.post(chat.path, json=chat.body(data_url(PNG)), headers=chat.headers())
        done.append(time.perf_counter() - started)

    uploader = threading.Thread(target=upload)
    uploader.start()
    time.sleep(0.2)  # the upload is decoding now
    started = time.perf_counter()
    assert http.get("/health").status_code == 200
    health_s = time.perf_counter() - started
    uploader.join()
    assert done and done[0] >= 1.0
    assert health_s < 0.5, f"/health took {health_s:.2f} s while an image decoded"


def test_the_sdks_see_a_bad_image_as_a_bad_request(
    client: openai.OpenAI, server: ServerHandle
) -> None:
    """The unmodified SDKs raise their own 400 error type, with our message, for a bomb."""
    bomb = data_url(bomb_png())
    with pytest.raises(openai.BadRequestError, match="decompression bomb"):
        client.chat.completions.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": chat_body(bomb)["messages"][0]["content"]}],
            max_tokens=2,
        )
    with pytest.raises(openai.BadRequestError, match="decompression bomb"):
        client.responses.create(model=MODEL_ID, input=responses_body(bomb)["input"])
    with (
        anthropic.Anthropic(base_url=server.url, api_key=ALICE_KEY, max_retries=0) as claude,
        pytest.raises(anthropic.BadRequestError, match="decompression bomb"),
    ):
        claude.messages.create(
            model=MODEL_ID, max_tokens=2, messages=anthropic_body(bomb)["messages"]
        )
