"""`homelab tui --json`: the dashboard's status as one JSON document (every verb has --json)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_tui_json_runs_from_the_command_line(tmp_path: Path) -> None:
    env = {**os.environ, "HOMELAB_HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf")}
    result = subprocess.run(
        [sys.executable, "-m", "homelab.cli", "tui", "demo", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["model"]["kind"] == "demo"
    assert "plan" in document


def test_an_unknown_model_is_a_clear_error(tmp_path: Path) -> None:
    env = {**os.environ, "HOMELAB_HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf")}
    result = subprocess.run(
        [sys.executable, "-m", "homelab.cli", "tui", "no-such-model-anywhere", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 1
    error = json.loads(result.stderr.strip().splitlines()[-1])["error"]
    assert "no-such-model-anywhere" in error["message"]


@pytest.mark.parametrize("argv", [["tui", "--help"], ["--help"]])
def test_help_mentions_the_model_argument(argv: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "homelab.cli", *argv], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert ("MODEL" in result.stdout) == (argv[0] == "tui")


def test_spec_and_rpc_flags_reach_the_app(monkeypatch: pytest.MonkeyPatch) -> None:
    """`homelab tui demo --spec ngram --draft-max 3 --rpc HOST:PORT,…`: the dashboard is built
    with that speculation and those workers (the app itself is not run here)."""
    import homelab.tui.app as tui_app
    from homelab.cli import main

    built: list[dict[str, object]] = []

    class NotRun:
        def run(self) -> None:
            built[-1]["ran"] = True

    def fake_make_app(model: str | None, **options: object) -> NotRun:
        built.append({"model": model, **options})
        return NotRun()

    monkeypatch.setattr(tui_app, "make_app", fake_make_app)
    argv = ["tui", "demo", "--spec", "ngram", "--draft-max", "3"]
    assert main([*argv, "--rpc", "127.0.0.1:50052, localhost:6000,127.0.0.1:50052"]) == 0
    (options,) = built
    assert options["model"] == "demo" and options["ran"] is True
    spec = options["speculation"]
    assert getattr(spec, "kind", None) == "ngram" and getattr(spec, "max_draft_tokens", 0) == 3
    assert options["rpc"] == ("127.0.0.1:50052", "localhost:6000")
    assert main(["tui", "demo"]) == 0
    assert built[-1]["speculation"] is None and built[-1]["rpc"] == ()
