"""``python -m benchmarks.switch_bench``: how long a model switch takes, homelab vs llama.cpp.

    python -m benchmarks.switch_bench                  # the bench demo model, 6 switches
    python -m benchmarks.switch_bench --switches 10 --model path/to/model.gguf

Two copies of the model (``switch-a``, ``switch-b``) sit in a temporary library, and memory
holds only one: every request that names the other model is a switch — unload the loaded one,
plan, load, first token. Measured from the request sent to the first streamed token, for:

- ``homelab serve --models a,b --ram R``: R gives the planner room for one plan, not two, so
  the fleet evicts the idle model, plans the other for the memory left, loads it;
- ``llama-server --models-dir D --models-max 1`` (router mode, when the build has it): the
  router stops the loaded model's child server and starts one for the other;
- restarting ``llama-server -m``: stop the process, start one for the other model, wait for
  ``/health``, then the request (what a user without a router does).

Every contender gets the same context, slots and threads (the settings homelab's planner
chose). Reported: the median and worst switch, and the median first token without a switch
(the same model again). A harness, not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.llama_tools import HERE, build_tools, tool_path
from benchmarks.server_bench import free_port
from homelab.settings import Settings

PROMPT = "Write one word about memory."
NAMES = ("switch-a", "switch-b")
STARTUP_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Series:
    switches_s: list[float]
    warm_s: list[float]

    def row(self, name: str) -> str:
        switch, warm = statistics.median(self.switches_s), statistics.median(self.warm_s)
        return (
            f"| {name} | {switch * 1000:.0f} ms | {max(self.switches_s) * 1000:.0f} ms "
            f"| {warm * 1000:.0f} ms |"
        )


def first_token_s(url: str, model: str | None) -> float:
    """Seconds from sending a streamed chat request to its first content chunk."""
    body: dict[str, object] = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 4,
        "stream": True,
        "temperature": 0,
    }
    if model is not None:
        body["model"] = model
    started = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{model}: {response.status_code} {response.read()!r}")
        for line in response.iter_lines():
            if line.startswith("data: ") and line.strip() != "data: [DONE]":
                choices = json.loads(line[6:]).get("choices") or [{}]
                if (choices[0].get("delta") or {}).get("content"):
                    return time.perf_counter() - started
    return time.perf_counter() - started


@contextmanager
def process(command: list[str], url: str, log_path: Path, env: dict[str, str]) -> Iterator[None]:
    with log_path.open("ab") as log_file:
        proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        try:
            wait_healthy(proc, url)
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_healthy(proc: subprocess.Popen[bytes], url: str) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited early ({proc.returncode})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.args[0]} did not become healthy")
        time.sleep(0.02)


def alternate(
    url: str, names: tuple[str, str], switches: int, model_of: Callable[[str], str]
) -> Series:
    first_token_s(url, model_of(names[0]))  # load the first one: not a switch
    switch_times, warm_times = [], []
    for i in range(switches):
        name = model_of(names[(i + 1) % 2])
        switch_times.append(first_token_s(url, name))
        warm_times.append(first_token_s(url, name))
    return Series(switch_times, warm_times)


def planned(model: Path, args: argparse.Namespace) -> tuple[Settings, int]:
    """The settings homelab's planner picks and their bytes (the --ram that fits one copy)."""
    from homelab.models.launch import plan_file
    from homelab.models.ref import resolve
    from homelab.planner.search import PlanRequest

    plan = plan_file(resolve(str(model)), PlanRequest(goal="quality", ctx=args.ctx, parallel=1))
    return plan.settings, plan.memory.total_bytes


def measure_homelab(
    library: Path, ram: int, args: argparse.Namespace, env: dict[str, str]
) -> Series:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, "-m", "homelab.cli", "serve", "--port", str(port), "--ram", str(ram),
        "--models", ",".join(str(library / f"{n}-Q8_0.gguf") for n in NAMES),
        "--goal", "quality", "--ctx", str(args.ctx), "--parallel", "1",
        "--threads", str(args.threads), "--keep-alive", "-1",
    ]  # fmt: skip
    with process(command, url, HERE / "out" / "logs" / "switch-homelab.log", env):
        return alternate(url, NAMES, args.switches, lambda n: str(library / f"{n}-Q8_0.gguf"))


