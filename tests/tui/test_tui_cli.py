"""`homelab tui --json`: the dashboard's status as one JSON document (every verb has --json)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tui_fakes import FakeHardware

from homelab.tui.status import status_document


def test_status_names_the_demo_model_and_its_plan(cpu_machine: FakeHardware) -> None:
    document = status_document(None, cpu_machine)
    assert document["model"]["demo"] is True
    assert document["model"]["note"] == "demo model, random weights"
    assert document["hardware"]["has_gpu"] is False
    assert set(document["plan"]) >= {"settings", "memory", "capacity", "fits", "reasons"}


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
