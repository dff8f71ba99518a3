"""The real agent clients (Claude Code, Codex CLI, OpenCode) against a real ``homelab serve``.

Each client runs non-interactively, twice (a first turn, then a second that continues the
session), with the README's configuration, on the shipped trained demo model (its text means
little, but it ends its turns, so every client completes them). What is checked: the client
exits 0 and reports a completed turn in its own output, every request it made was answered
200 (the server's request log says so, route by route), and the second turn was mostly read
from the prompt cache.

The clients are npm packages that CI does not install; each test skips, saying so, when its
binary is missing. Install them outside the repository and point ``HOMELAB_CLIENTS_DIR`` at
the prefix (or put the binaries on PATH)::

    npm install --prefix /tmp/clients @anthropic-ai/claude-code
    npm install --prefix /tmp/clients @openai/codex
    npm install --prefix /tmp/clients opencode-ai
    HOMELAB_CLIENTS_DIR=/tmp/clients .venv/bin/pytest tests/server/test_real_clients.py -v

Each client also runs once as ``homelab launch CLIENT`` sets it up (its files and
environment as the launch writes them). Last run: 2026-12-05, Claude Code 2.1.197, Codex CLI
0.171.0, OpenCode 1.18.33 — 6 passed in 341 s on the 2-core machine under load.

Nothing here needs the internet: telemetry, update checks and model-list fetches are off.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

CLIENT_TIMEOUT_S = 240  # one client turn (its whole run); the first prompt is read cold
SERVER_START_S = 60
CTX = 32768  # per request: Codex's and OpenCode's prompts are ~11-12K tokens here
LOG_LINE = re.compile(
    r"homelab\.server: (?P<method>[A-Z]+) (?P<route>\S+) (?P<status>\d{3}) tenant=\S+ "
    r"prompt=(?P<prompt>\d+) cached=(?P<cached>\d+) completion=(?P<completion>\d+)"
)
GENERATION = ("/v1/messages", "/v1/responses", "/v1/chat/completions")


CLIENTS = ("claude", "codex", "opencode")


def installed(name: str) -> Path | None:
    """The client's executable: under $HOMELAB_CLIENTS_DIR/node_modules/.bin, else on PATH."""
    prefix = os.environ.get("HOMELAB_CLIENTS_DIR")
    if prefix and (Path(prefix) / "node_modules" / ".bin" / name).exists():
        return Path(prefix) / "node_modules" / ".bin" / name
    found = shutil.which(name)
    return Path(found) if found else None


def not_installed(name: str) -> str:
    prefix = os.environ.get("HOMELAB_CLIENTS_DIR")
    where = f"neither in {prefix}/node_modules/.bin nor on PATH" if prefix else "not on PATH"
    return (
        f"`{name}` is {where} (CI does not install the clients): `npm install --prefix DIR` "
        "it and set HOMELAB_CLIENTS_DIR=DIR, see this module's docstring"
    )


def client_binary(name: str) -> Path:
    path = installed(name)
    if path is None:
        pytest.skip(not_installed(name))
    return path


@dataclass(frozen=True)
class Logged:
    method: str
    route: str
    status: int
    prompt: int
    cached: int