def llama_flags(settings: Settings, threads: int) -> list[str]:
    return [
        "-c", str(settings.n_ctx), "-np", "1", "-t", str(threads),
        "-fa", "on" if settings.flash_attn else "off", "-ctk", settings.type_k,
        "-ctv", settings.type_v, "--no-webui",
    ]  # fmt: skip


def measure_router(library: Path, settings: Settings, args: argparse.Namespace) -> Series | None:
    server = tool_path("llama-server")
    help_text = subprocess.run([str(server), "--help"], capture_output=True, text=True).stdout
    if "--models-dir" not in help_text:
        return None
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [str(server), "--host", "127.0.0.1", "--port", str(port)]
    command += ["--models-dir", str(library), "--models-max", "1"]
    command += llama_flags(settings, args.threads)
    with process(command, url, HERE / "out" / "logs" / "switch-router.log", dict(os.environ)):
        listed = httpx.get(url + "/v1/models", timeout=10).json()["data"]
        ids = {n: next(m["id"] for m in listed if m["id"].startswith(n)) for n in NAMES}
        return alternate(url, NAMES, args.switches, lambda n: ids[n])


def measure_restart(library: Path, settings: Settings, args: argparse.Namespace) -> Series:
    """Stop llama-server and start it on the other model, each switch."""
    server = tool_path("llama-server")
    log_path = HERE / "out" / "logs" / "switch-restart.log"

    def run(name: str) -> subprocess.Popen[bytes]:
        command = [str(server), "-m", str(library / f"{name}-Q8_0.gguf"), "--host", "127.0.0.1"]
        command += ["--port", str(port), *llama_flags(settings, args.threads)]
        with log_path.open("ab") as log_file:
            return subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    current = run(NAMES[0])
    wait_healthy(current, url)
    first_token_s(url, None)
    switches, warm = [], []
    try:
        for i in range(args.switches):
            started = time.perf_counter()
            current.terminate()
            current.wait(30)
            current = run(NAMES[(i + 1) % 2])
            wait_healthy(current, url)
            switches.append(time.perf_counter() - started + first_token_s(url, None))
            warm.append(first_token_s(url, None))
    finally:
        current.terminate()
        current.wait(30)
    return Series(switches, warm)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="GGUF (default: the bench demo, Q8_0)")
    parser.add_argument("--switches", type=int, default=6)
    parser.add_argument("--ctx", type=int, default=2048, help="context (2048)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    build_tools()
    if args.model is None:
        from homelab.gguf.demo import demo_model_path

        args.model = demo_model_path("llama", "bench", "Q8_0")
    settings, n_bytes = planned(args.model, args)
    from homelab.planner.budget import HOST_MARGIN_BYTES

    ram = HOST_MARGIN_BYTES + n_bytes * 3 // 2  # one plan fits, two do not
    (HERE / "out" / "logs").mkdir(parents=True, exist_ok=True)
    results: dict[str, Series] = {}
    with tempfile.TemporaryDirectory(prefix="switch-bench-") as tmp:
        library = Path(tmp) / "library"
        library.mkdir()
        for name in NAMES:
            shutil.copy(args.model, library / f"{name}-Q8_0.gguf")
        env = {**os.environ, "HOMELAB_HOME": str(Path(tmp) / "home")}
        env["HF_HUB_CACHE"] = str(Path(tmp) / "hf")
        log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
        log(f"model {args.model} · ctx {args.ctx} · planned {n_bytes} bytes · --ram {ram}")
        results["homelab serve (fleet)"] = measure_homelab(library, ram, args, env)
        router = measure_router(library, settings, args)
        if router is not None:
            results["llama-server router (--models-max 1)"] = router
        results["llama-server restart"] = measure_restart(library, settings, args)
    print(f"Model switch, {args.model.name}, ctx {args.ctx}, {args.threads} threads, "
          f"{args.switches} switches (request sent → first streamed token):\n")  # fmt: skip
    print("| server | switch p50 | switch worst | same model again p50 |")
    print("|---|---|---|---|")
    for name, series in results.items():
        print(series.row(name))
    out = HERE / "out" / f"switch-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({k: v.__dict__ for k, v in results.items()}, indent=2))
    log(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
