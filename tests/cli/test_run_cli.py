"""``homelab run``: streams the answer and ends with prompt/decode tok/s and TTFT."""

from __future__ import annotations

import io
import json

import pytest

from homelab.cli import main


def test_run_prompt_streams_text_then_speed(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "run",
            "demo:llama",
            "--prompt",
            "hello world",
            "--max-tokens",
            "12",
            "--temperature",
            "0",
            "--threads",
            "1",
            "--ctx",
            "256",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0
    assert out.strip()
    assert "[length] prompt" in err and "decode 12 tok" in err and "TTFT" in err


def test_run_json_is_one_document(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "run",
            "demo:qwen3",
            "--prompt",
            "hi",
            "--max-tokens",
            "4",
            "--json",
            "--threads",
            "1",
            "--ctx",
            "256",
            "--parallel",
            "2",
            "--kv",
            "q8_0",
            "--no-plan",
        ]
    )
    out, _ = capsys.readouterr()
    document = json.loads(out)
    assert code == 0
    assert document["finish_reason"] == "length"
    assert document["stats"]["completion_tokens"] == 4
    assert document["load"]["settings"]["type_k"] == "q8_0"
    assert document["load"]["settings"]["flash_attn"] is True
    assert document["load"]["n_ctx_per_slot"] == 256


def test_run_chat_keeps_the_conversation_and_reuses_its_prefix(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("hello there\nand again\n"))
    code = main(
        [
            "run",
            "demo:llama",
            "--chat",
            "--max-tokens",
            "6",
            "--json",
            "--threads",
            "1",
            "--ctx",
            "512",
            "--temperature",
            "0",
        ]
    )
    out, _ = capsys.readouterr()
    turns = json.loads(out)["turns"]
    assert code == 0 and len(turns) == 2
    assert turns[1]["stats"]["cached_tokens"] > 0  # the second turn extends the first


def test_run_needs_a_prompt_or_chat(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "demo:llama"])
    assert "--prompt" in capsys.readouterr().err


def test_run_plans_by_default_with_the_flags_as_fixed_knobs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        [
            "run",
            "demo:llama",
            "--prompt",
            "hi",
            "--max-tokens",
            "3",
            "--json",
            "--threads",
            "1",
            "--parallel",
            "2",
        ]
    )
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    assert document["load"]["settings"]["n_parallel"] == 2
    assert document["load"]["settings"]["n_threads"] == 1
    assert document["stats"]["completion_tokens"] == 3
