"""``homelab bench --draft / --spec``: the tg run plain and speculating, side by side (real
llama.cpp on the generated target/draft pair, whose draft agrees with the target by
construction)."""

from __future__ import annotations

import json

import pytest

from homelab.cli import main

SMALL_RUN = ("--only", "speed", "--pp", "16", "--tg", "24", "--reps", "2", "--threads", "1")


def bench_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    code = main(["bench", "demo:spec:tiny", *SMALL_RUN, "--json", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    document = json.loads(out)
    assert isinstance(document, dict)
    return document


def test_a_draft_model_is_measured_beside_plain_decoding(
    capsys: pytest.CaptureFixture[str],
) -> None:
    document = bench_json(
        capsys, "--draft", "demo:spec-draft:tiny", "--draft-max", "4", "--draft-fixed", "--no-save"
    )
    result = document["speculation"]
    assert isinstance(result, dict)
    assert result["kind"] == "draft" and result["draft_path"].endswith(".gguf")
    assert result["adaptive"] is False and result["max_draft_tokens"] == 4
    assert len(result["plain_tok_s"]["samples"]) == len(result["speculative_tok_s"]["samples"]) == 2
    assert result["ratio"] == pytest.approx(
        result["speculative_tok_s"]["median"] / result["plain_tok_s"]["median"]
    )
    # the draft is the target's own first layers: it drafted, most of it was kept, and a
    # target step gained more than one token
    assert result["drafted_tokens"] > 0
    assert 0.5 < result["acceptance_rate"] <= 1.0
    assert result["tokens_per_target_step"] > 1.2
    assert document["speed"] is not None  # the plain speed part still ran


def test_adaptive_prompt_lookup_reports_what_it_did(capsys: pytest.CaptureFixture[str]) -> None:
    """Adaptive (the default): it may decide drafting does not pay on this CPU and stay plain;
    what it did is reported either way."""
    result = bench_json(capsys, "--spec", "ngram", "--draft-max", "4", "--no-save")["speculation"]
    assert isinstance(result, dict)
    assert result["kind"] == "ngram" and result["max_draft_tokens"] == 4
    assert result["adaptive"] is True
    assert result["draft_path"] is None
    rate = result["acceptance_rate"]
    assert rate is None or 0.0 <= rate <= 1.0  # random text: it may find nothing to copy
    assert result["tokens_per_target_step"] >= 1.0


def test_the_table_alone_cannot_measure_speculation(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "demo:spec:tiny", "--only", "table", "--spec", "ngram"])
    assert code == 1
    assert "--only table" in capsys.readouterr().err


def test_the_text_report_shows_the_comparison(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "demo:spec:tiny", *SMALL_RUN, "--draft", "demo:spec-draft:tiny"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Speculative decoding: draft" in out and "vs plain" in out
    assert "Only the plain figures go into the hardware profile" in out
