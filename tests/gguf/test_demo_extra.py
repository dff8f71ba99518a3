"""The special-purpose demo models really load and run in llama.cpp, and do what they are for:
``demo:bert`` embeds, ``demo:reasoning`` thinks in ``<think>`` tokens, and the
``demo:spec`` / ``demo:spec-draft`` pair agrees on most greedy tokens."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import gguf
import llama_cpp
import numpy as np
import pytest

from homelab.engine.chat_template import ChatTemplate
from homelab.errors import HomelabError
from homelab.gguf import demo_extra, vocab
from homelab.gguf.demo import demo_model_path, demo_ref_path, parse_demo_ref
from homelab.gguf.demo_extra import SPEC_DRAFT_LAYERS, SPEC_TARGET_LAYERS

TEXTS = ["hello world", "the cache is slow and the model is fast", "json true false null"]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# --- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("demo:bert", ("bert", "tiny", "F16")),
        ("demo:bert:bench:q8_0", ("bert", "bench", "Q8_0")),
        ("demo:reasoning", ("reasoning", "tiny", "F16")),
        ("demo:spec", ("spec", "bench", "F16")),
        ("demo:spec-draft", ("spec-draft", "bench", "F16")),
        ("demo:spec-draft:tiny:Q4_0", ("spec-draft", "tiny", "Q4_0")),
        ("demo:bench", ("llama", "bench", "F16")),  # the plain names are unchanged
    ],
)
def test_demo_names_pick_the_special_models(name: str, parsed: tuple[str, str, str]) -> None:
    assert parse_demo_ref(name) == parsed


@pytest.mark.parametrize("name", ["demo:bert:huge", "demo:spec:tiny:Q3_X"])
def test_bad_special_names_are_refused(name: str) -> None:
    with pytest.raises(HomelabError):
        parse_demo_ref(name)


@pytest.mark.parametrize("name", ["bert", "reasoning", "spec", "spec-draft"])
def test_generating_twice_gives_identical_bytes(name: str, tmp_path: Path) -> None:
    _, write = demo_extra.recipe(name, "tiny")
    first, second = write(tmp_path / "first.gguf"), write(tmp_path / "second.gguf")
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes() == demo_model_path(name, "tiny").read_bytes()


# --- embeddings -------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["F16", "Q8_0"])
def bert(request: pytest.FixtureRequest) -> Iterator[Any]:
    path = demo_model_path("bert", "tiny", request.param)
    model = llama_cpp.Llama(str(path), embedding=True, n_ctx=512, verbose=False)
    yield model
    model.close()


def test_bert_embeds_a_string_into_n_embd_floats(bert: Any) -> None:
    embedding = np.array(bert.embed("hello world"))
    assert bert.n_embd() == 256
    assert embedding.shape == (256,)
    assert np.isfinite(embedding).all() and np.linalg.norm(embedding) > 0


def test_bert_embeds_a_batch_like_each_string_alone(bert: Any) -> None:
    batch = [np.array(e) for e in bert.embed(TEXTS)]
    alone = [np.array(bert.embed(text)) for text in TEXTS]
    assert len(batch) == len(TEXTS)
    for together, single in zip(batch, alone, strict=True):
        assert np.allclose(together, single, atol=1e-4)


def test_bert_embeddings_are_deterministic_and_differ_between_texts(bert: Any) -> None:
    first = np.array(bert.embed(TEXTS[1]))
    assert np.array_equal(first, np.array(bert.embed(TEXTS[1])))
    assert cosine(first, np.array(bert.embed(TEXTS[2]))) < 0.9


def test_bert_pools_by_the_mean_its_metadata_names(bert: Any) -> None:
    assert bert.metadata["bert.pooling_type"] == str(int(gguf.PoolingType.MEAN))
    per_token = llama_cpp.Llama(
        bert.model_path,
        embedding=True,
        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_NONE,
        n_ctx=512,
        verbose=False,
    )
    try:
        tokens = np.array(per_token.embed(TEXTS[1]))
    finally:
        per_token.close()
    assert tokens.shape == (len(bert.tokenize(TEXTS[1].encode())), 256)
    assert np.allclose(tokens.mean(axis=0), bert.embed(TEXTS[1]), atol=1e-4)


def test_bert_wordpiece_wraps_text_in_cls_and_sep_and_is_uncased(bert: Any) -> None:
    tokens = bert.tokenize(b"Hello WORLD")
    assert tokens[0] == vocab.CLS_ID and tokens[-1] == vocab.SEP_ID
    assert tokens == bert.tokenize(b"hello world")
    assert vocab.WP_UNK_ID not in tokens


# --- reasoning --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reasoning() -> Iterator[Any]:
    model = llama_cpp.Llama(str(demo_ref_path("demo:reasoning")), n_ctx=256, verbose=False)
    yield model
    model.close()


CONVERSATION = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "<think>\nthey greet me\n</think>\n\nhello"},
    {"role": "user", "content": "again"},
]


def test_reasoning_template_opens_a_think_block(reasoning: Any) -> None:
    template = ChatTemplate(reasoning.metadata["tokenizer.chat_template"])
    for switch in ({}, {"enable_thinking": True}):
        prompt = template.render(CONVERSATION, **switch)
        assert prompt.endswith("<|im_start|>assistant\n<think>\n")
        assert "they greet me" not in prompt  # earlier reasoning is dropped, as Qwen3 does
        assert "<|im_start|>assistant\nhello<|im_end|>" in prompt


def test_reasoning_template_without_thinking_closes_an_empty_block(reasoning: Any) -> None:
    template = ChatTemplate(reasoning.metadata["tokenizer.chat_template"])
    prompt = template.render(CONVERSATION, enable_thinking=False)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize("special", [False, True])
def test_think_tags_are_single_tokens(reasoning: Any, special: bool) -> None:
    think, end_think = demo_extra.reasoning_token_ids(reasoning.n_vocab())
    assert reasoning.tokenize(b"<think>", add_bos=False, special=special) == [think]
    assert reasoning.tokenize(b"</think>", add_bos=False, special=special) == [end_think]
    text = b"<think>\nhmm</think>\n\nhello"
    tokens = reasoning.tokenize(text, add_bos=False, special=special)
    assert tokens.count(think) == 1 and tokens.count(end_think) == 1
    assert reasoning.detokenize(tokens) == text


def test_reasoning_vocabulary_is_the_demo_one_plus_the_tags(reasoning: Any) -> None:
    plain = vocab.build_vocabulary(reasoning.n_vocab())
    tagged = vocab.build_vocabulary(reasoning.n_vocab(), added=demo_extra.REASONING_TOKENS)
    assert tagged.tokens[:-2] == plain.tokens[:-2]
    assert tagged.tokens[-2:] == ("<think>", "</think>")
    qwen3 = llama_cpp.Llama(str(demo_model_path("qwen3")), vocab_only=True, verbose=False)
    try:
        for text in TEXTS:
            assert reasoning.tokenize(text.encode()) == qwen3.tokenize(text.encode())
    finally:
        qwen3.close()


def test_reasoning_model_chats_through_its_template(reasoning: Any) -> None:
    reply = reasoning.create_chat_completion(messages=CONVERSATION, max_tokens=4, temperature=0)
    assert reply["usage"]["completion_tokens"] > 0


# --- speculative decoding pair ----------------------------------------------------------------


def tensors(path: Path) -> dict[str, bytes]:
    return {t.name: bytes(t.data.tobytes()) for t in gguf.GGUFReader(path).tensors}


@pytest.mark.parametrize("quant", ["F16", "Q8_0"])
def test_draft_is_the_targets_own_first_layers_and_head(quant: str) -> None:
    target = tensors(demo_model_path("spec", "tiny", quant))
    draft = tensors(demo_model_path("spec-draft", "tiny", quant))
    assert {name.split(".")[1] for name in draft if name.startswith("blk.")} == {"0", "1"}
    assert {"token_embd.weight", "output_norm.weight", "output.weight"} <= draft.keys()
    for name, data in draft.items():
        assert target[name] == data, name
    n_target_layers = len({name.split(".")[1] for name in target if name.startswith("blk.")})
    assert n_target_layers == SPEC_TARGET_LAYERS


def test_the_targets_later_layers_write_little_into_the_residual_stream() -> None:
    reader = gguf.GGUFReader(demo_model_path("spec", "tiny"))
    scale = {t.name: float(np.abs(t.data.astype(np.float32)).max()) for t in reader.tensors}
    for part in ("attn_output", "ffn_down"):
        early = scale[f"blk.{SPEC_DRAFT_LAYERS - 1}.{part}.weight"]
        late = scale[f"blk.{SPEC_DRAFT_LAYERS}.{part}.weight"]
        assert late < early / 20


def test_draft_and_target_share_the_vocabulary() -> None:
    def token_list(name: str) -> list[str]:
        field = gguf.GGUFReader(demo_model_path(name, "tiny")).fields["tokenizer.ggml.tokens"]
        return [bytes(field.parts[i]).decode() for i in field.data]

    assert token_list("spec") == token_list("spec-draft")


def greedy_agreement(target: Any, draft: Any, prompt: str, n_tokens: int) -> tuple[int, int]:
    """(agreeing, total): the draft generates freely; the target scores that text in one batch
    and each position counts when the target's argmax is the draft's token."""
    prompt_tokens = draft.tokenize(prompt.encode(), add_bos=True, special=True)
    generated = list(islice(draft.generate(prompt_tokens, temp=0.0), n_tokens))
    target.reset()
    target.eval(prompt_tokens + generated)
    n_prompt = len(prompt_tokens)
    logits = np.array(target.scores[n_prompt - 1 : n_prompt + len(generated) - 1])
    return int((logits.argmax(axis=1) == np.array(generated)).sum()), len(generated)


@pytest.mark.parametrize("size", ["tiny", "bench"])
def test_target_agrees_with_the_drafts_greedy_tokens(size: str) -> None:
    target = llama_cpp.Llama(
        str(demo_model_path("spec", size)), n_ctx=512, n_batch=512, logits_all=True, verbose=False
    )
    draft = llama_cpp.Llama(str(demo_model_path("spec-draft", size)), n_ctx=512, verbose=False)
    try:
        assert draft.n_vocab() == target.n_vocab()
        prompts = ["hello world, the model is fast", "<|im_start|>user\nwrite<|im_end|>\n", "json"]
        counts = [greedy_agreement(target, draft, prompt, 100) for prompt in prompts]
    finally:
        target.close()
        draft.close()
    agreeing, total = map(sum, zip(*counts, strict=True))
    print(f"demo:spec:{size} greedy agreement {agreeing}/{total} = {agreeing / total:.3f}")
    assert total == 300
    assert agreeing / total >= 0.8
