"""The model picker: local files, catalogue models and the demo, each with a planner fit badge;
and the default model (first local model, else the demo)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_hub import FakeHub
from textual.pilot import Pilot
from textual.widgets import DataTable, Input
from tui_fakes import FakeHardware

from homelab.gguf.demo import TRAINED_DIR
from homelab.tui.app import HomelabApp, make_app
from homelab.tui.screens.error import ErrorScreen
from homelab.tui.screens.picker import ModelPicker
from homelab.tui.services import choose_model


async def wait_until(pilot: Pilot[None], condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)


@pytest.fixture
def model_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lone_demo_model: Path) -> Path:
    """A library folder holding one GGUF with an ordinary name (the demo's weights)."""
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copyfile(lone_demo_model, folder / "my-little-model-F16.gguf")
    monkeypatch.setenv("HOMELAB_MODEL_DIRS", str(folder))
    return folder


def test_without_local_models_the_default_is_the_trained_demo() -> None:
    choice = choose_model(None)
    assert choice.is_demo and choice.runnable
    assert choice.path is not None and choice.path.parent == TRAINED_DIR
    assert "trained on Python's documentation" in choice.title
    assert "random weights" not in choice.title


def test_a_random_weight_demo_says_so() -> None:
    choice = choose_model("demo:llama:tiny")
    assert choice.is_demo and "demo model, random weights" in choice.title


def test_the_first_local_model_is_the_default(model_folder: Path) -> None:
    choice = choose_model(None)
    assert choice.kind == "local"
    assert choice.path == model_folder / "my-little-model-F16.gguf"


async def badges_shown(app: HomelabApp, pilot: Pilot[None]) -> ModelPicker:
    await wait_until(pilot, lambda: app.plans.plan is not None, "the first plan")
    await pilot.press("ctrl+o")  # works wherever the focus is (on a wide screen: the prompt)
    picker = app.screen
    assert isinstance(picker, ModelPicker)
    await wait_until(
        pilot,
        lambda: bool(picker.choices) and len(picker.badges) == len(picker.choices),
        "every fit badge",
    )
    return picker


async def test_picker_lists_every_kind_with_fit_badges(
    gpu_machine: FakeHardware, model_folder: Path
) -> None:
    app = make_app(None, hardware_provider=gpu_machine, frozen_live=True)
    async with app.run_test(size=(160, 48)) as pilot:
        picker = await badges_shown(app, pilot)
        kinds = {choice.kind for choice in picker.choices}
        assert {"local", "catalogue", "demo"} <= kinds
        labels = {c.label: picker.badges[c.ref].label for c in picker.choices}
        assert labels["my-little-model-F16"].startswith("fits with f16 KV at")
        assert labels["DeepSeek V3 0324"] == "does not fit"
        assert any(label.startswith("needs offload") for label in labels.values())


async def test_filter_and_pick_a_model_replans(cpu_machine: FakeHardware) -> None:
    app = make_app("demo:llama", hardware_provider=cpu_machine, frozen_live=True)
    async with app.run_test(size=(80, 24)) as pilot:
        picker = await badges_shown(app, pilot)
        picker.query_one("#picker-filter", Input).value = "qwen3 8b"
        await pilot.pause()
        assert picker.query_one(DataTable).row_count == 1
        first_plan = app.plans.plan
        await pilot.press("enter")
        assert not isinstance(app.screen, ModelPicker)
        choice = app.plans.choice
        assert choice is not None and choice.label == "Qwen3 8B"
        await wait_until(pilot, lambda: app.plans.plan is not first_plan, "the new plan")
        plan = app.plans.plan
        assert plan is not None and plan.model_name.lower().startswith("qwen3")
        await pilot.press("l")  # a catalogue model is not on disk: say how to get it
        await pilot.pause()
        assert "homelab pull" in str(app.screen.error)  # type: ignore[attr-defined]


def serve_catalogue_repo(fake_hub: FakeHub, ref: str, weights: Path) -> str:
    """Serve catalogue model ``ref``'s hub repo from the FakeHub (the real hub cannot be
    reached from the test machines): every quant file it lists, each holding ``weights``."""
    from homelab.gguf.catalogue import find_model

    entry = find_model(ref)
    data = weights.read_bytes()
    fake_hub.add_repo(
        entry.hf_repo,
        {
            "README.md": f"# {entry.hf_repo}\n".encode(),
            **{quant.file: data for quant in entry.quants},
        },
    )
    return entry.hf_repo


async def test_download_from_the_picker_then_plan_the_local_copy(
    cpu_machine: FakeHardware,
    lone_demo_model: Path,
    fake_hub: FakeHub,
    hub_env: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    repo_id = serve_catalogue_repo(fake_hub, "phi-4", lone_demo_model)
    size_bytes = lone_demo_model.stat().st_size
    shown: list[tuple[str, int, int]] = []
    real_show = ModelPicker.show_progress

    def record(self: ModelPicker, label: str, done: int, total: int) -> None:
        shown.append((label, done, total))
        real_show(self, label, done, total)

    monkeypatch.setattr(ModelPicker, "show_progress", record)
    app = make_app("demo:llama", hardware_provider=cpu_machine, frozen_live=True)
    async with app.run_test(size=(160, 48)) as pilot:
        picker = await badges_shown(app, pilot)
        quant = picker.badges["phi-4"].quant
        assert quant is not None
        picker.query_one("#picker-filter", Input).value = "phi-4"
        await pilot.pause()
        await pilot.press("d")
        await wait_until(
            pilot,
            lambda: (
                isinstance(app.screen, ErrorScreen)
                or (app.plans.choice is not None and app.plans.choice.label.startswith(repo_id))
            ),
            "the pull",
        )
        assert not isinstance(app.screen, ErrorScreen), app.screen.error  # type: ignore[attr-defined]
        assert not isinstance(app.screen, ModelPicker)
        # the real pull fetched the planned quant's file into the Hugging Face cache…
        choice = app.plans.choice
        assert choice is not None and choice.label == f"{repo_id}:{quant}"
        path = choice.path
        assert path is not None and path.name == f"phi-4-{quant}.gguf"
        assert path.resolve().is_relative_to(hub_env)
        assert path.read_bytes() == lone_demo_model.read_bytes()
        cdn_gets = fake_hub.requests("cdn", "GET")
        header_reads = [r for r in cdn_gets if r.range and r.range != "bytes=0-"]
        assert header_reads  # the plan was made from the remote header first…
        assert len(cdn_gets) - len(header_reads) == 1  # …then one file, in one piece
        # …and the picker showed its progress, up to the whole file, before closing
        assert shown and all(label == path.name for label, _, _ in shown)
        assert shown[-1] == (path.name, size_bytes, size_bytes)
        await wait_until(
            pilot,
            lambda: app.plans.plan is not None and app.plans.plan.model_source == str(path),
            "plan",
        )
