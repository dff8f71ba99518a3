"""``homelab launch``: what it prints, and what each client receives when it runs.

The clients themselves are not installed here: a stub of each (``claude``, ``codex``,
``opencode``, ``open-webui``) stands first on PATH — a tiny script that records its arguments,
its environment and the configuration file the real client reads at start (Codex's
profile ``$CODEX_HOME/homelab.config.toml`` (``~/.codex``), OpenCode's ``$OPENCODE_CONFIG``), then
asks the server for its models the way that configuration says (base URL, key) and records the
answer. ``homelab launch`` runs in a child process with HOME and HOMELAB_HOME in a temporary
folder, against a real server on the tiny demo model, or against one it starts itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from homelab.engine.engine import Engine
from homelab.lock import read_server_lock
from homelab.server.auth import KeyFile, KeyRing, Tenant, add_key
from homelab.server.config import ServerConfig
from homelab.server.runner import ServerHandle, start_server
from homelab.settings import Settings

KEY = "hl-test-launch-key"
MODEL_ID = "tiny"
N_CTX_PER_SLOT = 1024
# `codex debug models --bundled` as the stub answers it: the shape of Codex 0.171's catalog,
# cut down (a newest model on websockets, a hidden one, and the plain listed one to copy)
CODEX_BUNDLED = {
    "models": [
        {"slug": "gpt-new", "visibility": "list", "priority": 1, "prefer_websockets": True,
         "base_instructions": "new", "context_window": 500000, "shell_type": "shell_command"},
        {"slug": "gpt-hidden", "visibility": "hide", "priority": 40, "base_instructions": "h",
         "context_window": 272000, "shell_type": "shell_command"},
        {"slug": "gpt-old", "visibility": "list", "priority": 13, "base_instructions": "old",
         "context_window": 272000, "shell_type": "unified_exec", "supported_in_api": True,
         "supported_reasoning_levels": [{"effort": "low", "description": "fast"}],
         "default_reasoning_level": "medium", "apply_patch_tool_type": "freeform",
         "supports_search_tool": True, "input_modalities": ["text", "image"],
         "truncation_policy": {"mode": "tokens", "limit": 10000}},
    ]
}  # fmt: skip
STUB = textwrap.dedent(
    """\
    #!{python}
    import json, os, sys, tomllib, urllib.request
    from pathlib import Path
    name = Path(sys.argv[0]).name
    env = dict(os.environ)
    config = None
    if name == "codex" and sys.argv[1:] == ["debug", "models", "--bundled"]:
        sys.stdout.write({catalog!r})  # a cut-down copy of what Codex 0.171 bundles
        sys.exit(0)
    if name == "codex":
        home = Path(env.get("CODEX_HOME") or Path(env["HOME"]) / ".codex")
        profile = sys.argv[sys.argv.index("--profile") + 1]
        config = tomllib.loads((home / (profile + ".config.toml")).read_text())
        provider = config["model_providers"][config["model_provider"]]
        base, key = provider["base_url"], env[provider["env_key"]]
    elif name == "opencode":
        config = json.loads(Path(env["OPENCODE_CONFIG"]).read_text())
        options = config["provider"]["homelab"]["options"]
        base = options["baseURL"]
        key = env[options["apiKey"].removeprefix("{{env:").removesuffix("}}")]
    elif name == "claude":
        base, key = env["ANTHROPIC_BASE_URL"] + "/v1", env["ANTHROPIC_AUTH_TOKEN"]
    else:
        base, key = env["OPENAI_API_BASE_URL"], env["OPENAI_API_KEY"]
    request = urllib.request.Request(base + "/models", headers={{"Authorization": "Bearer " + key}})
    with urllib.request.urlopen(request, timeout=30) as response:
        models = [m["id"] for m in json.load(response)["data"]]
    record = {{"argv": sys.argv[1:], "env": env, "config": config, "models": models}}
    Path(env["LAUNCH_STUB_OUT"]).write_text(json.dumps(record))
    """
)


@pytest.fixture(scope="module")
def served(demo_model: Callable[..., Path]) -> Iterator[ServerHandle]:
    settings = Settings(n_ctx=2 * N_CTX_PER_SLOT, n_ctx_per_slot=N_CTX_PER_SLOT, n_parallel=2)
    engine = Engine.load(demo_model("llama"), settings, record_calibration=False)
    keys = KeyRing.from_keys({KEY: Tenant("launcher")})
    handle = start_server(engine, config=ServerConfig(model_id=MODEL_ID, keys=keys))
    yield handle
    handle.stop()
    engine.close()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """HOME, HOMELAB_HOME and the stubs' folder, all inside ``tmp_path``."""
    for name in ("home", "homelab", "bin"):
        (tmp_path / name).mkdir()
    for program in ("claude", "codex", "opencode", "open-webui"):
        stub = tmp_path / "bin" / program
        stub.write_text(STUB.format(python=sys.executable, catalog=json.dumps(CODEX_BUNDLED)))
        stub.chmod(0o755)
    return tmp_path


