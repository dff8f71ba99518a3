"""``homelab yield`` / ``homelab resume`` against a server started as ``homelab serve MODEL``
starts one (a child process, the CLI's own wiring: its yield controller, its re-plan on
resume, its prompt cache), then a request answered after the resume. No GPU here: the
resume re-plans for the CPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from homelab.cli import main


@pytest.fixture
def served(tmp_path: Path, demo_model: Callable[..., Path]) -> Iterator[str]:
    """``homelab serve`` in a child process; its base URL (without /v1)."""
    command = [sys.executable, "-m", "homelab.cli", "serve", str(demo_model("llama"))]
    command += ["--json", "--port", "0", "--model-id", "demo", "--ctx", "512"]
    command += ["--parallel", "2", "--threads", "1", "--yield-grace", "1"]
    env = os.environ | {"HOMELAB_HOME": str(tmp_path / "home")}  # its own cache and lock
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert process.stdout is not None
        url = json.loads(process.stdout.readline())["base_url"].removesuffix("/v1")
        deadline = time.monotonic() + 120
        while httpx.get(f"{url}/health").status_code != 200:
            assert time.monotonic() < deadline and process.poll() is None, "never loaded"
            time.sleep(0.1)
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=90)
    assert "Traceback" not in stderr, stderr


def test_yield_and_resume_a_server_started_by_homelab_serve(
    served: str, capsys: pytest.CaptureFixture[str]
) -> None:
    body = {"model": "demo", "prompt": "once upon a time", "max_tokens": 4, "temperature": 0}
    assert httpx.post(f"{served}/v1/completions", json=body, timeout=120).status_code == 200

    assert main(["yield", "--wait", "--url", served, "--json"]) == 0
    yielded = json.loads(capsys.readouterr().out)
    assert yielded["state"] == "yielded" and yielded["last"]["models"] == ["demo"]
    assert httpx.get(f"{served}/health").json()["status"] == "yielded"

    assert main(["resume", "--url", served, "--json"]) == 0  # re-plans through the CLI's flags
    resumed = json.loads(capsys.readouterr().out)
    assert resumed["state"] == "serving", resumed["last"]["resume_error"]
    assert resumed["last"]["resumed"][0]["model"] == "demo"
    answer = httpx.post(f"{served}/v1/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"]


def test_yield_to_cpu_needs_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--yield-to-cpu"]) == 1
    assert "--yield-to-cpu needs a MODEL" in capsys.readouterr().err
