"""The model picker: local files, catalogue models and the demo, each with a planner fit badge;
and the default model (first local model, else the demo)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Input
from tui_fakes import FakeHardware

from homelab.tui.app import HomelabApp, make_app
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


def test_without_local_models_the_default_is_the_demo() -> None:
    choice = choose_model(None)
    assert choice.is_demo and choice.runnable
    assert "demo model, random weights" in choice.title


def test_the_first_local_model_is_the_default(model_folder: Path) -> None:
    choice = choose_model(None)
    assert choice.kind == "local"
    assert choice.path == model_folder / "my-little-model-F16.gguf"


async def badges_shown(app: HomelabApp, pilot: Pilot[None]) -> ModelPicker:
    await wait_until(pilot, lambda: app.plan is not None, "the first plan")
    await pilot.press("m")
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
    app = make_app("demo", hardware_provider=cpu_machine, frozen_live=True)
    async with app.run_test(size=(80, 24)) as pilot:
        picker = await badges_shown(app, pilot)
        picker.query_one("#picker-filter", Input).value = "qwen3 8b"
        await pilot.pause()
        assert picker.query_one(DataTable).row_count == 1
        first_plan = app.plan
        await pilot.press("enter")
        assert not isinstance(app.screen, ModelPicker)
        assert app.choice is not None and app.choice.label == "Qwen3 8B"
        await wait_until(pilot, lambda: app.plan is not first_plan, "the new plan")
        assert app.plan.model_name.lower().startswith("qwen3")
        await pilot.press("l")  # a catalogue model is not on disk: say how to get it
        await pilot.pause()
        assert "homelab pull" in str(app.screen.error)  # type: ignore[attr-defined]


class FakeHubPull:
    """Stands in for homelab.hub.pull.pull_by_name: the Hugging Face hub cannot be reached
    from the test machines. It reports progress in chunks like a download and "downloads"
    the demo model's weights into a folder, as the real pull leaves a file in the cache."""

    def __init__(self, source: Path, folder: Path) -> None:
        self.source = source
        self.folder = folder
        self.names: list[str] = []

    def __call__(self, name: str, *, progress: object) -> object:
        from homelab.hub.pull import PulledModel

        self.names.append(name)
        repo_id, quant = name.split(":")
        total = self.source.stat().st_size
        progress.start(f"{repo_id} {quant}", total, 0)  # type: ignore[attr-defined]
        for _ in range(100):
            progress.advance(total // 100)  # type: ignore[attr-defined]
            time.sleep(0.002)
        progress.finish()  # type: ignore[attr-defined]
        target = self.folder / f"{repo_id.split('/')[-1]}-{quant}.gguf"
        shutil.copyfile(self.source, target)
        return PulledModel(repo_id, "0" * 40, quant, (target,), total, total, False, ())


async def test_download_from_the_picker_then_plan_the_local_copy(
    cpu_machine: FakeHardware,
    lone_demo_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_pull = FakeHubPull(lone_demo_model, tmp_path)
    monkeypatch.setattr("homelab.hub.pull.pull_by_name", fake_pull)
    shown: list[tuple[str, int, int]] = []
    real_show = ModelPicker.show_progress

    def record(self: ModelPicker, label: str, done: int, total: int) -> None:
        shown.append((label, done, total))
        real_show(self, label, done, total)

    monkeypatch.setattr(ModelPicker, "show_progress", record)
    app = make_app("demo", hardware_provider=cpu_machine, frozen_live=True)
    async with app.run_test(size=(160, 48)) as pilot:
        picker = await badges_shown(app, pilot)
        picker.query_one("#picker-filter", Input).value = "phi-4"
        await pilot.pause()
        await pilot.press("d")
        await wait_until(
            pilot, lambda: app.choice is not None and app.choice.kind == "local", "the pull"
        )
        assert fake_pull.names and fake_pull.names[0].endswith(":" + picker.badges["phi-4"].quant)
        assert not isinstance(app.screen, ModelPicker)
        assert shown and shown[0][0].startswith("bartowski/phi-4-GGUF")  # progress was shown
        await wait_until(
            pilot,
            lambda: app.plan is not None and app.plan.model_source == str(app.choice.path),
            "plan",
        )
