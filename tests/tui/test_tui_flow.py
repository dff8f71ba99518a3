"""The whole dashboard flow on a generated demo model, driven through Pilot:

plan → change the KV type and see the plan follow → load (the loop keeps ticking) → chat with
live tok/s → cancel an answer → start the server, call it over HTTP, stop it; and a
newcomer's first words, typed at once, go to the model rather than to the keys.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Select, Static
from tui_fakes import FakeHardware

from homelab.tui import services
from homelab.tui.app import HomelabApp, make_app
from homelab.tui.screens.picker import ModelPicker
from homelab.tui.widgets.chat import ChatPanel
from homelab.tui.widgets.live import LivePanel
from homelab.tui.widgets.plan import PlanPanel

WAIT_S = 60.0


async def wait_until(pilot: Pilot[None], condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


def rendered(app: HomelabApp, selector: str) -> str:
    return str(app.screen.query_one(selector, Static).render())


async def planned(app: HomelabApp, pilot: Pilot[None]) -> None:
    await wait_until(pilot, lambda: app.plans.plan is not None, "the first plan")


def kv_type(app: HomelabApp) -> str | None:
    plan = app.plans.plan
    return None if plan is None else plan.settings.type_k


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_plan_follows_the_kv_knob_before_anything_loads(cpu_machine: FakeHardware) -> None:
    app = make_app("demo:llama", hardware_provider=cpu_machine, frozen_live=True)
    async with app.run_test(size=(160, 48)) as pilot:
        await planned(app, pilot)
        first = app.plans.plan
        assert "fits" in rendered(app, "#verdict").lower()
        assert "demo model, random weights" in rendered(app, "#model-line")
        select = app.screen.query_one("#knob-kv", Select)
        select.value = "q8_0"
        await wait_until(pilot, lambda: app.plans.plan is not first, "the re-plan")
        plan = app.plans.plan
        assert plan is not None and plan.settings.type_k == plan.settings.type_v == "q8_0"
        assert "q8_0" in rendered(app, "#settings-line")
        view = app.screen.query_one(PlanPanel).view
        assert view is not None
        chosen = [cells[0] for cells in view.capacity_rows if "chosen" in cells[3]]
        assert chosen == ["q8_0/q8_0"]  # the capacity table follows the knob
        assert app.live.engine is None  # planning never loads


async def test_a_model_that_does_not_fit_says_so_and_what_to_do(
    cpu_machine: FakeHardware,
) -> None:
    app = make_app("llama-3.3-70b", hardware_provider=cpu_machine, frozen_live=True)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, lambda: "✘" in rendered(app, "#verdict"), "the verdict")
        verdict = rendered(app, "#verdict")
        assert "Cannot plan" in verdict and "Nothing fits" in verdict and "needs" in verdict
        assert app.plans.plan is None
        assert "not downloaded" in rendered(app, "#model-line")


async def test_cycling_kv_type_with_a_key_replans(cpu_machine: FakeHardware) -> None:
    app = make_app("demo:llama", hardware_provider=cpu_machine, frozen_live=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await planned(app, pilot)
        assert app.focused is None  # the chat is on another page: letters are keys
        await pilot.press("k")  # auto -> f16
        await wait_until(pilot, lambda: kv_type(app) == "f16", "f16 plan")
        await pilot.press("k")  # f16 -> q8_0
        await wait_until(pilot, lambda: kv_type(app) == "q8_0", "q8_0 plan")
        assert app.screen.query_one("#knob-kv", Select).value == "q8_0"


async def test_load_chat_cancel_and_serve(
    cpu_machine: FakeHardware, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_load = services.load_engine
    ticks_during_load: list[int] = []

    def slow_load(*args: object) -> object:
        """The real load, made to last like a big model's: the UI must keep ticking."""
        ticks_during_load.append(app.chat.ticks)
        time.sleep(1.0)
        engine = real_load(*args)  # type: ignore[arg-type]
        ticks_during_load.append(app.chat.ticks)
        return engine

    monkeypatch.setattr(services, "load_engine", slow_load)
    app = make_app(
        "demo:llama",
        hardware_provider=cpu_machine,
        server_port=free_port(),
        chat_max_tokens=32,
        chat_temperature=0,  # greedy: a sampled answer could end at once (random weights)
    )
    async with app.run_test(size=(160, 48)) as pilot:
        await planned(app, pilot)

        # load (a key that works while the prompt has the focus): the event loop keeps
        # running (10 Hz UI timer) while the worker loads
        assert app.focused is app.chat.panel.prompt
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: app.live.engine is not None, "the model to load")
        first, last = ticks_during_load
        assert (
            last - first >= 2
        )  # ~10 over the 1 s load; a blocked loop gives 0 (4 seen under load)
        # predicted next to what llama.cpp really allocated
        await wait_until(pilot, lambda: "after load" in rendered(app, "#devices .legend"), "actual")
        assert "(predicted" in rendered(app, "#devices .legend")

        # chat: the answer streams and tok/s becomes non-zero
        chat = app.screen.query_one(ChatPanel)
        await pilot.press(*"hello", "enter")
        await wait_until(
            pilot, lambda: app.chat.answer is None and len(chat.history) == 2, "an answer"
        )
        assert chat.history[1]["role"] == "assistant" and chat.history[1]["content"]
        live = app.screen.query_one(LivePanel)
        await wait_until(
            pilot,
            lambda: live.latest is not None and live.latest.decode_tok_s > 0,
            "non-zero decode tok/s",
        )
        assert "tok/s" in str(app.screen.query_one("#decode-rate .rate-value", Static).render())

        # cancel: ctrl+x (ahead of the prompt's own "cut") or escape stops the answer
        app.chat.max_tokens = 4096  # long enough that the answer is still running
        for cancel in ("ctrl+x", "escape"):
            await pilot.press(*"tell me more", "enter", cancel)
            await wait_until(pilot, lambda: app.chat.answer is None, "the cancelled answer")
            assert "cancelled" in chat.query("ChatMessage").last().text
        assert not isinstance(app.screen, ModelPicker)  # the "m" of "me" was text

        # serve: start, call it with an HTTP client, see the request logged, stop
        await pilot.press("escape")  # leave the prompt box so 's' is a key, not text
        await pilot.press("s")
        await wait_until(pilot, lambda: app.serving.server is not None, "the server to start")
        assert app.serving.server is not None
        url = app.serving.server.url
        assert url in rendered(app, "#server-status") and "keys off" in rendered(
            app, "#server-status"
        )
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            models = await client.get("/models")
            assert models.status_code == 200
            reply = await client.post(
                "/chat/completions",
                json={
                    "model": models.json()["data"][0]["id"],
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 8,
                },
            )
            assert reply.status_code == 200
        log = app.screen.query_one("#request-log", DataTable)
        await wait_until(pilot, lambda: log.row_count >= 1, "the request log")
        await pilot.press("s")
        await wait_until(pilot, lambda: "stopped" in rendered(app, "#server-status"), "stop")
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/models", timeout=5)


