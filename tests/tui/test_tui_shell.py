"""The dashboard shell: hardware panel, pages on a small terminal, focus and keys, help,
palette, errors."""

from __future__ import annotations

import time

from textual.pilot import Pilot
from textual.widgets import Input, Static
from textual.widgets.input import Selection
from tui_fakes import FakeHardware

from homelab.errors import HomelabError
from homelab.tui.app import HomelabApp, make_app
from homelab.tui.screens.error import ErrorScreen
from homelab.tui.screens.help import HelpScreen
from homelab.tui.widgets.hardware import GpuView, HardwarePanel


async def wait_for_hardware(app: HomelabApp, pilot: Pilot[None]) -> HardwarePanel:
    """Poll (the 1 Hz sampling workers replace one another, so waiting for every worker to
    complete can meet a cancelled one)."""
    panel = app.screen.query_one(HardwarePanel)
    deadline = time.monotonic() + 60
    while panel.report is None:
        assert time.monotonic() < deadline, "timed out waiting for the hardware report"
        await pilot.pause(0.05)
    await pilot.pause()
    return panel


def text_of(widget: Static) -> str:
    return str(widget.render())


async def test_cpu_only_machine_says_so_with_the_reason(cpu_machine: FakeHardware) -> None:
    app = make_app("demo:llama", hardware_provider=cpu_machine, frozen_live=True)
    async with app.run_test(size=(80, 24)) as pilot:
        panel = await wait_for_hardware(app, pilot)
        no_gpu = text_of(panel.query_one("#no-gpu", Static))
        assert "No GPU" in no_gpu
        assert "NVML library not found" in no_gpu
        assert not panel.query(GpuView)
        assert "Fake 8-core" in text_of(panel.query_one("#host", Static))


async def test_fake_gpu_shows_vram_split_and_sensors(gpu_machine: FakeHardware) -> None:
    app = make_app("demo:llama", hardware_provider=gpu_machine, hardware_refresh_s=0.05)
    async with app.run_test(size=(160, 48)) as pilot:
        panel = await wait_for_hardware(app, pilot)
        await pilot.pause(0.3)
        view = panel.query_one(GpuView)
        legend = text_of(view.query_one(".legend", Static))
        assert "other processes 1.1 GiB" in legend
        assert "free 22.9 GiB" in legend
        assert "45 °C" in text_of(view.query_one(".gpu-title", Static))
        assert not panel.query_one("#no-gpu").display
        assert gpu_machine.samples >= 2  # refreshed on a timer, not once


async def test_small_terminal_shows_one_page_at_a_time(cpu_machine: FakeHardware) -> None:
    app = make_app("demo:llama", hardware_provider=cpu_machine, frozen_live=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert screen.has_class("-narrow")
        assert screen.query_one("#hardware").display and not screen.query_one("#chat").display
        assert app.focused is None  # the prompt is on another page: it must not take text
        await pilot.press("3")  # the chat page: typing goes to the prompt
        assert screen.query_one("#chat").display and not screen.query_one("#hardware").display
        prompt = screen.query_one("#prompt", Input)
        assert app.focused is prompt
        await pilot.press("escape")  # leave the box: letters are keys again
        assert app.focused is None
        await pilot.press("i")
        assert app.focused is prompt
        await pilot.press("1")  # typed, not a page switch
        assert prompt.value == "1" and screen.query_one("#chat").display
        await pilot.press("escape", "1")
        assert screen.query_one("#hardware").display and not screen.query_one("#chat").display


async def test_wide_terminal_shows_every_panel(cpu_machine: FakeHardware) -> None:
    app = make_app("demo:llama", hardware_provider=cpu_machine, frozen_live=True)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        assert not app.screen.has_class("-narrow")
        for panel in ("hardware", "live", "plan", "chat", "server"):
            assert app.screen.query_one(f"#{panel}").display
        assert app.focused is app.screen.query_one("#prompt")  # the chat is shown: type at once
        await pilot.resize_terminal(80, 24)  # now on pages, the chat's is not shown…
        await pilot.pause()
        assert not app.screen.query_one("#chat").display
        assert app.focused is None  # …and a hidden prompt must not keep the focus


async def test_keys_for_while_typing_leave_the_text_alone(cpu_machine: FakeHardware) -> None:
    """In the prompt, letters are text; F1 still opens the help, and ctrl+x (cancel, while an
    answer streams) is the prompt's own "cut" when nothing is being answered."""
    app = make_app("demo:llama", hardware_provider=cpu_machine, frozen_live=True)
    async with app.run_test(size=(160, 48)) as pilot:
        prompt = app.screen.query_one("#prompt", Input)
        assert app.focused is prompt
        await pilot.press(*"lsq?")
        assert prompt.value == "lsq?" and app.is_running and app.live.engine is None
        prompt.selection = Selection(0, 2)
        await pilot.press("ctrl+x")
        assert prompt.value == "q?" and app.clipboard == "ls"
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert app.focused is prompt  # back where the typing was


async def test_help_opens_and_closes(cpu_machine: FakeHardware) -> None:
    app = make_app("demo:llama", hardware_provider=cpu_machine, frozen_live=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_palette_lists_an_entry_for_every_action(cpu_machine: FakeHardware) -> None:
    app = make_app("demo:llama", hardware_provider=cpu_machine, frozen_live=True)
    async with app.run_test(size=(80, 24)):
        titles = {command.title for command in app.get_system_commands(app.screen)}
    for wanted in (
        "Pick a model",
        "Load / unload the model",
        "Start / stop the server",
        "Cancel the answer",
        "KV cache type: q8_0",
        "Context per slot: 8192",
        "Slots: 4",
        "Help",
    ):
        assert wanted in titles


async def test_a_bad_model_argument_opens_a_titled_error(cpu_machine: FakeHardware) -> None:
    app = make_app("/nowhere/missing.gguf", hardware_provider=cpu_machine, frozen_live=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, ErrorScreen)
        assert isinstance(app.screen.error, HomelabError)
        assert "missing.gguf" in str(app.screen.error)
        await pilot.press("escape")
        assert not isinstance(app.screen, ErrorScreen)
