"""Every verb takes every MODEL form `homelab plan` takes, through the real entry point: a hub
ref runs its downloaded file, one that is not downloaded says how to get it, and `homelab
serve` fails before it announces anything when its model is not there."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from homelab.cli import main
from homelab.hub.pull import pull_by_name


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_run_a_downloaded_hub_ref(hub_repo: str, capsys: pytest.CaptureFixture[str]) -> None:
    pulled = pull_by_name(f"{hub_repo}:Q4_0")
    code, out, err = run(
        capsys, "run", f"{hub_repo}:Q4_0", "--prompt", "hello", "--max-tokens", "3",
        "--threads", "1", "--ctx", "256", "--json",
    )  # fmt: skip
    assert code == 0, err
    document = json.loads(out)
    assert document["stats"]["completion_tokens"] == 3
    assert document["load"]["settings"]["quant"] == "Q4_0"
    assert document["load"]["path"] == str(pulled.path)  # the file in the Hugging Face cache


def test_run_a_hub_ref_that_is_not_downloaded_without_a_terminal_names_the_pull_command(
    hub_repo: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "run", f"{hub_repo}:Q4_0", "--prompt", "hi")
    assert code == 1 and out == ""
    assert "not downloaded yet" in err and f"homelab pull {hub_repo}:Q4_0" in err


def test_every_model_form_runs(
    hub_repo: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    demo_model: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A path, a demo name, a library name (as `homelab models --json` lists it), a file stem,
    a downloaded hub ref and a hub ref with --yes all load the file they name."""
    folder = tmp_path / "library"
    folder.mkdir()
    shutil.copy(demo_model("llama", "tiny", "Q8_0"), folder / "Mine-Q8_0.gguf")
    monkeypatch.setenv("HOMELAB_MODEL_DIRS", str(folder))
    pulled = pull_by_name(f"{hub_repo}:F16")
    code, out, err = run(capsys, "models", "--no-fit", "--json")
    assert code == 0, err
    names = {m["name"]: m["path"] for m in json.loads(out)["models"]}
    assert names == {"mine:Q8_0": str(folder / "Mine-Q8_0.gguf"), "tiny:F16": str(pulled.path)}
    forms = {
        str(folder / "Mine-Q8_0.gguf"): folder / "Mine-Q8_0.gguf",
        "demo:llama:tiny:Q4_0": demo_model("llama", "tiny", "Q4_0"),
        "mine:Q8_0": folder / "Mine-Q8_0.gguf",
        "MINE": folder / "Mine-Q8_0.gguf",  # the bare name, when only one model has it
        "Mine-Q8_0": folder / "Mine-Q8_0.gguf",  # the file's stem
        "tiny:F16": pulled.path,
        f"{hub_repo}:F16": pulled.path,
        f"{hub_repo}:Q4_0": None,  # not downloaded: --yes fetches it
    }
    for form, path in forms.items():
        code, out, err = run(
            capsys, "run", form, "--prompt", "hi", "--max-tokens", "2", "--threads", "1",
            "--ctx", "256", "--yes", "--json",
        )  # fmt: skip
        assert code == 0, (form, err)
        loaded = Path(json.loads(out)["load"]["path"])
        assert loaded == (path or loaded), form
    assert loaded.name == "Tiny-Q4_0.gguf" and "downloaded and verified" in err


@pytest.mark.parametrize(
    "missing", ["/nonexistent/missing-Q4_0.gguf", "homelab-test/Tiny-GGUF:F16"]
)
def test_serve_a_missing_model_fails_before_announcing(
    hub_repo: str, missing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "serve", missing, "--port", "0")
    assert code == 1
    assert out == ""  # no "Serving … at http://…" line
    assert "Serving" not in err and ("file not found" in err or "not downloaded yet" in err)


def test_plan_inspect_and_tui_status_take_a_hub_ref(
    hub_repo: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "plan", f"{hub_repo}:F16", "--ram", "4GiB", "--json")
    assert code == 0 and json.loads(out)["settings"]["quant"] == "F16"  # remote headers
    pull_by_name(f"{hub_repo}:F16")
    code, out, _ = run(capsys, "inspect", f"{hub_repo}:F16", "--json")
    assert code == 0 and json.loads(out)["quant"] == "F16"
    code, out, err = run(capsys, "tui", f"{hub_repo}:F16", "--json")
    assert code == 0, err
    status = json.loads(out)
    assert status["model"]["kind"] == "hub" and status["model"]["path"]
    assert status["plan"]["verified"]["method"] == "dry-run"  # a local file: confirmed


def test_quality_and_bench_take_a_library_name(
    own_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    demo_model: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    folder = tmp_path / "library"
    folder.mkdir()
    for quant in ("F16", "Q8_0"):
        shutil.copy(demo_model("llama", "tiny", quant), folder / f"mine-{quant}.gguf")
    monkeypatch.setenv("HOMELAB_MODEL_DIRS", str(folder))
    code, out, err = run(
        capsys, "quality", "mine-Q8_0", "--ctx", "64", "--chunks", "1", "--kv-types", "f16",
        "--no-save", "--json",
    )  # fmt: skip
    assert code == 0, err
    document = json.loads(out)
    assert document["reference"]["quant"] == "F16"  # the more precise file beside it
    code, out, err = run(
        capsys, "bench", "mine-Q8_0", "--only", "table", "--levels", "1", "--kv-types", "f16",
        "--ctx-per-request", "128", "--prompt-tokens", "8", "--gen-tokens", "4",
        "--threads", "1", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["model"]["path"] == str(folder / "mine-Q8_0.gguf")
