"""``homelab launch claude|codex|opencode|openwebui [MODEL]``: a client set up for this homelab,
then started.

The server: the one ``--url`` names, else the one running on this machine (found as
``homelab ps`` finds it), else ``homelab serve MODEL --goal agent`` started in the background
(its log in the data folder). The key: ``--api-key`` / ``HOMELAB_API_KEY``; a server started
here gets a new key for a tenant named after the client (as ``serve --new-key`` makes one); a
server that takes requests without a key (loopback, no keys file) needs none. The context the
client is told is the one a request may use on that server (its ``/api/show``), or, for a
server not started yet, the plan's. Then the client's files are written
(:mod:`homelab.client_setup`; a changed file of the user's is copied first) and the client
runs in this process, with the environment it needs.

Whatever follows ``--`` goes to the client (``homelab launch claude -- -p "hi"``).
``--print`` shows all of it — the server it would start, the environment, the files, the
command — and changes nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from homelab.cli import flags

if TYPE_CHECKING:
    from homelab.client_setup import ClientSetup, Endpoint

LOCAL_TOKEN = "homelab-local"  # a server without keys takes any token: clients need one
START_TIMEOUT_S = 600.0
KEY_TAKEN_WITHIN_S = 5.0  # a running server re-reads its keys file about once a second
INSTALL_HINTS = {
    "claude": "npm install -g @anthropic-ai/claude-code",
    "codex": "npm install -g @openai/codex",
    "opencode": "npm install -g opencode-ai",
    "open-webui": "pip install open-webui (in its own environment)",
}


def configure(parser: argparse.ArgumentParser) -> None:
    from homelab.client_setup import CLIENTS

    parser.add_argument("client", choices=CLIENTS, help="the client to set up and start")
    flags.add_model(parser, optional=True)
    parser.add_argument("--print", action="store_true", help="show everything; change nothing")
    parser.add_argument("--url", help="the server (default: the one running here, or start one)")
    parser.add_argument("--api-key", help="a key of that server (default: $HOMELAB_API_KEY)")
    parser.add_argument("--port", type=int, default=8080, help="port of a server started here")
    flags.add_plan_flags(parser)
    parser.set_defaults(goal="agent")


def run(args: argparse.Namespace) -> int:
    from homelab.client_setup import apply, client_setup, render

    url = _server_url(args)
    endpoint, start = _endpoint(args, url)
    extra = tuple(getattr(args, "passthrough", ()))  # `homelab launch claude -- -p "hi"`
    setup = client_setup(args.client, endpoint, Path.home(), extra)
    if args.print:
        secret = endpoint.api_key if start is not None else None
        print(_server_line(url, start, endpoint, args.client))
        print(render(setup, secret))
        return 0
    _require_installed(setup.command[0])
    if start is not None:
        endpoint = _start_server(args, start, endpoint)
        setup = client_setup(args.client, endpoint, Path.home(), extra)
    for line in apply(setup):
        print(f"homelab: {line}", file=sys.stderr)
    _exec(setup)
    return 0  # not reached: the client replaced this process


def _server_url(args: argparse.Namespace) -> str | None:
    from homelab.lock import running_server

    if args.url:
        return str(args.url).rstrip("/").removesuffix("/v1")
    server = running_server()
    return server.url if server is not None and server.url else None


def _server_line(url: str | None, start: list[str] | None, endpoint: Endpoint, client: str) -> str:
    if start is None:
        return f"# server: {url} (running); context per request {endpoint.context_tokens:,}"
    command = " ".join(["homelab", *start[3:]])
    return (
        f"# server: none running; would start `{command}` in the background, with a new key "
        f"for tenant '{client}'; planned context per request {endpoint.context_tokens:,}"
    )


# --- the endpoint: a running server, or one to start --------------------------------------------


def _endpoint(args: argparse.Namespace, url: str | None) -> tuple[Endpoint, list[str] | None]:
    """The endpoint, and (for a server to start) its command line."""
    if url is not None:
        return _running_endpoint(args, url), None
    return _planned_endpoint(args)


def _running_endpoint(args: argparse.Namespace, url: str) -> Endpoint:
    from homelab.client_setup import Endpoint
    from homelab.errors import ConfigError

    keyless = _get(url, "/api/version", None).status_code == 200
    key = args.api_key or os.environ.get("HOMELAB_API_KEY") or (LOCAL_TOKEN if keyless else None)
    if key is None and args.print:
        raise ConfigError(
            f"the server at {url} wants an API key.",
            hint=f"Run `homelab launch {args.client}` without --print (it adds a key for "
            f"tenant '{args.client}' to this machine's keys file, which a running server "
            "reads), or pass --api-key KEY (or HOMELAB_API_KEY).",
        )
    if key is None:
        key = _new_key_for(url, args.client)
    model = _served_model(url, key, args.model)
    context = _context(url, key, model)
    return Endpoint(url, key, model, context, _output_tokens(context), keyless=keyless)


def _new_key_for(url: str, tenant: str) -> str:
    """A key for ``tenant`` added to this machine's keys file, once the running server takes
    it (it re-reads the file within a second or so)."""
    from homelab.errors import ConfigError
    from homelab.server.auth import add_key, default_keys_path

    keys_path = default_keys_path()
    key = add_key(keys_path, tenant)
    print(f"homelab: added a key for tenant '{tenant}' to {keys_path}", file=sys.stderr)
    deadline = time.monotonic() + KEY_TAKEN_WITHIN_S
    while _get(url, "/v1/models", key).status_code == 401:
        if time.monotonic() > deadline:
            raise ConfigError(
                f"the server at {url} does not take the key added to {keys_path} (it was "
                "started with another keys file, or is not on this machine).",
                hint="Pass --api-key KEY (or HOMELAB_API_KEY) with a key of that server.",
            )
        time.sleep(0.25)
    return key


def _get(url: str, path: str, key: str | None) -> Any:
    import httpx

    from homelab.errors import ConfigError

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        return httpx.get(url + path, headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot reach the server at {url} ({exc}).") from None


def _checked(response: Any, url: str) -> Any:
    from homelab.errors import ConfigError

    if response.status_code == 401:
        raise ConfigError(f"the server at {url} refused the key.", hint="Pass a key it knows.")
    if response.status_code != 200:
        raise ConfigError(f"the server at {url} answered {response.status_code}: {response.text}")
    return response.json()


def _served_model(url: str, key: str, wanted: str | None) -> str:
    from homelab.errors import ConfigError

    names = [m["id"] for m in _checked(_get(url, "/v1/models", key), url)["data"]]
    if wanted is not None:
        if wanted not in names:
            raise ConfigError(
                f"the server at {url} does not serve '{wanted}'.", hint=f"It serves: {names}."
            )
        return wanted
    if len(names) != 1:
        raise ConfigError(
            f"the server at {url} serves several models; name one.", hint=f"One of: {names}."
        )
    return str(names[0])


def _context(url: str, key: str, model: str) -> int:
    """What one request may use, as the server's ``/api/show`` reports it (the slot's)."""
    import httpx

    from homelab.errors import ConfigError

    response = httpx.post(
        url + "/api/show",
        json={"model": model},
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )
    info = _checked(response, url)["model_info"]
    arch = info.get("general.architecture", "")
    context = info.get(f"{arch}.context_length")
    if not isinstance(context, int):
        raise ConfigError(f"the server at {url} does not say the context of '{model}'.")
    return context


def _output_tokens(context_tokens: int) -> int:
    """A reply's budget: a quarter of the context, at most 32K (clamped by the server anyway)."""
    return max(256, min(context_tokens // 4, 32_768))


def _planned_endpoint(args: argparse.Namespace) -> tuple[Endpoint, list[str]]:
    """No server yet: the plan ``serve MODEL --goal agent`` will make, and a key to make."""
    from homelab.client_setup import Endpoint
    from homelab.errors import ConfigError
    from homelab.models.launch import plan_file
    from homelab.server.auth import generate_key

    if not args.model:
        raise ConfigError(
            "no homelab server is running here, and no MODEL was given to start one.",
            hint=f"Give a MODEL ({flags.MODEL_HELP}), or start `homelab serve` first.",
        )
    ref = flags.model_ref(args.model)
    if not ref.on_disk:
        raise ConfigError(
            f"{args.model} is not on this machine.", hint=f"Run `homelab pull {args.model}`."
        )
    plan = plan_file(ref, flags.plan_request(args), flags.hardware(args))
    context = plan.settings.n_ctx_per_slot
    model_id = Path(ref.local_path()).stem
    url = f"http://127.0.0.1:{args.port}"
    key = generate_key()  # made for real only when it starts (_start_server)
    endpoint = Endpoint(url, key, model_id, context, _output_tokens(context))
    command = [sys.executable, "-m", "homelab.cli", "serve", args.model, "--goal", args.goal]
    command += ["--port", str(args.port), "--model-id", model_id]
    return endpoint, command


def _start_server(args: argparse.Namespace, command: list[str], planned: Endpoint) -> Endpoint:
    """Add the client's key, start the server in the background, wait until its model is
    loaded; the endpoint as the server reports it."""
    from homelab.locations import data_dir, ensure_dir
    from homelab.server.auth import add_key, default_keys_path

    keys_path = default_keys_path()
    if not keys_path.exists():
        print(
            f"homelab: creating {keys_path}: from now on this machine's servers ask every "
            "client for a key",
            file=sys.stderr,
        )
    key = add_key(keys_path, args.client)
    serve = command
    log_path = ensure_dir(data_dir()) / f"launch-{args.client}.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            serve, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    print(
        f"homelab: started `homelab {' '.join(serve[3:])}` (pid {process.pid}, log {log_path})",
        file=sys.stderr,
    )
    url = _wait_until_serving(process, log_path)
    return _running_endpoint(
        argparse.Namespace(**{**vars(args), "api_key": key, "model": planned.model}), url
    )


def _wait_until_serving(process: subprocess.Popen[bytes], log_path: Path) -> str:
    import httpx

    from homelab.errors import ConfigError
    from homelab.lock import running_server

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
            raise ConfigError(f"the server stopped while starting:\n{tail}")
        server = running_server()
        if server is not None and server.pid == process.pid and server.url:
            try:
                if httpx.get(server.url + "/health", timeout=5).status_code == 200:
                    return server.url
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    raise ConfigError(
        f"the server did not finish loading in {START_TIMEOUT_S:.0f} s; see {log_path}."
    )


# --- the client -----------------------------------------------------------------------------


def _require_installed(program: str) -> None:
    from homelab.errors import ConfigError

    if shutil.which(program) is None:
        raise ConfigError(
            f"{program} is not installed (not on PATH).",
            hint=f"Install it: {INSTALL_HINTS.get(program, program)}; or see `--print`.",
        )


def _exec(setup: ClientSetup) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(setup.command[0], list(setup.command), setup.environment(os.environ))
