"""Images end to end: the unmodified ``openai`` and ``anthropic`` SDKs against the real
server, on each generated vision model (random weights; real llama.cpp and mtmd).

``prompt_tokens`` counts the image's tokens as mtmd counts them (checked against mtmd's own
chunks of the same rendered prompt); the next turn with the same image reports the whole
earlier prompt as cached; another tenant's identical image is read afresh.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from typing import Any

import anthropic
import numpy as np
import openai
import pytest
from PIL import Image
from server_helpers import ALICE_KEY, BOB_KEY, FRESH_KEYS, make_keys

from homelab.engine.engine import Engine
from homelab.gguf import demo_vision
from homelab.images.decoded import DecodedImage
from homelab.server.config import ServerConfig
from homelab.server.runner import ServerHandle, start_server
from homelab.settings import Settings

MODEL = "vision"
N_CTX_PER_SLOT = 1024


def png(width_px: int, height_px: int, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height_px, width_px, 3), np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, "PNG")
    return buffer.getvalue()


IMAGE = png(200, 140)
DECODED = DecodedImage(np.asarray(Image.open(io.BytesIO(IMAGE)).convert("RGB")).tobytes(), 200, 140)


@pytest.fixture(scope="module", params=demo_vision.VISION_KINDS)
def vision_server(request: pytest.FixtureRequest) -> Iterator[tuple[Engine, ServerHandle]]:
    kind = request.param
    settings = Settings(
        n_ctx=N_CTX_PER_SLOT * 2,
        n_ctx_per_slot=N_CTX_PER_SLOT,
        n_parallel=2,
        n_threads=1,
        mmproj_path=str(demo_vision.mmproj_path(kind)),
        mmproj_offload=False,
    )
    engine = Engine.load(demo_vision.text_model_path(kind), settings, record_calibration=False)
    config = ServerConfig(model_id=MODEL, keys=make_keys(), default_max_tokens=4)
    handle = start_server(engine, config=config)
    yield engine, handle
    handle.stop()
    engine.close()


def openai_client(handle: ServerHandle, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=handle.base_url, api_key=key, max_retries=0, timeout=60)


def expected_prompt_tokens(engine: Engine, messages: list[dict[str, Any]]) -> int:
    """What mtmd makes of the same conversation, rendered by the model's template."""
    marker = engine.image_marker
    assert marker is not None
    flat = [{**m, "content": m["content"].replace("[image]", marker)} for m in messages]
    prompt = engine.tokenize_images(
        engine.render_chat(flat),
        [DECODED] * len([m for m in messages if "[image]" in m["content"]]),
    )
    return prompt.n_cells


def openai_turn(text: str) -> list[dict[str, Any]]:
    url = "data:image/png;base64," + base64.b64encode(IMAGE).decode()
    return [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]


def test_openai_sdk_image_chat_counts_and_caches_the_image(
    vision_server: tuple[Engine, ServerHandle],
) -> None:
    engine, handle = vision_server
    first: list[Any] = [{"role": "user", "content": openai_turn("What is this?")}]
    with openai_client(handle, ALICE_KEY) as alice:
        one = alice.chat.completions.create(model=MODEL, messages=first, max_tokens=4)
        assert one.usage is not None
        plain = [{"role": "user", "content": "What is this?[image]"}]
        assert one.usage.prompt_tokens == expected_prompt_tokens(engine, plain)
        reply = one.choices[0].message.content or ""
        second = [*first, {"role": "assistant", "content": reply}]
        second.append({"role": "user", "content": "And now?"})
        two = alice.chat.completions.create(model=MODEL, messages=second, max_tokens=4)
    assert two.usage is not None and two.usage.prompt_tokens_details is not None
    # the whole first prompt, its image included, is the start of the second one
    assert two.usage.prompt_tokens_details.cached_tokens >= one.usage.prompt_tokens
    with openai_client(handle, BOB_KEY) as bob:
        other = bob.chat.completions.create(model=MODEL, messages=first, max_tokens=4)
    assert other.usage is not None and other.usage.prompt_tokens_details is not None
    assert other.usage.prompt_tokens_details.cached_tokens == 0


def test_anthropic_sdk_image_message(vision_server: tuple[Engine, ServerHandle]) -> None:
    engine, handle = vision_server
    image_block = {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(IMAGE).decode(),
        },
    }
    content: Any = [image_block, {"type": "text", "text": "Describe it."}]
    key = FRESH_KEYS["carol"]
    with anthropic.Anthropic(base_url=handle.url, api_key=key, max_retries=0) as claude:
        one = claude.messages.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": content}]
        )
        again = claude.messages.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": content}]
        )
    expected = expected_prompt_tokens(engine, [{"role": "user", "content": "[image]Describe it."}])
    assert one.usage.input_tokens == expected
    assert (one.usage.cache_read_input_tokens or 0) == 0
    assert again.usage.cache_read_input_tokens == expected - 1
    assert again.usage.input_tokens == 1


def test_a_text_only_model_refuses_an_image_naming_it(server: ServerHandle) -> None:
    with openai_client(server, ALICE_KEY) as alice, pytest.raises(openai.BadRequestError) as err:
        alice.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": openai_turn("hi")}], max_tokens=2
        )
    assert "does not take images" in str(err.value)
    assert "homelab-demo" in str(err.value)


def test_responses_api_input_image(vision_server: tuple[Engine, ServerHandle]) -> None:
    engine, handle = vision_server
    url = "data:image/png;base64," + base64.b64encode(IMAGE).decode()
    content: Any = [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": url},
    ]
    with openai_client(handle, FRESH_KEYS["dave"]) as dave:
        response = dave.responses.create(
            model=MODEL, input=[{"role": "user", "content": content}], max_output_tokens=4
        )
    assert response.usage is not None
    plain = [{"role": "user", "content": "What is this?[image]"}]
    assert response.usage.input_tokens == expected_prompt_tokens(engine, plain)
