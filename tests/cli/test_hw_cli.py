"""`homelab hw` for real on this machine (no NVIDIA driver here; a GPU machine runs the other)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from homelab.cli import main

NVIDIA_DRIVER_PRESENT = Path("/proc/driver/nvidia").exists()
needs_no_driver = pytest.mark.skipif(NVIDIA_DRIVER_PRESENT, reason="an NVIDIA driver is loaded")
needs_driver = pytest.mark.skipif(not NVIDIA_DRIVER_PRESENT, reason="no NVIDIA driver here")
REPO_ROOT = Path(__file__).resolve().parents[2]


@needs_no_driver
def test_hw_json_without_a_driver_reports_no_gpu_and_the_cpu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["hw", "--json"]) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert document["has_gpu"] is False and document["gpus"] == []
    assert document["reason"].startswith("no NVIDIA GPU: ")
    assert "Running CPU-only" in document["reason"]
    assert document["cpu"]["logical_cores"] >= 1 and document["cpu"]["model"]
    memory = document["memory"]
    assert 0 < memory["ram_available_bytes"] <= memory["ram_total_bytes"]
    assert document["build"]["version"] == "0.3.36"
    assert "CPU" in document["build"]["backends"]
    assert "Traceback" not in captured.err


@needs_no_driver
def test_hw_text_without_a_driver_explains_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["hw"]) == 0
    lines = capsys.readouterr().out.splitlines()
    gpu_lines = [line for line in lines if line.startswith("GPU")]
    assert len(gpu_lines) == 1 and "none — no NVIDIA GPU: " in gpu_lines[0]
    assert any(line.startswith("CPU ") for line in lines)
    assert any(line.startswith("RAM ") and "GiB" in line for line in lines)
    assert any(line.startswith("llama.cpp ") and "0.3.36" in line for line in lines)


@needs_driver
def test_hw_json_with_a_driver_lists_the_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hw", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["has_gpu"] is True and document["reason"] is None
    for gpu in document["gpus"]:
        assert 0 < gpu["memory_free_bytes"] <= gpu["memory_total_bytes"]


def test_hw_json_in_a_fresh_process_is_one_clean_json_document() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "homelab.cli", "hw", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    if not NVIDIA_DRIVER_PRESENT:
        assert document["has_gpu"] is False
        assert document["reason"].startswith("no NVIDIA GPU: ")
    assert "Traceback" not in result.stderr


def test_hw_profiles_lists_the_planner_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hw", "--profiles", "--json"]) == 0
    profiles = json.loads(capsys.readouterr().out)
    assert len(profiles) >= 20
    assert profiles["rtx-4090"]["vram_bytes"] == 24 * (1 << 30)
    assert main(["hw", "--profiles"]) == 0
    assert any(line.startswith("rtx-4090 ") for line in capsys.readouterr().out.splitlines())


def test_the_verb_module_imports_nothing_heavy() -> None:
    code = (
        "import sys, homelab.cli, homelab.cli.hw, homelab.hardware.report;"
        "print(sorted(m for m in ('llama_cpp', 'textual', 'rich', 'numpy') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"
