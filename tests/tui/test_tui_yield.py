"""Giving the GPU back from the dashboard (``y`` / ``ctrl+y`` / the palette), driven through
Pilot on the real app and a generated demo model: the model is closed with its conversation
saved in the dashboard's prompt cache, the live panel says why and lists the yield, the
running server holds its requests (``/health`` says yielded), the chat refuses to take the
GPU back unasked; resuming loads the model again and the conversation's next turn is
restored from the cache. The machine is the fixed CPU-only one (tui_fakes): no GPU here."""

from __future__ import annotations

import httpx
from test_tui_flow import free_port, planned, rendered, wait_until
from textual.message import Message
from textual.widget import Widget
from tui_fakes import FakeHardware

from homelab.tui.app import HomelabApp, make_app
from homelab.tui.messages import AnswerFinished
from homelab.tui.widgets.chat import ChatPanel


def footer_key(app: HomelabApp, key: str) -> Widget | None:
    """The footer's entry for ``key`` (Textual's FooterKey, by its CSS type name), once the
    footer shows it."""
    return next((k for k in app.screen.query("FooterKey") if getattr(k, "key", "") == key), None)


def yield_key_shown(app: HomelabApp, enabled: bool) -> bool:
    key = footer_key(app, "ctrl+y")
    return key is not None and key.has_class("-disabled") != enabled


LONG_PROMPT = "Tell me about the garden behind the old house, please. " * 30  # > 256 tokens


async def test_yield_and_resume_from_the_dashboard(cpu_machine: FakeHardware) -> None:
    finished: list[AnswerFinished] = []

    def hook(message: Message) -> None:
        if isinstance(message, AnswerFinished):
            finished.append(message)

    app = make_app(
        "demo:llama",
        hardware_provider=cpu_machine,
        server_port=free_port(),
        chat_max_tokens=4,
        chat_temperature=0,
    )
    async with app.run_test(size=(160, 48), message_hook=hook) as pilot:
        await planned(app, pilot)
        chat = app.screen.query_one(ChatPanel)
        await wait_until(pilot, lambda: yield_key_shown(app, False), "ctrl+y dim: nothing loaded")
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: app.live.engine is not None, "the load")
        await wait_until(pilot, lambda: yield_key_shown(app, True), "ctrl+y lit")
        assert getattr(footer_key(app, "ctrl+y"), "description", "") == "Yield"
        chat.prompt.value = LONG_PROMPT
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(finished) == 1, "the first answer")
        first = finished[0].finish
        assert first is not None and first.stats is not None
        await pilot.press("escape", "s")  # leave the prompt box; start the server
        await wait_until(pilot, lambda: app.serving.server is not None, "the server")
        url = app.serving.server.url.removesuffix("/v1")  # type: ignore[union-attr]

        await pilot.press("y")
        await wait_until(pilot, lambda: app.live.engine is None and app.live.yielded, "yield")
        await wait_until(pilot, lambda: "yielded:" in rendered(app, "#live-state"), "shown")
        assert "asked from the dashboard" in rendered(app, "#live-state")
        event = app.live.yielding.current  # type: ignore[union-attr]
        assert event is not None and event.cause == "asked" and event.saved_states >= 1
        assert event.saved_bytes > 0 and event.planned_bytes > 0
        assert "yield (asked)" in rendered(app, "#live-yields")
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            health = (await http.get("/health")).json()
            assert health["status"] == "yielded" and health["yield"]["cause"] == "asked"
        assert "yielded" in rendered(app, "#served-models")

        await pilot.press("i", *"more", "enter")  # the chat does not take the GPU back
        assert chat.prompt.value == "more" and app.live.engine is None
        assert "y (ctrl+y) resumes" in chat.query("ChatMessage").last().text

        resume = next(c for c in app.get_system_commands(app.screen) if "Yield" in c.title)
        resume.callback()  # the palette's entry, as ctrl+p would run it
        await wait_until(pilot, lambda: app.live.engine is not None, "the resume")
        assert not app.live.yielded
        await wait_until(pilot, lambda: "resumed in" in rendered(app, "#live-yields"), "listed")
        assert "●" in rendered(app, "#live-state")

        chat.prompt.value = LONG_PROMPT[:-1] + " And then?"  # the next turn of the same chat
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(finished) == 2, "the answer after the resume")
        again = finished[1].finish
        assert again is not None and again.stats is not None
        assert again.stats.cached_tokens >= 0.9 * first.stats.prompt_tokens  # from the cache
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            body = {"model": app.live.served_name, "prompt": "hi", "max_tokens": 2}
            assert (await http.post("/v1/completions", json=body)).status_code == 200


async def test_yield_and_resume_with_no_server_running(cpu_machine: FakeHardware) -> None:
    """Without a server the controller runs on a loop of its own, in the worker's thread."""
    app = make_app("demo:llama", hardware_provider=cpu_machine, chat_max_tokens=4)
    async with app.run_test(size=(160, 48)) as pilot:
        await planned(app, pilot)
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: app.live.engine is not None, "the load")
        first = app.live.engine
        await pilot.press("ctrl+y")  # works while the prompt has the focus
        await wait_until(pilot, lambda: app.live.yielded and app.live.engine is None, "yield")
        app.live.load()  # a load (what a prompt or the server would start) is refused
        await pilot.pause(0.2)
        assert app.live.engine is None and app.live.yielded
        await pilot.press("ctrl+y")
        await wait_until(pilot, lambda: app.live.engine is not None, "the resume")
        assert app.live.engine is not first and not app.live.yielded
        assert app.live.yielding is not None and len(app.live.yielding.history) == 1
