"""Chat prompts come from the model's own template, rendered in the sandbox."""

from __future__ import annotations

from homelab.engine.api import GenerationRequest, SamplingParams
from homelab.engine.engine import Engine
from homelab.gguf import vocab as demo_vocab


def test_render_chat_uses_the_gguf_template(engine: Engine) -> None:
    assert engine.chat_template is not None
    text = engine.render_chat([{"role": "user", "content": "hello"}])
    assert text.endswith("<|im_start|>assistant\n")
    tokens = engine.tokenize(text)
    assert tokens[0] == demo_vocab.BOS_ID
    assert demo_vocab.IM_START_ID in tokens  # special tokens parsed, not spelled out
    assert tokens.count(demo_vocab.BOS_ID) == 1


def test_chat_request_generates(engine: Engine) -> None:
    prompt = engine.render_chat([{"role": "user", "content": "hello"}])
    done = engine.submit(GenerationRequest("a", prompt, SamplingParams(max_tokens=4))).collect()
    assert done.finish.stats.prompt_tokens == len(engine.tokenize(prompt))


def test_tokenize_detokenize_round_trip(engine: Engine) -> None:
    text = "hello world, ünïcode ✓ <|im_end|>"
    tokens = engine.tokenize(text, add_bos=False)
    assert demo_vocab.IM_END_ID in tokens
    assert engine.detokenize(tokens) == text
    assert demo_vocab.IM_END_ID not in engine.tokenize(text, add_bos=False, special=False)