class Serve:
    """``homelab serve demo:trained`` with the README's aliases, in a subprocess."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.log_path = home / "serve.log"
        env = {**os.environ, "HOMELAB_HOME": str(home)}
        homelab = [sys.executable, "-m", "homelab.cli"]
        made = subprocess.run(
            [*homelab, "serve", "--new-key", "clients", "--json"],
            env=env, capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        self.key: str = json.loads(made.stdout)["api_key"]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [
            "serve", "demo:trained", "--model-id", "local", "--port", str(self.port),
            "--alias", "claude-*=local", "--alias", "gpt-*=local",
            "--ctx", str(CTX), "--parallel", "2", "--default-max-tokens", "512",
        ]  # fmt: skip
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [*homelab, *args], env=env, stdout=self._log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + SERVER_START_S
        while not self.healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"homelab serve did not start:\n{self.log_path.read_text()}")
            time.sleep(0.5)

    def healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def requests(self) -> list[Logged]:
        return [
            Logged(m["method"], m["route"], int(m["status"]), int(m["prompt"]), int(m["cached"]))
            for m in LOG_LINE.finditer(self.log_path.read_text())
        ]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        self._log.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    if not any(installed(name) for name in CLIENTS):  # start no server for tests that skip
        pytest.skip(not_installed(", ".join(CLIENTS)))
    server = Serve(tmp_path_factory.mktemp("serve"))
    yield server
    server.stop()


def run_client(
    command: list[str | Path], cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """One client run, bounded; only PATH is kept from this environment (plus ``env``)."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd.parent)}
    try:
        return subprocess.run(
            [str(part) for part in command], cwd=cwd, env={**base, **env},
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{command[0]} did not finish in {CLIENT_TIMEOUT_S} s: {exc.stderr!r:.2000}")


def turn(
    serve: Serve, command: list[str | Path], cwd: Path, env: dict[str, str]
) -> tuple[list[Logged], str]:
    """Run one client turn: the requests it made as the server logged them (every one
    answered 200), and the client's stdout."""
    before = len(serve.requests())
    done = run_client(command, cwd, env)
    output = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"rc {done.returncode}\n{output}"
    made = serve.requests()[before:]
    # Claude Code's HEAD / carries no key: a connection warm-up whose answer it does not read;
    # `homelab launch` asks /api/version without one: does this server take keyless requests?
    probes = {("HEAD", "other"), ("GET", "/api/version")}
    failed = [r for r in made if r.status != 200 and (r.method, r.route) not in probes]
    assert not failed, f"{failed}\n{output}"
    assert any(r.route in GENERATION for r in made), f"{made}\n{output}"
    return made, done.stdout


def largest(made: list[Logged], route: str) -> Logged:
    return max((r for r in made if r.route == route), key=lambda r: r.prompt)


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def client_home(tmp_path: Path) -> Path:
    """A fresh HOME with a work folder (the client's project directory) in it."""
    work = tmp_path / "home" / "work"
    work.mkdir(parents=True)
    return work


def test_claude_code(serve: Serve, tmp_path: Path) -> None:
    claude = client_binary("claude")
    work = client_home(tmp_path)
    env = {
        "ANTHROPIC_BASE_URL": serve.url,
        "ANTHROPIC_AUTH_TOKEN": serve.key,
        "CLAUDE_CONFIG_DIR": str(tmp_path / "claude-config"),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # no telemetry, update or quota calls
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096",
    }
    # the Agent tool brings its mid-conversation system message; fewer tools, a shorter prompt
    ask = ["--output-format", "json", "--tools", "Agent,Bash,Read"]  # --tools takes a list
    results = []
    for prompt, more in (("Say hello", []), ("Now say goodbye", ["--continue"])):
        made, stdout = turn(serve, [claude, "-p", prompt, *more, *ask], work, env)
        assert [r.route for r in made if r.method == "POST"] == ["/v1/messages"]
        result = json.loads(stdout)
        assert result["type"] == "result" and result["is_error"] is False, result
        assert result["stop_reason"] == "end_turn" and result["api_error_status"] is None
        assert result["usage"]["input_tokens"] + result["usage"]["cache_read_input_tokens"] > 1000
        results.append(result)
    assert results[0]["session_id"] == results[1]["session_id"]  # --continue: the same session


def test_codex(serve: Serve, tmp_path: Path) -> None:
    codex = client_binary("codex")
    work = client_home(tmp_path)
    codex_home = tmp_path / "codex-home"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        'model = "local"\n'
        'model_provider = "homelab"\n'
        "[model_providers.homelab]\n"
        'name = "homelab"\n'
        f'base_url = "{serve.url}/v1"\n'
        'env_key = "HOMELAB_API_KEY"\n'
        'wire_api = "responses"\n'
    )
    env = {"CODEX_HOME": str(codex_home), "HOMELAB_API_KEY": serve.key}
    first, again = ["Say hello"], ["resume", "--last", "Say it again"]
    for words in (first, again):
        made, stdout = turn(
            serve, [codex, "exec", "--json", "--skip-git-repo-check", *words], work, env
        )
        assert {r.route for r in made if r.method == "POST"} == {"/v1/responses"}
        events = json_lines(stdout)
        kinds = [event["type"] for event in events]
        assert "turn.failed" not in kinds and kinds[-1] == "turn.completed", stdout
        assert any(e.get("item", {}).get("type") == "agent_message" for e in events), stdout
        if words is again:  # the first turn, its reply and the new message: read from the cache
            second = largest(made, "/v1/responses")
            assert second.cached >= 0.95 * second.prompt, second
            # Codex adds up the thread's turns; its cached count comes from the server's
            assert events[-1]["usage"]["cached_input_tokens"] >= second.cached


