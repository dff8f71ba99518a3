"""Images through the real engine: generated vision models (random weights), real mtmd.

Two projectors with different token rules: Gemma 3 (every image the same number of tokens,
read with a bidirectional mask) and Qwen2-VL (tokens by image size; M-RoPE, so an image
advances the sequence by max(rows, columns) positions, fewer than its tokens).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from engine_helpers import tiny_settings

from homelab.engine.api import GenerationRequest, SamplingParams
from homelab.engine.engine import Engine
from homelab.errors import EngineError
from homelab.gguf import demo_vision
from homelab.images.decoded import DecodedImage

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


def picture(width_px: int, height_px: int, seed: int = 0) -> DecodedImage:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, width_px * height_px * 3, dtype=np.uint8)
    return DecodedImage(pixels.tobytes(), width_px, height_px)


@pytest.fixture(scope="module", params=demo_vision.VISION_KINDS)
def vision(request: pytest.FixtureRequest) -> Iterator[Engine]:
    kind = request.param
    settings = tiny_settings(
        2, 512, mmproj_path=str(demo_vision.mmproj_path(kind)), mmproj_offload=False
    )
    engine = Engine.load(demo_vision.text_model_path(kind), settings, record_calibration=False)
    yield engine
    engine.close()


def ask(engine: Engine, image: DecodedImage, tenant: str = "alice", question: str = "What"):
    text = f"<|im_start|>user\n{question} is {engine.image_marker} this?<|im_end|>\n"
    prompt = engine.tokenize_images(text + "<|im_start|>assistant\n", [image])
    request = GenerationRequest(tenant, prompt.tokens, GREEDY, images=prompt)
    return prompt, engine.submit(request).collect()


def test_prompt_tokens_count_the_image_as_mtmd_does(vision: Engine) -> None:
    image = picture(300, 200)
    prompt, done = ask(vision, image, tenant="counting")
    assert done.finish.reason == "length", done.finish.error
    (span,) = prompt.images
    fixed = demo_vision.fixed_image_tokens("gemma3")
    if vision.projector is not None and vision.projector.uses_mrope:
        assert (span.n_tokens, span.n_pos) == (11 * 7, 11)  # one token per 28x28 px
    else:
        assert span.n_tokens == span.n_pos == fixed
    assert done.finish.stats.prompt_tokens == len(prompt.tokens) - span.n_pos + span.n_tokens


def test_the_same_image_next_turn_is_cached_another_tenants_is_not(vision: Engine) -> None:
    image = picture(120, 90, seed=1)
    _, first = ask(vision, image, tenant="carol")
    _, again = ask(vision, image, tenant="carol")
    _, other = ask(vision, image, tenant="dave")
    n_prompt = first.finish.stats.prompt_tokens
    assert first.finish.stats.cached_tokens == 0
    assert again.finish.stats.cached_tokens == n_prompt - 1  # all but the last token
    assert again.finish.stats.evaluated_tokens == 1  # the image was not read again
    assert other.finish.stats.cached_tokens == 0
    assert again.token_ids == first.token_ids == other.token_ids


def test_the_image_reaches_the_model(vision: Engine) -> None:
    """Different pixels, different logits after the same text: the embeddings are used."""
    _, one = ask(vision, picture(64, 64, seed=2), tenant="erin")
    _, two = ask(vision, picture(64, 64, seed=3), tenant="erin")
    assert one.token_ids != two.token_ids


def test_a_text_request_beside_an_image_is_not_disturbed(vision: Engine) -> None:
    text = GenerationRequest("frank", "the quick brown fox", GREEDY)
    alone = vision.submit(text).collect()
    beside = vision.submit(text)
    _, image_done = ask(vision, picture(200, 140, seed=4), tenant="gina")
    assert beside.collect().token_ids == alone.token_ids
    assert image_done.finish.reason == "length"


def test_positions_after_an_mrope_image_advance_by_its_positions(vision: Engine) -> None:
    prompt, done = ask(vision, picture(300, 200, seed=5), tenant="hugo")
    states = {s.tenant: s for s in vision.slot_states()}
    generated = len(done.token_ids) - 1  # the last token is sampled, not decoded
    assert states["hugo"].kv_pos_max == len(prompt.tokens) + generated - 1


def test_prompts_it_cannot_read_are_refused(vision: Engine) -> None:
    image = picture(32, 32)
    marker = vision.image_marker
    with pytest.raises(EngineError, match="marks 2 image"):
        vision.tokenize_images(f"two {marker} {marker}", [image])


def test_a_text_only_model_takes_no_images(engine: Engine) -> None:
    assert engine.image_marker is None
    with pytest.raises(EngineError, match="takes no images"):
        engine.tokenize_images("look <__media__>", [picture(8, 8)])


def test_image_rows_share_the_prefill_budget_with_generating_sequences(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While another sequence generates, a (causal) image is decoded at most
    ``prefill_chunk_tokens`` rows a step, like text; alone, it goes in one decode."""
    from homelab.engine import image_prefill

    rows_per_decode: list[int] = []
    real = image_prefill.decode_embeddings

    def counting(context, rows, *args, **kwargs):  # type: ignore[no-untyped-def]
        rows_per_decode.append(len(rows))
        return real(context, rows, *args, **kwargs)

    monkeypatch.setattr(image_prefill, "decode_embeddings", counting)
    settings = tiny_settings(
        2, 512, mmproj_path=str(demo_vision.mmproj_path("qwen2vl")), mmproj_offload=False
    )
    path = demo_vision.text_model_path("qwen2vl")
    with Engine.load(path, settings, record_calibration=False, prefill_chunk_tokens=16) as engine:
        long_text = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
        talker = engine.submit(GenerationRequest("ivan", "count with me", long_text))
        next(iter(talker))  # generating
        _, done = ask(engine, picture(300, 200), tenant="judy")
        talker.cancel()
        assert done.finish.reason == "length"
        assert rows_per_decode and max(rows_per_decode) <= 16
        assert sum(rows_per_decode) == 77
        rows_per_decode.clear()
        ask(engine, picture(300, 200, seed=9), tenant="kim")
        assert rows_per_decode == [77]


