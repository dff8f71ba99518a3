"""The TUI's default model is the trained demo model, and its chat answer is made of words
(real llama.cpp; only the hardware is faked)."""

from __future__ import annotations

import time

from textual.pilot import Pilot
from trained_words import word_share
from tui_fakes import FakeHardware

from homelab.gguf.demo import trained_model_path
from homelab.tui import services
from homelab.tui.app import make_app
from homelab.tui.widgets.chat import ChatPanel

WAIT_S = 120.0


async def wait_until(pilot: Pilot[None], condition, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


def test_default_model_is_the_trained_one() -> None:
    assert services.demo_choice().path == trained_model_path("F16")


async def test_default_models_answer_shows_real_words(cpu_machine: FakeHardware) -> None:
    app = make_app(
        hardware_provider=cpu_machine, frozen_live=True, chat_max_tokens=40, chat_temperature=0
    )
    async with app.run_test(size=(160, 48)) as pilot:
        chat = app.screen.query_one(ChatPanel)
        await pilot.press("i", *"Return the value", "enter")
        await wait_until(pilot, lambda: len(chat.history) == 2, "the answer")
        answer = str(chat.history[1]["content"])
        head = answer.strip()[:20]
        assert head, "empty answer"
        await wait_until(
            pilot,
            lambda: any(head in m.text for m in chat.query("ChatMessage")),
            "the answer shown in the chat",
        )
        n_words, share = word_share(answer)
        assert n_words >= 5, answer
        assert share >= 0.8, f"{share:.0%} real words in {answer!r}"