def launch(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        **os.environ,
        "HOME": str(home / "home"),
        "HOMELAB_HOME": str(home / "homelab"),
        "PATH": f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "LAUNCH_STUB_OUT": str(home / "received.json"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        **env,
    }
    environ.pop("HOMELAB_API_KEY", None)
    environ.pop("CODEX_HOME", None)
    command = [sys.executable, "-m", "homelab.cli", "launch", *args]
    return subprocess.run(command, env=environ, capture_output=True, text=True, timeout=600)


def received(home: Path) -> dict[str, Any]:
    return json.loads((home / "received.json").read_text())  # type: ignore[no-any-return]


def planned_context(home: Path) -> int:
    """What `homelab plan demo --goal agent` gives a request: the window launch must print."""
    done = subprocess.run(
        [sys.executable, "-m", "homelab.cli", "plan", "demo", "--goal", "agent", "--json"],
        env={**os.environ, "HOMELAB_HOME": str(home / "homelab")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return int(json.loads(done.stdout)["settings"]["n_ctx_per_slot"])


# --- --print ---------------------------------------------------------------------------------


@pytest.mark.parametrize("client", ["claude", "codex", "opencode", "openwebui"])
def test_print_without_a_server_shows_the_planned_window_and_changes_nothing(
    home: Path, client: str
) -> None:
    done = launch(home, client, "demo", "--print")
    assert done.returncode == 0, done.stderr
    window = planned_context(home)
    out = done.stdout
    assert f"planned context per request {window:,}" in out
    assert "would start `homelab serve demo --goal agent --port 8080" in out
    assert "<new key>" in out and "hl-" not in out  # the key is made when it starts, not here
    expected = {
        "claude": f"export CLAUDE_CODE_AUTO_COMPACT_WINDOW={window}",
        "codex": f"model_context_window = {window}",
        "opencode": f'"context": {window}',
        "openwebui": "export OPENAI_API_BASE_URL=http://127.0.0.1:8080/v1",
    }[client]
    assert expected in out
    assert not list((home / "home").iterdir())  # no client file written
    assert not (home / "homelab" / "config" / "keys.toml").exists()
    assert read_server_lock(home / "homelab" / "data" / "server.lock") is None
    assert not (home / "received.json").exists()  # nothing started


def test_print_against_a_running_server_shows_its_context(home: Path, served: ServerHandle) -> None:
    done = launch(home, "claude", "--url", served.url, "--api-key", KEY, "--print")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"# server: {served.url} (running); context per request {N_CTX_PER_SLOT:,}" in lines
    for line in (
        f"export ANTHROPIC_BASE_URL={served.url}",
        f"export ANTHROPIC_AUTH_TOKEN={KEY}",
        f"export ANTHROPIC_MODEL={MODEL_ID}",
        f"export CLAUDE_CODE_AUTO_COMPACT_WINDOW={N_CTX_PER_SLOT}",
        "unset ANTHROPIC_API_KEY",
        "claude",
    ):
        assert line in lines, (line, lines)


# --- each client's configuration, received by its stub ---------------------------------------


def test_claude_receives_its_environment(home: Path, served: ServerHandle) -> None:
    done = launch(
        home, "claude", "--url", served.url, "--api-key", KEY, "--", "-p", "hello",
        ANTHROPIC_API_KEY="sk-ant-someone-else",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = received(home)
    env = got["env"]
    assert got["argv"] == ["-p", "hello"] and got["models"] == [MODEL_ID]
    assert (env["ANTHROPIC_BASE_URL"], env["ANTHROPIC_AUTH_TOKEN"]) == (served.url, KEY)
    assert env["ANTHROPIC_MODEL"] == env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == MODEL_ID
    assert env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == str(N_CTX_PER_SLOT)
    assert int(env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]) <= N_CTX_PER_SLOT
    assert "ANTHROPIC_API_KEY" not in env  # sent as x-api-key beside the bearer: refused


def test_codex_gets_a_profile_file_and_a_catalog(home: Path, served: ServerHandle) -> None:
    codex = home / "home" / ".codex"
    codex.mkdir()
    config = codex / "config.toml"
    mine = (  # what an earlier homelab wrote: Codex 0.16x refuses --profile beside it
        'model = "gpt-5"\nprofile = "homelab"\n\n[profiles.homelab]\nmodel = "stale"\n\n'
        '[mcp_servers.docs]\ncommand = "docs"\n'
    )
    config.write_text(mine)
    done = launch(home, "codex", "--url", served.url, "--api-key", KEY)
    assert done.returncode == 0, done.stderr
    got = received(home)
    assert got["argv"] == ["--profile", "homelab"] and got["models"] == [MODEL_ID]
    profile = got["config"]
    provider = profile["model_providers"]["homelab"]
    assert provider["wire_api"] == "responses" and provider["base_url"] == served.url + "/v1"
    assert got["env"][provider["env_key"]] == KEY
    assert (profile["model"], profile["model_context_window"]) == (MODEL_ID, N_CTX_PER_SLOT)
    assert profile["model_auto_compact_token_limit"] < N_CTX_PER_SLOT
    assert_catalog(Path(profile["model_catalog_json"]))
    users = tomllib.loads(config.read_text())  # the user's own keys kept, ours gone
    assert users == {"model": "gpt-5", "mcp_servers": {"docs": {"command": "docs"}}}
    backups = list(codex.glob("config.toml.homelab-backup-*"))
    assert len(backups) == 1 and backups[0].read_text() == mine
    assert f"your copy: {backups[0]}" in done.stderr
    again = launch(home, "codex", "--url", served.url, "--api-key", KEY)
    assert again.stderr.count("already set up") == 2  # the profile and the catalog: unchanged
    assert len(list(codex.glob("*.homelab-backup-*"))) == 1


def assert_catalog(path: Path) -> None:
    """One entry for the served model, copied from the plain listed model of the bundle (its
    instructions and shell), with homelab's window and nothing a hosted model has."""
    (entry,) = json.loads(path.read_text())["models"]
    assert (entry["slug"], entry["base_instructions"], entry["shell_type"]) == (
        MODEL_ID, "old", "unified_exec",
    )  # fmt: skip
    assert entry["context_window"] == N_CTX_PER_SLOT > entry["auto_compact_token_limit"]
    assert entry["supported_reasoning_levels"] == [] and entry["default_reasoning_level"] is None
    assert entry["apply_patch_tool_type"] is None and entry["supports_search_tool"] is False
    assert entry["input_modalities"] == ["text"] and entry["priority"] == 0


def test_a_running_server_takes_a_key_made_for_the_client(
    home: Path, demo_model: Callable[..., Path]
) -> None:
    """No key given: the launch adds one for the client's tenant to this machine's keys file,
    and the running server (which re-reads that file) takes it."""
    keys_path = home / "homelab" / "config" / "keys.toml"  # HOMELAB_HOME's keys file
    add_key(keys_path, "someone")  # a server that wants keys
    settings = Settings(n_ctx=N_CTX_PER_SLOT, n_ctx_per_slot=N_CTX_PER_SLOT, n_parallel=1)
    engine = Engine.load(demo_model("llama"), settings, record_calibration=False)
    handle = start_server(engine, config=ServerConfig(model_id=MODEL_ID, keys=KeyFile(keys_path)))
    try:
        shown = launch(home, "codex", "--url", handle.url, "--print")
        assert shown.returncode == 1 and "without --print" in shown.stderr  # writes nothing
        assert "codex" not in keys_path.read_text()
        done = launch(home, "codex", "--url", handle.url)
        assert done.returncode == 0, done.stderr
        assert f"added a key for tenant 'codex' to {keys_path}" in done.stderr
        got = received(home)
        assert got["models"] == [MODEL_ID]  # the stub's request with the new key: answered
        tenant = KeyFile(keys_path).authenticate(got["env"]["HOMELAB_API_KEY"])
        assert tenant is not None and tenant.name == "codex"
    finally:
        handle.stop()
        engine.close()


def test_opencode_gets_its_own_file_and_leaves_the_users_alone(
    home: Path, served: ServerHandle
) -> None:
    users = home / "home" / ".config" / "opencode" / "opencode.json"
    users.parent.mkdir(parents=True)
    users.write_text('{"theme": "mine"}\n')
    done = launch(home, "opencode", "--url", served.url, "--api-key", KEY)
    assert done.returncode == 0, done.stderr
    got = received(home)
    assert got["models"] == [MODEL_ID] and got["config"]["model"] == f"homelab/{MODEL_ID}"
    model = got["config"]["provider"]["homelab"]["models"][MODEL_ID]
    assert model["limit"]["context"] == N_CTX_PER_SLOT
    assert 0 < model["limit"]["output"] < N_CTX_PER_SLOT
    assert users.read_text() == '{"theme": "mine"}\n'
    assert Path(got["env"]["OPENCODE_CONFIG"]).is_relative_to(home / "homelab")


def test_open_webui_gets_its_connections(home: Path, served: ServerHandle) -> None:
    done = launch(home, "openwebui", "--url", served.url, "--api-key", KEY)
    assert done.returncode == 0, done.stderr
    got = received(home)
    env = got["env"]
    assert got["argv"] == ["serve", "--port", "3000"] and got["models"] == [MODEL_ID]
    assert (env["OPENAI_API_BASE_URL"], env["OPENAI_API_KEY"]) == (served.url + "/v1", KEY)
    assert env["OLLAMA_BASE_URL"] == served.url
    assert env["ENABLE_OLLAMA_API"] == "false"  # this server wants a key: see the note


def test_a_server_that_wants_a_key_and_got_none_says_what_to_do(
    home: Path, served: ServerHandle
) -> None:
    done = launch(home, "claude", "--url", served.url)
    assert done.returncode == 1 and "--api-key" in done.stderr
    assert not (home / "received.json").exists()


def test_a_missing_client_says_how_to_install_it(home: Path, served: ServerHandle) -> None:
    (home / "bin" / "claude").unlink()
    done = launch(home, "claude", "--url", served.url, "--api-key", KEY, PATH=str(home / "bin"))
    assert done.returncode == 1 and "npm install -g @anthropic-ai/claude-code" in done.stderr


# --- a server started by launch --------------------------------------------------------------


def test_launch_starts_a_planned_server_with_a_key_for_the_client(home: Path) -> None:
    done = launch(home, "opencode", "demo", "--port", "0")
    lock = read_server_lock(home / "homelab" / "data" / "server.lock")
    try:
        assert done.returncode == 0, done.stderr
        assert lock is not None and "started `homelab serve demo --goal agent" in done.stderr
        got = received(home)
        window = planned_context(home)
        limit = next(iter(got["config"]["provider"]["homelab"]["models"].values()))["limit"]
        assert limit["context"] == window
        assert got["models"] and got["env"]["HOMELAB_API_KEY"].startswith("hl-")
        keys = (home / "homelab" / "config" / "keys.toml").read_text()
        assert '= "opencode"' in keys  # the client's own tenant
    finally:
        if lock is not None:
            os.kill(lock.pid, signal.SIGTERM)
