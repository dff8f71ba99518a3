"""The dashboard's views of speculative decoding, RPC workers and the served models, driven
through Pilot on the real app and a generated demo model:

* a speculating engine (``--spec ngram``) shows its acceptance rate and tokens per target
  step in the live panel; an engine that does not speculate shows no such line;
* ``--rpc`` with a real ``homelab worker`` on 127.0.0.1: the hardware panel lists the worker
  with its free memory, the plan puts part of the model on it, and the load goes through it;
* the server panel lists the model its server has loaded (planned and allocated memory) and
  unloads it (the button, or ``u``), which stops the server with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_tui_flow import free_port, planned, rendered, wait_until
from textual.widget import Widget
from tui_fakes import FakeHardware

from homelab.engine.speculation.config import SpeculationConfig
from homelab.tui.app import HomelabApp, make_app
from homelab.tui.widgets.live import LivePanel

REPEATING_PROMPT = "one two three four " * 12


def shown(app: HomelabApp, selector: str) -> bool:
    return bool(app.screen.query_one(selector, Widget).display)


async def test_live_panel_shows_speculation_acceptance(
    cpu_machine: FakeHardware, lone_demo_model: Path
) -> None:
    spec = SpeculationConfig("ngram", max_draft_tokens=4, adaptive=False).checked()
    app = make_app(
        str(lone_demo_model), hardware_provider=cpu_machine, chat_max_tokens=48, speculation=spec
    )
    async with app.run_test(size=(160, 48)) as pilot:
        await planned(app, pilot)
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: app.live.engine is not None, "the load")
        await pilot.press(*REPEATING_PROMPT, "enter")
        live = app.screen.query_one(LivePanel)
        await wait_until(
            pilot,
            lambda: live.latest is not None and live.latest.draft_tokens_total > 0,
            "drafted tokens",
        )
        await wait_until(pilot, lambda: app.chat.answer is None, "the answer")
        metrics = live.latest
        assert metrics is not None and metrics.speculation == "ngram"
        assert shown(app, "#live-spec") and live.spec_line.region.height == 1
        text = rendered(app, "#live-spec")
        assert "speculation ngram" in text and "tokens per target step" in text
        assert f"{metrics.accepted_draft_tokens_total:,} of " in text
        if metrics.acceptance_rate is not None:
            assert f"{metrics.acceptance_rate:.0%} of drafted tokens accepted" in text
        if metrics.tokens_per_target_step is not None:
            assert f"{metrics.tokens_per_target_step:.2f} tokens per target step" in text


# --- RPC workers ---------------------------------------------------------------------------


class Worker:
    """A real ``homelab worker`` on 127.0.0.1 (CPU device), as tests/llamacpp/rpc starts them."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "homelab.cli", "worker", "--port", str(self.port)]
        command += ["--device", "CPU", "--threads", "1"]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ
        )
        assert self.process.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("Use it with"):
                return
        self.stop()
        raise AssertionError(f"the worker did not start: {lines}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture
def rpc_worker() -> Iterator[Worker]:
    from homelab.llamacpp.rpc import available

    if not available():
        pytest.skip(
            "the installed llama-cpp-python has no RPC backend (build it with "
            'CMAKE_ARGS="-DGGML_RPC=on", as `make` does)'
        )
    worker = Worker()
    yield worker
    worker.stop()


async def test_rpc_worker_is_listed_and_planned_with(
    cpu_machine: FakeHardware, lone_demo_model: Path, rpc_worker: Worker
) -> None:
    """In this process: probing a worker is a plain connection (nothing is registered)."""
    from homelab.llamacpp.rpc import probe

    free = probe(rpc_worker.endpoint).devices[0].free_bytes
    app = make_app(
        str(lone_demo_model),
        hardware_provider=cpu_machine,
        frozen_live=True,
        rpc=(rpc_worker.endpoint,),
    )
    async with app.run_test(size=(160, 48)) as pilot:
        await planned(app, pilot)
        assert shown(app, "#rpc-workers")
        listed = rendered(app, "#rpc-workers")
        assert f"worker {rpc_worker.endpoint} · RPC0 · " in listed and " free" in listed
        # the free memory the worker reported (to the shown digit; it may move a little)
        shown_gib = float(listed.split(" · ")[2].split(" GiB")[0])
        assert abs(shown_gib - free / (1 << 30)) < 0.2

        plan = app.plans.plan
        assert plan is not None
        assert plan.settings.rpc_servers == (rpc_worker.endpoint,)
        remote = plan.memory.device(f"RPC0[{rpc_worker.endpoint}]")
        assert remote.weights_bytes > 0  # part of the model goes to the worker


def test_the_dashboard_loads_through_the_worker(lone_demo_model: Path, rpc_worker: Worker) -> None:
    """The load registers the worker process-wide, so it runs in a child (as the RPC tests do)."""
    import json

    child = Path(__file__).with_name("rpc_tui_child.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(child.parent), *sys.path])}
    result = subprocess.run(
        [sys.executable, str(child), str(lone_demo_model), rpc_worker.endpoint],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads(result.stdout.strip().splitlines()[-1])
    device = f"RPC0[{rpc_worker.endpoint}]"
    assert f"worker {rpc_worker.endpoint} · RPC0 · " in document["workers"]
    assert document["plan_rpc_servers"] == document["loaded_rpc_servers"] == [rpc_worker.endpoint]
    assert document["planned"][device] > 0
    assert document["allocated"].get(device, 0) > 0  # llama.cpp put weights on the worker


async def test_an_unreachable_worker_is_named(
    cpu_machine: FakeHardware, lone_demo_model: Path
) -> None:
    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens there
    app = make_app(
        str(lone_demo_model), hardware_provider=cpu_machine, frozen_live=True, rpc=(endpoint,)
    )
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, lambda: shown(app, "#rpc-workers"), "the worker line")
        assert f"worker {endpoint} · " in rendered(app, "#rpc-workers")
        await wait_until(pilot, lambda: endpoint in rendered(app, "#verdict"), "the plan's error")
        assert app.plans.plan is None


# --- the server's loaded models ------------------------------------------------------------


async def test_server_panel_lists_the_loaded_model_and_unloads_it(
    cpu_machine: FakeHardware, lone_demo_model: Path
) -> None:
    app = make_app(str(lone_demo_model), hardware_provider=cpu_machine, server_port=free_port())
    async with app.run_test(size=(160, 48)) as pilot:
        await planned(app, pilot)
        assert not shown(app, "#served")
        await pilot.press("ctrl+s")  # loads first, then serves
        await wait_until(pilot, lambda: app.serving.server is not None, "the server")
        server, engine, plan = app.serving.server, app.live.engine, app.plans.plan
        assert server is not None and engine is not None and plan is not None
        await pilot.pause()
        assert shown(app, "#served")
        listed = rendered(app, "#served-models")
        name = lone_demo_model.stem
        assert listed.startswith(f"loaded {name} · ")
        from homelab.units import format_size

        allocated = engine.load_report.buffers.total_bytes()
        assert f"planned {format_size(plan.memory.total_bytes, digits=1)}" in listed
        assert f"allocated {format_size(allocated, digits=1)}" in listed
        ids = httpx.get(f"{server.url}/models", timeout=10).json()["data"]
        assert [entry["id"] for entry in ids] == [name]  # what it lists is what it serves

        await pilot.click("#server-unload")
        await wait_until(pilot, lambda: app.live.engine is None, "the unload")
        await wait_until(pilot, lambda: "stopped" in rendered(app, "#server-status"), "stop")
        assert not shown(app, "#served") and app.serving.server is None
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{server.url}/models", timeout=5)

        # the key does the same
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: app.serving.server is not None, "the server again")
        await pilot.press("escape", "u")
        await wait_until(pilot, lambda: app.live.engine is None, "the unload by key")
        await wait_until(pilot, lambda: app.serving.server is None, "the server stopped")
