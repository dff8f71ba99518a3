"""The shipped model trained on Python's documentation (tools/train_demo.py): real llama.cpp."""

from __future__ import annotations

import hashlib
import json

import pytest
from trained_words import word_share

from homelab.gguf import demo
from homelab.models.ref import DemoModel, resolve

SIDECAR = demo.TRAINED_DIR / f"{demo.TRAINED_STEM}.json"


def test_sidecar_matches_shipped_files() -> None:
    recorded = json.loads(SIDECAR.read_text())
    assert recorded["files"], "sidecar lists no files"
    for name, digest in recorded["files"].items():
        assert hashlib.sha256((demo.TRAINED_DIR / name).read_bytes()).hexdigest() == digest


@pytest.mark.parametrize("text", ["demo:trained", "demo:trained:Q4_K_M"])
def test_resolver_finds_trained_model_offline(text: str) -> None:
    ref = resolve(text)
    assert isinstance(ref, DemoModel) and ref.arch == "trained"
    assert ref.local_path().is_file()
    assert "trained on Python's documentation" in ref.label


def test_unknown_trained_quant_is_an_error() -> None:
    from homelab.errors import HomelabError

    with pytest.raises(HomelabError):
        resolve("demo:trained:Q2_K").local_path()


def test_greedy_answer_is_made_of_words() -> None:
    from llama_cpp import Llama

    model = Llama(model_path=str(resolve("demo:trained").local_path()), n_ctx=256, verbose=False)
    out = model("Return the", max_tokens=40, temperature=0.0)["choices"][0]["text"]
    n_words, share = word_share(out)
    assert n_words >= 3, out
    assert share >= 0.8, f"{share:.0%} real words in {out!r}"


def _held_out_perplexity(path: str, n_ctx: int = 128, chunks: int = 8) -> float:
    import numpy as np
    from llama_cpp import Llama

    model = Llama(model_path=path, n_ctx=n_ctx, logits_all=True, verbose=False)
    ids = model.tokenize((demo.TRAINED_DIR / "heldout.txt").read_bytes(), add_bos=False)
    nll, count = 0.0, 0
    for start in range(0, chunks * n_ctx, n_ctx):
        chunk = ids[start : start + n_ctx]
        model.reset()
        model.eval(chunk)
        logits = np.asarray(model.scores[: len(chunk) - 1], dtype=np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        nll -= float(logp[np.arange(len(chunk) - 1), chunk[1:]].sum())
        count += len(chunk) - 1
    return float(np.exp(nll / count))


@pytest.mark.parametrize("quant", ["F16", "Q4_K_M"])
def test_held_out_perplexity_through_llama_cpp_beats_token_frequencies(quant: str) -> None:
    """Random weights read ~8e7 (more than the 2048-token vocabulary); token frequencies alone
    (the sidecar's unigram baseline, ~260) are what a model that learned nothing of context
    would reach. The trained model, run by llama.cpp, must be far below both."""
    recorded = json.loads(SIDECAR.read_text())
    ppl = _held_out_perplexity(str(demo.trained_model_path(quant)))
    assert ppl < recorded["held_out_unigram_ppl"] / 8, (ppl, recorded["held_out_unigram_ppl"])


CHAT_QUESTIONS = (
    "Return the current time.",
    "What does the json module do?",
    "How do I read a file?",
    "Explain the difference between a list and a tuple.",
)


def test_greedy_chat_answers_are_made_of_words() -> None:
    """Through the GGUF's own ChatML template, as a chat client would ask: over a fixed set
    of questions, most words of the answers are real words of its training text."""
    from llama_cpp import Llama

    model = Llama(model_path=str(resolve("demo:trained").local_path()), n_ctx=256, verbose=False)
    answers = []
    for question in CHAT_QUESTIONS:
        reply = model.create_chat_completion(
            [{"role": "user", "content": question}], max_tokens=40, temperature=0.0
        )
        answers.append(str(reply["choices"][0]["message"]["content"]))  # type: ignore[index]
    n_words, share = word_share(" ".join(answers))
    assert n_words >= 5 * len(CHAT_QUESTIONS), answers
    assert share >= 0.8, f"{share:.0%} real words in {answers!r}"
