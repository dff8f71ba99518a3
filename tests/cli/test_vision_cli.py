"""The projector in the verbs: ``plan`` shows its memory and image budget (text and JSON),
``--no-mmproj`` / ``--mmproj`` / ``--mmproj-cpu`` / ``--image-max-tokens`` change it,
``inspect`` shows what lies beside a model, ``models`` marks models that see images.
Real generated vision pairs (``homelab.gguf.demo_vision``) in a folder of their own."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from homelab.cli import main
from homelab.gguf import demo_vision
from homelab.planner.render import BAR_CHARACTERS, BAR_WIDTH, FREE


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's model folder: a Qwen2-VL-like model, its projector, and a text-only model."""
    where = tmp_path_factory.mktemp("vision-models")
    shutil.copy(demo_vision.text_model_path("qwen2vl"), where / "TinyVL-F16.gguf")
    shutil.copy(demo_vision.mmproj_path("qwen2vl"), where / "mmproj-TinyVL-F16.gguf")
    return where


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_plan_shows_the_projector(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    model = str(folder / "TinyVL-F16.gguf")
    code, out, _ = cli(capsys, "plan", model, "--ctx", "1024", "--no-verify", "--json")
    projector = json.loads(out)["projector"]
    assert code == 0 and projector["projector_type"] == "qwen2vl_merger"
    assert projector["device"] == "cpu" and projector["image_max_tokens"] == 4096
    code, out, _ = cli(capsys, "plan", model, "--image-max-tokens", "300", "--no-verify")
    assert code == 0 and "projector qwen2vl_merger on CPU" in out
    assert "images up to 300 tokens" in out
    code, out, _ = cli(capsys, "plan", model, "--no-mmproj", "--no-verify", "--json")
    assert code == 0 and json.loads(out)["projector"] is None


def test_plan_draws_the_projector_in_its_memory_bar(
    capsys: pytest.CaptureFixture[str], folder: Path
) -> None:
    """The projector's bytes are part of its device's bar (not drawn as free) and of the
    JSON's parts; a 1 GiB budget makes its 40 MiB at least one cell of the bar."""
    argv = ["plan", str(folder / "TinyVL-F16.gguf"), "--ram", "2GiB", "--no-verify"]
    code, out, _ = cli(capsys, *argv, "--json")
    document = json.loads(out)
    device = document["memory"]["devices"][0]
    projector_bytes = document["projector"]["total_bytes"]
    assert code == 0 and device["projector_bytes"] == projector_bytes > 0
    assert document["memory"]["projector_bytes"] == projector_bytes
    parts = {key for key in device if key.endswith("_bytes")} - {"budget_bytes", "total_bytes"}
    assert sum(device[key] for key in parts) == device["total_bytes"]  # every part is listed
    code, out, _ = cli(capsys, *argv)
    assert code == 0 and "▞ projector" in out
    line = next(line for line in out.splitlines() if line.startswith("  CPU host RAM"))
    bar = re.findall(f"[{''.join(BAR_CHARACTERS.values())}{FREE}!]{{{BAR_WIDTH}}}", line)[0]
    assert "▞" in bar
    used = BAR_WIDTH - bar.count(FREE)
    assert used == round(device["total_bytes"] / device["budget_bytes"] * BAR_WIDTH)


def test_plan_refuses_a_file_that_is_not_a_projector(
    capsys: pytest.CaptureFixture[str], folder: Path
) -> None:
    model = str(folder / "TinyVL-F16.gguf")
    code, _, err = cli(capsys, "plan", model, "--mmproj", model, "--no-verify")
    assert code != 0 and "not a vision projector" in err and "--mmproj" in err


def test_inspect_and_models_show_it(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    code, out, _ = cli(capsys, "inspect", str(folder / "TinyVL-F16.gguf"))
    assert code == 0 and "vision          mmproj-TinyVL-F16.gguf (qwen2vl_merger" in out
    code, out, _ = cli(capsys, "inspect", str(folder / "mmproj-TinyVL-F16.gguf"), "--json")
    assert code == 0 and json.loads(out)["n_embd_out"] == 256
    code, out, _ = cli(capsys, "models", "--dir", str(folder), "--no-fit", "--json")
    listed = {Path(m["path"]).name: m["mmproj"] for m in json.loads(out)["models"]}
    assert listed["TinyVL-F16.gguf"].endswith("mmproj-TinyVL-F16.gguf")
    assert "mmproj-TinyVL-F16.gguf" not in listed  # a projector is not a model of its own


def test_serve_finds_plans_and_loads_the_projector(tmp_path: Path) -> None:
    """``homelab serve demo:vision-gemma3``: the projector beside the model is planned and
    loaded, /v1/models says the model sees, and an image through the openai SDK counts its
    fixed tokens in ``prompt_tokens``."""
    import base64
    import io
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    import httpx
    import openai
    from PIL import Image

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    command = [sys.executable, "-m", "homelab.cli", "serve", "demo:vision-gemma3", "--json"]
    command += ["--port", str(port), "--model-id", "eyes", "--ctx", "512", "--threads", "1"]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    buffer = io.BytesIO()
    Image.new("RGB", (50, 40), (0, 120, 240)).save(buffer, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    try:
        assert process.stdout is not None
        base_url = json.loads(process.stdout.readline())["base_url"]
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.05)
        card = httpx.get(f"{base_url}/models").json()["data"][0]
        assert card["supports"]["vision"] is True
        with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as sdk:
            content: list[dict[str, object]] = [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "What colour?"},
            ]
            reply = sdk.chat.completions.create(
                model="eyes", messages=[{"role": "user", "content": content}], max_tokens=2
            )  # type: ignore[call-overload]
        tokens = demo_vision.fixed_image_tokens("gemma3")
        assert reply.usage is not None and tokens is not None
        assert reply.usage.prompt_tokens > tokens
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=90)
    assert "model loaded" in stderr, stderr
