"""The hub's verbs end to end through ``homelab.cli.main`` against the FakeHub."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fake_hub import FakeHub

from homelab.cli import main


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:  # type: ignore[type-arg]
    assert main(argv) == 0
    document: dict = json.loads(capsys.readouterr().out)  # type: ignore[type-arg]
    return document


def test_search_lists_gguf_repos(
    hub_env: Path, tiny_repo: str, capsys: pytest.CaptureFixture[str], fake_hub: FakeHub
) -> None:
    document = _json(capsys, ["search", "gguf", "--json"])
    assert [r["repo_id"] for r in document["repos"]] == [tiny_repo, "homelab-test/Other-GGUF"]
    assert document["repos"][0] == {
        "repo_id": tiny_repo,
        "downloads": 1234,
        "likes": 56,
        "updated": "2025-06-01",
    }
    assert "filter=gguf" in fake_hub.requests("hub")[0].query
    assert main(["search", "tinyllama"]) == 0
    text = capsys.readouterr().out
    assert tiny_repo in text and "1,234" in text and "Other-GGUF" not in text


def test_search_repo_lists_files_grouped_by_quant(
    hub_env: Path, tiny_repo: str, capsys: pytest.CaptureFixture[str]
) -> None:
    document = _json(capsys, ["search", tiny_repo, "--json"])
    assert [(e["quant"], len(e["files"]), e["split"]) for e in document["entries"]] == [
        ("F16", 1, False),
        ("Q8_0", 2, True),
        ("Q4_0", 1, False),
    ]
    assert all(f["sha256"] for e in document["entries"] for f in e["files"])
    assert [p["path"] for p in document["projectors"]] == ["mmproj-TinyLlama-F16.gguf"]
    assert main(["search", tiny_repo]) == 0
    text = capsys.readouterr().out
    assert "Q8_0/TinyLlama-Q8_0-00001-of-00002.gguf (split set)" in text


def test_pull_then_models(
    hub_env: Path,
    tiny_repo: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    quant_files: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pulled = _json(capsys, ["pull", f"{tiny_repo}:Q4_0", "--json"])
    assert pulled["quant"] == "Q4_0" and pulled["downloaded_bytes"] == pulled["size_bytes"]
    folder = tmp_path / "mine"
    folder.mkdir()
    shutil.copy(quant_files["Q8_0"], folder / "tiny-Q8_0.gguf")
    models = _json(capsys, ["models", "--dir", str(folder), "--no-fit", "--json"])
    by_ref = {m["ref"]: m for m in models["models"]}
    assert by_ref[f"{tiny_repo}:Q4_0"]["path"] == pulled["paths"][0]
    assert by_ref[str(folder / "tiny-Q8_0.gguf")]["architecture"] == "llama"
    assert by_ref[str(folder / "tiny-Q8_0.gguf")]["name"] == "tiny:Q8_0"  # the library name
    assert by_ref[f"{tiny_repo}:Q4_0"]["name"] == "tinyllama:Q4_0"
    assert main(["models", "--dir", str(folder), "--no-fit"]) == 0
    assert "tiny:Q8_0" in capsys.readouterr().out


def test_library_pull_without_quant_asks_which(hub_env: Path, tiny_repo: str) -> None:
    """The CLI asks the planner (see test_matrix); the library call wants an explicit choice."""
    from homelab.errors import HubError
    from homelab.hub.pull import pull
    from homelab.hub.quants import ModelRef

    with pytest.raises(HubError, match=r"several GGUF files \(F16, Q8_0, Q4_0\)") as caught:
        pull(ModelRef(tiny_repo))
    assert f"{tiny_repo}:Q4_0" in str(caught.value)


def test_pull_offline_error_is_immediate(
    hub_env: Path,
    tiny_repo: str,
    fake_hub: FakeHub,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["pull", f"{tiny_repo}:F16", "--json"]) == 1
    error = json.loads(capsys.readouterr().err)["error"]
    assert error["type"] == "HubError" and "HF_HUB_OFFLINE" in error["message"]
    assert main(["search", "tiny"]) == 1
    assert "HF_HUB_OFFLINE is set" in capsys.readouterr().err
    assert fake_hub.requests() == []


def test_quantize_cli(
    tmp_path: Path, quant_files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "Tiny-F16.gguf"
    shutil.copy(quant_files["F16"], source)
    record = _json(capsys, ["quantize", str(source), "--to", "q8_0", "--json"])
    assert record["quant"] == "Q8_0" and Path(record["target"]) == tmp_path / "Tiny-Q8_0.gguf"
    assert main(["quantize", str(source), "--to", "Q9_9"]) == 1
    assert "cannot quantize to 'Q9_9'" in capsys.readouterr().err