async def test_unload_frees_the_model_and_reload_works(cpu_machine: FakeHardware) -> None:
    app = make_app("demo:llama", hardware_provider=cpu_machine)
    async with app.run_test(size=(80, 24)) as pilot:
        await planned(app, pilot)
        await pilot.press("l")
        await wait_until(pilot, lambda: app.live.engine is not None, "the load")
        first = app.live.engine
        await pilot.press("l")  # unload
        assert app.live.engine is None
        await wait_until(pilot, lambda: "No model loaded" in rendered(app, "#live-state"), "unload")
        await pilot.press("l")
        await wait_until(pilot, lambda: app.live.engine is not None, "the reload")
        assert app.live.engine is not first


async def test_asking_before_loading_loads_first(cpu_machine: FakeHardware) -> None:
    app = make_app("demo:llama", hardware_provider=cpu_machine, chat_max_tokens=8)
    async with app.run_test(size=(80, 24)) as pilot:
        await planned(app, pilot)
        chat = app.screen.query_one(ChatPanel)
        await pilot.press("i", *"hi", "enter")
        await wait_until(pilot, lambda: len(chat.history) == 2, "the answer after the load")
        assert app.live.engine is not None
        assert "Loading the model first" in chat.query("ChatMessage")[1].text


async def test_a_newcomers_first_words_reach_the_model(cpu_machine: FakeHardware) -> None:
    """At start the chat says "Type a prompt": typed at once (before the plan is even
    computed), "me" + Enter is a prompt — its "m" must not open the model picker."""
    app = make_app("demo:llama", hardware_provider=cpu_machine, chat_max_tokens=8)
    async with app.run_test(size=(160, 48)) as pilot:
        chat = app.screen.query_one(ChatPanel)
        assert app.focused is chat.prompt
        await pilot.press("m", "e", "enter")
        assert not any(isinstance(screen, ModelPicker) for screen in app.screen_stack)
        assert chat.prompt.value == ""  # submitted, not left in the box
        await wait_until(pilot, lambda: len(chat.history) == 2, "the answer to 'me'")
        assert chat.history[0] == {"role": "user", "content": "me"}
        assert chat.history[1]["role"] == "assistant"
        assert not any(isinstance(screen, ModelPicker) for screen in app.screen_stack)