def test_a_request_cancelled_inside_an_image_leaves_whole_entries_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cancelled after the first rows of its image: the slot's cache ends where its token
    list ends, and the same image next turn is read whole (not half from the cache)."""
    from homelab.engine import image_prefill

    monkeypatch.setattr(image_prefill.ImagePrefill, "rows_for", lambda self, s, span, b: 8)
    handles: list[object] = []
    real = image_prefill.decode_embeddings

    def cancel_after_first(context, rows, *args, **kwargs):  # type: ignore[no-untyped-def]
        status = real(context, rows, *args, **kwargs)
        handles[0].cancel()  # type: ignore[attr-defined]
        return status

    monkeypatch.setattr(image_prefill, "decode_embeddings", cancel_after_first)
    settings = tiny_settings(
        1, 512, mmproj_path=str(demo_vision.mmproj_path("qwen2vl")), mmproj_offload=False
    )
    with Engine.load(
        demo_vision.text_model_path("qwen2vl"), settings, record_calibration=False
    ) as engine:
        image = picture(300, 200, seed=11)
        text = f"<|im_start|>user\n{engine.image_marker} what?<|im_end|>\n<|im_start|>assistant\n"
        prompt = engine.tokenize_images(text, [image])
        handle = engine.submit(GenerationRequest("lena", prompt.tokens, GREEDY, images=prompt))
        handles.append(handle)
        assert handle.collect().finish.reason == "cancelled"
        (state,) = engine.slot_states()
        assert state.kv_pos_max == state.cached_tokens - 1  # nothing beyond the token list
        monkeypatch.setattr(image_prefill, "decode_embeddings", real)
        done = engine.submit(GenerationRequest("lena", prompt.tokens, GREEDY, images=prompt))
        stats = done.collect().finish.stats
        assert stats.cached_tokens == prompt.images[0].start  # the text before the image
        assert stats.evaluated_tokens == stats.prompt_tokens - stats.cached_tokens
