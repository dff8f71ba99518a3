"""The chat's image attach, driven through Pilot on the generated Gemma-3-like vision model:
``/image PATH`` shows the image's name, size, pixels and the tokens its projector gives it,
and the next prompt is answered with the image in it (its tokens in the prompt)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image
from textual.pilot import Pilot
from textual.widgets import Static
from tui_fakes import FakeHardware

from homelab.gguf import demo_vision
from homelab.tui.app import make_app
from homelab.tui.widgets.chat import ChatMessage

WAIT_S = 60.0


async def wait_until(pilot: Pilot[None], condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


@pytest.fixture
def picture(tmp_path: Path) -> Path:
    path = tmp_path / "cat.png"
    Image.new("RGB", (40, 30), (10, 200, 30)).save(path)
    return path


def notes(app: object) -> list[str]:
    return [m.text for m in app.screen.query(ChatMessage) if m.role == "note"]  # type: ignore[attr-defined]


async def test_attach_an_image_and_ask_about_it(cpu_machine: FakeHardware, picture: Path) -> None:
    app = make_app(
        "demo:vision-gemma3",
        hardware_provider=cpu_machine,
        frozen_live=True,
        chat_max_tokens=4,
        chat_temperature=0,
    )
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, lambda: app.plans.plan is not None, "the plan")
        plan = app.plans.plan
        assert plan is not None and plan.projector is not None  # found beside the model
        tokens = demo_vision.fixed_image_tokens("gemma3")
        settings = str(app.screen.query_one("#settings-line", Static).render())
        assert "vision on CPU" in settings and f"images = {tokens} tokens" in settings
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: app.live.engine is not None, "the model to load")

        await app.chat.send(f"/image {picture}")
        await wait_until(pilot, lambda: bool(app.chat.attachments), "the attachment")
        shown = notes(app)[-1]
        assert shown.startswith("attached cat.png · ")
        assert "40×30 px" in shown and f"{tokens} tokens" in shown

        await app.chat.send("What is this?")
        assert app.chat.attachments == [] and len(app.chat.panel.images) == 1
        await wait_until(pilot, lambda: app.chat.answer is None, "the answer")
        turn = app.chat.panel.history[-2]["content"]
        assert turn.endswith("What is this?") and app.live.engine.image_marker in turn

        await app.chat.send("/image /no/such/file.png")
        await wait_until(
            pilot, lambda: any("cannot read" in str(n) for n in app._notifications), "the error"
        )
