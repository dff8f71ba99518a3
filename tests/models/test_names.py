"""Library names: short, derived from the disk alone, distinct when files share a name — and
each one runs through `homelab run`."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_hub import FakeHub

from homelab.cli import main
from homelab.errors import ModelFileError
from homelab.hub.library import library_base, list_local_models
from homelab.hub.pull import pull_by_name
from homelab.models.ref import resolve


@pytest.mark.parametrize(
    ("file", "repo", "base"),
    [
        ("Qwen_Qwen3-8B-Q4_K_M.gguf", "bartowski/Qwen_Qwen3-8B-GGUF", "qwen3-8b"),
        ("google_gemma-3-12b-it-Q4_K_M.gguf", "bartowski/google_gemma-3-12b-it-GGUF",
         "gemma-3-12b-it"),
        ("Meta-Llama-3.1-8B-Instruct-Q8_0.gguf", None, "meta-llama-3.1-8b-instruct"),
        ("Qwen3-8B-UD-Q4_K_XL.gguf", "unsloth/Qwen3-8B-GGUF", "qwen3-8b"),
        ("model.q8_0.gguf", "someone/Foo-Bar-GGUF", "foo-bar"),  # the file name says nothing
        ("my_model-Q8_0.gguf", None, "my_model"),  # an underscore alone is not an org prefix
        ("Big-Q4_K_M-00001-of-00003.gguf", "org/Big-GGUF", "big"),
        ("weird name@v2:x-Q4_0.gguf", None, "weird-name-v2-x"),  # no ':', '@' or '/' inside
    ],
)  # fmt: skip
def test_library_base(file: str, repo: str | None, base: str) -> None:
    assert library_base(Path(file), repo) == base


@pytest.fixture
def namesakes(
    hub_env: Path,
    own_home: Path,
    fake_hub: FakeHub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    demo_model: Callable[..., Path],
) -> dict[str, Path]:
    """Four library folders and two hub repos, all holding a file called Tiny-<QUANT>."""
    q8, q4 = demo_model("llama", "tiny", "Q8_0"), demo_model("llama", "tiny", "Q4_0")
    folders = [tmp_path / "a" / "models", tmp_path / "b" / "models", tmp_path / "shelf"]
    folders.append(tmp_path / "c" / "models")
    for folder in folders:
        folder.mkdir(parents=True)
        shutil.copy(q8, folder / "Tiny-Q8_0.gguf")
    monkeypatch.setenv("HOMELAB_MODEL_DIRS", ":".join(str(f) for f in folders))
    for org in ("org-b", "org-a"):
        fake_hub.add_repo(f"{org}/Tiny-GGUF", {"Tiny-Q4_0.gguf": q4})
    hub = {org: pull_by_name(f"{org}/Tiny-GGUF:Q4_0").path for org in ("org-b", "org-a")}
    return {
        "tiny:Q8_0": folders[0] / "Tiny-Q8_0.gguf",  # the first in order keeps the name
        "tiny@models:Q8_0": folders[1] / "Tiny-Q8_0.gguf",  # then the folder's name
        "tiny@shelf:Q8_0": folders[2] / "Tiny-Q8_0.gguf",
        "tiny@models-2:Q8_0": folders[3] / "Tiny-Q8_0.gguf",  # and a number
        "tiny:Q4_0": hub["org-a"],  # the cache by repo: org-a before org-b
        "tiny@org-b:Q4_0": hub["org-b"],  # a hub file is told apart by its org
    }


def test_namesakes_get_distinct_names_deterministically(
    namesakes: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    demo_model: Callable[..., Path],
) -> None:
    names = {m.name: m.path for m in list_local_models()}
    assert names == namesakes
    assert {m.name: m.path for m in list_local_models()} == names  # the same on every call
    # a namesake added later in the order leaves the names already given alone
    late = tmp_path / "late"
    late.mkdir()
    shutil.copy(demo_model("llama", "tiny", "Q8_0"), late / "tiny-q8_0.gguf")
    monkeypatch.setenv("HOMELAB_MODEL_DIRS", f"{os.environ['HOMELAB_MODEL_DIRS']}:{late}")
    after = {m.name: m.path for m in list_local_models()}
    assert after == {**names, "tiny@late:Q8_0": late / "tiny-q8_0.gguf"}
    # every model also answers to its qualified name; a bare name shared by several is refused
    first = resolve("tiny@org-a:Q4_0")
    assert first.local_path() == namesakes["tiny:Q4_0"]
    with pytest.raises(ModelFileError, match="several local models have this name") as caught:
        resolve("tiny")
    assert "tiny@org-b:Q4_0" in str(caught.value)


def test_each_name_homelab_models_lists_runs_its_own_file(
    namesakes: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "--no-fit", "--json"]) == 0
    listed = {m["name"]: Path(m["path"]) for m in json.loads(capsys.readouterr().out)["models"]}
    assert listed == namesakes
    for name, path in listed.items():
        code = main(
            ["run", name, "--prompt", "hi", "--max-tokens", "2", "--threads", "1",
             "--ctx", "256", "--json"]
        )  # fmt: skip
        captured = capsys.readouterr()
        assert code == 0, (name, captured.err)
        assert json.loads(captured.out)["load"]["path"] == str(path), name


def test_models_says_how_each_fits_now(
    own_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    demo_model: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    from homelab.planner.plan import plan_model

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    folder = tmp_path / "library"
    folder.mkdir()
    shutil.copy(demo_model("llama", "tiny", "Q8_0"), folder / "Mine-Q8_0.gguf")
    monkeypatch.setenv("HOMELAB_MODEL_DIRS", str(folder))
    assert main(["models", "--json"]) == 0
    (model,) = json.loads(capsys.readouterr().out)["models"]
    plan = plan_model(resolve("mine:Q8_0").variants()[:1], verify=False)  # the planner's answer
    fit = model["fit"]
    assert fit["fits"] and fit["n_ctx_per_slot"] == plan.settings.n_ctx_per_slot
    k, v = plan.settings.type_k, plan.settings.type_v
    assert fit["kv"] == (k if k == v else f"{k}/{v}")
    assert fit["placement"] in ("CPU", "all on GPU")
    assert model["name"] == "mine:Q8_0" and model["path"] == str(folder / "Mine-Q8_0.gguf")
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    header, row = text.splitlines()[:2]
    assert header.split() == ["NAME", "QUANT", "SIZE", "ARCH", "PARAMS", "FITS", "NOW", "WHERE"]
    assert row.startswith("mine:Q8_0 ") and f"KV {fit['kv']}" in row and str(folder) in row
    assert 'homelab run mine:Q8_0 --prompt "hi"' in text
