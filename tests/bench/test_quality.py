"""Quality measurement on real llama.cpp runs of the tiny demo model (a few 256-token chunks)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from homelab.bench.quality import (
    QualityConfig,
    QualityResult,
    chunks,
    kl_divergence,
    log_softmax,
    measure_quality,
    read_text,
)
from homelab.bench.store import load_last_quality, quality_file, save_quality
from homelab.bench.weights import most_precise, sibling_files
from homelab.errors import BenchError

CTX = 128
CHUNKS = 4


def config(path: Path, kv: str, label: str | None = None) -> QualityConfig:
    return QualityConfig(label or f"K/V {kv}", str(path), "F16", kv, kv, True)


@pytest.fixture(scope="module")
def tiny(demo_model: Callable[..., Path]) -> Path:
    return demo_model("llama", "tiny", "F16")


@pytest.fixture(scope="module")
def kv_result() -> QualityResult:
    """The shipped trained model on its held-out text: divergences of a model that has learned
    something (random weights spread their probability almost evenly)."""
    from homelab.gguf.demo import TRAINED_DIR, trained_model_path

    trained = trained_model_path("F16")
    text, source = read_text(TRAINED_DIR / "heldout.txt")
    candidates = [config(trained, "f16", "self"), config(trained, "q8_0"), config(trained, "q4_0")]
    return measure_quality(
        config(trained, "f16", "reference"),
        candidates,
        text,
        model_name="tiny demo",
        text_source=source,
        plan_key=candidates[1].key,
        n_ctx=CTX,
        max_chunks=CHUNKS,
    )


def test_a_configuration_against_itself_has_no_divergence(kv_result: QualityResult) -> None:
    itself = kv_result.rows[0]
    assert itself.kld_mean == pytest.approx(0.0, abs=1e-7)
    assert itself.kld_max == pytest.approx(0.0, abs=1e-6)
    assert itself.top1_agreement == 1.0
    assert itself.perplexity == pytest.approx(kv_result.reference_perplexity, rel=1e-6)


def test_q4_0_cache_diverges_more_than_q8_0(kv_result: QualityResult) -> None:
    _, q8, q4 = kv_result.rows
    assert 0.0 < q8.kld_mean < q4.kld_mean
    assert q8.kld_p99 < q4.kld_p99
    assert q8.top1_agreement >= q4.top1_agreement
    assert kv_result.reference_perplexity < 50  # trained: far below its 2048-token vocabulary


def test_counts_scored_positions_of_the_second_half_of_each_chunk(
    kv_result: QualityResult,
) -> None:
    assert kv_result.n_chunks == CHUNKS
    assert kv_result.n_scored_tokens == CHUNKS * (CTX // 2 - 1)
    assert kv_result.n_text_tokens > CHUNKS * CTX
    assert kv_result.plan_row is kv_result.rows[1]
    assert math.isfinite(kv_result.reference_perplexity)


def test_saved_result_reads_back_for_the_dashboard(kv_result: QualityResult) -> None:
    path = save_quality(kv_result)
    assert path == quality_file("tiny demo")
    loaded = load_last_quality("tiny demo")
    assert loaded is not None
    assert loaded.to_dict() == kv_result.to_dict()
    assert "KLD" in loaded.summary() and "top-1" in loaded.summary()


def test_damaged_saved_result_is_ignored(kv_result: QualityResult) -> None:
    quality_file("damaged").parent.mkdir(parents=True, exist_ok=True)
    quality_file("damaged").write_text("{not json", encoding="utf-8")
    assert load_last_quality("damaged") is None
    assert load_last_quality("never measured") is None


def test_text_shorter_than_one_chunk_is_refused(tiny: Path) -> None:
    with pytest.raises(BenchError, match="fewer than one chunk"):
        measure_quality(config(tiny, "f16"), [config(tiny, "q8_0")], "a short text", model_name="x")


def test_a_byte_fallback_vocabulary_with_more_tokens_than_bytes_is_measured(
    byte_vocab_model: Path,
) -> None:
    # CJK, emoji and spaces: one token per byte, three per space ("▁" falls back to bytes)
    text = "日本語の テキスト 🙂👍🏽 naïve café\n" * 12
    result = measure_quality(
        config(byte_vocab_model, "f16", "reference"),
        [config(byte_vocab_model, "q8_0")],
        text,
        model_name="byte vocabulary",
        n_ctx=128,
    )
    assert result.n_text_tokens == len(text.replace(" ", "\u2581").encode())
    assert result.n_text_tokens > len(text.encode()) + 16  # past any guess from the length
    assert result.n_chunks == result.n_text_tokens // 128
    assert math.isfinite(result.reference_perplexity) and result.rows[0].kld_mean >= 0.0


def test_other_weights_file_is_compared_with_the_reference(
    tiny: Path, demo_model: Callable[..., Path]
) -> None:
    q8_path = demo_model("llama", "tiny", "Q8_0")
    text, _ = read_text(None)
    weights = QualityConfig("Q8_0 weights", str(q8_path), "Q8_0")
    result = measure_quality(
        config(tiny, "f16", "reference"), [weights], text, model_name="x", n_ctx=CTX, max_chunks=1
    )
    assert result.rows[0].kld_mean > 0.0


def test_most_precise_sibling_is_the_f16_file(demo_model: Callable[..., Path]) -> None:
    q4_path = demo_model("llama", "tiny", "Q4_0")
    f16_path = demo_model("llama", "tiny", "F16")
    assert f16_path.resolve() in sibling_files(q4_path)
    best = most_precise(q4_path)
    assert best.path == f16_path.resolve()
    assert best.quant == "F16"
    assert best.bits_per_weight > 15


def test_log_softmax_and_kl_divergence_of_known_distributions() -> None:
    logits = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]], dtype=np.float32))
    reference = log_softmax(logits)
    assert np.exp(reference).sum(axis=1) == pytest.approx([1.0, 1.0])
    uniform = log_softmax(np.zeros((2, 3), dtype=np.float32))
    expected = [
        0.5 * math.log(0.5 * 3) + 2 * 0.25 * math.log(0.25 * 3),
        2 * 0.1 * math.log(0.1 * 3) + 0.8 * math.log(0.8 * 3),
    ]
    assert kl_divergence(reference, uniform) == pytest.approx(expected, rel=1e-5)
    assert kl_divergence(reference, reference) == pytest.approx([0.0, 0.0])


def test_chunks_start_with_bos_and_drop_the_incomplete_tail() -> None:
    tokens = list(range(10, 35))
    pieces = chunks(tokens, 8, bos=1, max_chunks=None)
    assert len(pieces) == 3
    assert [p[0] for p in pieces] == [1, 1, 1]
    assert pieces[1][1:] == tokens[9:16]
    assert chunks(tokens, 8, bos=None, max_chunks=2)[0] == tokens[:8]


def test_quality_command_compares_the_plan_and_saves_the_result(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from homelab.cli import main

    monkeypatch.setenv("HOMELAB_HOME", str(tmp_path))
    code = main(["quality", "demo:tiny:Q8_0", "--ctx", "128", "--chunks", "2", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    document = json.loads(out)
    assert document["reference"]["quant"] == "F16"  # the more precise file beside the Q8_0
    labels = [row["config"]["type_k"] for row in document["rows"]]
    assert sorted(set(labels)) == ["f16", "q4_0", "q8_0"]
    plan_rows = [row for row in document["rows"] if row["is_plan"]]
    assert len(plan_rows) == 1 and plan_rows[0]["config"]["quant"] == "Q8_0"
    assert all(row["kld_mean"] > 0 for row in document["rows"])  # Q8_0 weights differ from F16
    assert document["saved_to"] == str(quality_file(document["model_name"]))
    assert load_last_quality(document["model_name"]) is not None


def test_quality_command_reads_a_given_text(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from homelab.cli import main

    text = tmp_path / "essay.txt"
    text.write_text("the cache holds the keys and values of every token. " * 40)
    code = main(["quality", "demo", "--text", str(text), "--ctx", "64", "--no-save", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    document = json.loads(out)
    assert document["text_source"] == str(text)
    assert document["saved_to"] is None
    missing = main(["quality", "demo", "--text", str(tmp_path / "nope.txt")])
    assert missing == 1 and "cannot read the text" in capsys.readouterr().err


def test_kv_types_llama_cpp_would_refuse_are_skipped_with_a_reason(tiny: Path) -> None:
    """A model with 48-wide heads (as the first trained demo had) cannot use q8_0 / q4_0
    caches: the quality run measures the rest and says why those rows are missing."""
    from dataclasses import replace

    from homelab.bench.plan_quality import unusable_kv_types
    from homelab.bench.planning import bench_hardware
    from homelab.gguf.reader import read_model

    info = read_model(tiny)
    hardware = bench_hardware(None)
    assert unusable_kv_types(info, hardware, ("f16", "q8_0", "q4_0")) == {}
    narrow = replace(info, head_dim_k=48, head_dim_v=48)
    skipped = unusable_kv_types(narrow, hardware, ("f16", "q8_0", "q4_0"))
    assert set(skipped) == {"q8_0", "q4_0"}
    assert "multiples of 32" in skipped["q8_0"] and "48" in skipped["q8_0"]