def launched(
    serve: Serve, client: str, work: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[list[Logged], str]:
    """One turn of ``client`` as ``homelab launch CLIENT --url … -- ARGS`` sets it up and
    starts it (the client's own files and environment: what the launch writes)."""
    binary = client_binary(client)
    env = {"HOMELAB_HOME": str(serve.home), "PATH": f"{binary.parent}:{os.environ['PATH']}"} | (
        env or {}
    )
    launch = [sys.executable, "-m", "homelab.cli", "launch", client, "--url", serve.url]
    made, stdout = turn(serve, [*launch, "--api-key", serve.key, "--", *args], work, env)
    assert next(r.route for r in made if r.method == "POST") == "/api/show"  # the context
    return made, stdout


def test_codex_as_homelab_launch_sets_it_up(serve: Serve, tmp_path: Path) -> None:
    """The profile file and the model catalog this Codex accepts (it refuses a catalog entry
    it cannot parse), and the turn it starts completes."""
    work = client_home(tmp_path)
    made, stdout = launched(serve, "codex", work, "exec", "--json", "--skip-git-repo-check", "Hi")
    assert {r.route for r in made if r.method == "POST"} == {"/api/show", "/v1/responses"}
    kinds = [event["type"] for event in json_lines(stdout)]
    assert "turn.failed" not in kinds and kinds[-1] == "turn.completed", stdout
    catalog = work.parent / ".codex" / "homelab-models.json"
    check = [client_binary("codex"), "debug", "models", "-c", f'model_catalog_json="{catalog}"']
    listed = run_client(check, work, {})
    assert listed.returncode == 0, listed.stderr[-2000:]
    (entry,) = json.loads(listed.stdout)["models"]
    assert (entry["slug"], entry["context_window"]) == ("local", CTX)
    assert entry["base_instructions"]  # the installed Codex's own instructions


def test_opencode_as_homelab_launch_sets_it_up(serve: Serve, tmp_path: Path) -> None:
    work = client_home(tmp_path)
    home = work.parent
    env = {  # OpenCode's own folders in this HOME; no update check, no models.dev
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
    }
    made, stdout = launched(serve, "opencode", work, "run", "--format", "json", "Hi", env=env)
    assert {r.route for r in made if r.method == "POST"} == {"/api/show", "/v1/chat/completions"}
    finished = [e for e in json_lines(stdout) if e["type"] == "step_finish"]
    assert finished and finished[-1]["part"]["reason"] in ("stop", "length"), stdout


def test_claude_code_as_homelab_launch_sets_it_up(serve: Serve, tmp_path: Path) -> None:
    work = client_home(tmp_path)
    env = {"CLAUDE_CONFIG_DIR": str(tmp_path / "claude-config")}
    ask = ("-p", "Hi", "--output-format", "json", "--tools", "Agent,Bash,Read")
    made, stdout = launched(serve, "claude", work, *ask, env=env)
    assert {r.route for r in made if r.method == "POST"} == {"/api/show", "/v1/messages"}
    result = json.loads(stdout)
    assert result["type"] == "result" and result["is_error"] is False, result


def test_opencode(serve: Serve, tmp_path: Path) -> None:
    opencode = client_binary("opencode")
    work = client_home(tmp_path)
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "homelab": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "homelab",
                "options": {"baseURL": f"{serve.url}/v1", "apiKey": "{env:HOMELAB_API_KEY}"},
                "models": {"local": {"name": "local", "limit": {"context": CTX, "output": 512}}},
            }
        },
    }
    (work / "opencode.json").write_text(json.dumps(config))
    home = work.parent
    env = {
        "HOMELAB_API_KEY": serve.key,
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",  # no models.dev: the provider is all in the config
    }
    ask: list[str | Path] = [opencode, "run", "--format", "json", "-m", "homelab/local"]
    for words in (["Say hello"], ["--continue", "Now say goodbye"]):
        made, stdout = turn(serve, [*ask, *words], work, env)
        assert {r.route for r in made if r.method == "POST"} == {"/v1/chat/completions"}
        finished = [e for e in json_lines(stdout) if e["type"] == "step_finish"]
        assert finished and finished[-1]["part"]["reason"] in ("stop", "length"), stdout
        if "--continue" in words:  # its cache.read is the server's cached_tokens
            second = largest(made, "/v1/chat/completions")
            assert second.cached >= 0.95 * second.prompt, second
            assert finished[-1]["part"]["tokens"]["cache"]["read"] == second.cached
