"""What a client needs to talk to a homelab server, as that client's documentation says it:
environment variables, configuration files, the command that starts it.

:func:`client_setup` describes it (a :class:`ClientSetup`: nothing written yet), so
``homelab launch --print`` shows the same object that :func:`apply` writes and the launch
runs. The context one request may use (the plan's) goes where each client reads it:

* **Claude Code** (``claude``, Anthropic's Messages API): ``ANTHROPIC_BASE_URL``,
  ``ANTHROPIC_AUTH_TOKEN`` (sent as ``Authorization: Bearer``), ``ANTHROPIC_MODEL`` and the
  default Sonnet/Opus/Haiku models (every request names the served model),
  ``CLAUDE_CODE_AUTO_COMPACT_WINDOW`` (the window it compacts at; it assumes 200K for a model
  it does not know), ``CLAUDE_CODE_MAX_OUTPUT_TOKENS``, and no traffic to Anthropic.
  ``ANTHROPIC_API_KEY`` is removed: sent as ``x-api-key`` beside another bearer key, it would
  be refused.
* **Codex CLI** (``codex``, the Responses API): a profile file of homelab's own,
  ``$CODEX_HOME/homelab.config.toml`` (``~/.codex``; Codex 0.16x reads a profile from
  ``NAME.config.toml`` and refuses the older ``[profiles.NAME]`` tables in ``config.toml``,
  which are taken out of it), with the model, its context window, the compaction limit, a
  ``[model_providers.homelab]`` table with ``wire_api = "responses"``, and a model catalog
  (``model_catalog_json``): one entry for the served model, made from the generic entry of the
  installed Codex's own bundled catalog (``codex debug models --bundled``: its instructions
  and the fields that Codex version requires) with homelab's window, no reasoning levels and
  no hosted-only tools. Started with ``--profile homelab``, the key in ``HOMELAB_API_KEY``.
* **OpenCode** (``opencode``, Chat Completions): a provider with ``limit.context`` /
  ``limit.output`` in a file of homelab's own, named by ``OPENCODE_CONFIG`` (OpenCode merges it
  over the user's global config, which stays untouched).
* **Open WebUI** (``open-webui serve``): its OpenAI connection (``OPENAI_API_BASE_URL``,
  ``OPENAI_API_KEY``) and its Ollama connection (``OLLAMA_BASE_URL``, when the server takes
  requests without a key); on port 3000, since homelab has 8080.

A user's own file is never overwritten silently: a file that exists and changes is copied
first (``NAME.homelab-backup-YYYYmmdd-HHMMSS``) and :func:`apply` says so.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from homelab.errors import ConfigError
from homelab.locations import config_dir

CLIENTS = ("claude", "codex", "opencode", "openwebui")
PROVIDER = "homelab"  # the provider / profile name in the clients' files
KEY_VARIABLE = "HOMELAB_API_KEY"
OPEN_WEBUI_PORT = 3000
CODEX_CATALOG_TIMEOUT_S = 30  # `codex debug models --bundled` reads a file; it is quick
CLAUDE_DEFAULT_WINDOW = 200_000  # what Claude Code assumes for a model it does not know


@dataclass(frozen=True)
class Endpoint:
    """The server a client is pointed at, and what one request of its tenant may use."""

    url: str  # http://HOST:PORT (no /v1)
    api_key: str
    model: str
    context_tokens: int
    output_tokens: int
    keyless: bool = False  # the server takes requests without a key (loopback, no keys file)


@dataclass(frozen=True)
class FileChange:
    path: Path
    content: str
    previous: str | None  # the file as it is now (None: it does not exist)
    summary: str | None = None  # what --print shows instead of a long content

    @property
    def changes(self) -> bool:
        return self.previous != self.content


@dataclass(frozen=True)
class ClientSetup:
    client: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    unset: tuple[str, ...] = ()  # variables removed from the client's environment
    files: tuple[FileChange, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` (the caller's environment) with this setup's variables."""
        merged = {k: v for k, v in base.items() if k not in self.unset}
        return merged | dict(self.env)


def client_setup(
    client: str, endpoint: Endpoint, home: Path, extra_args: tuple[str, ...] = ()
) -> ClientSetup:
    """What ``client`` needs (``home``: the user's home, where its files are)."""
    builders = {
        "claude": _claude,
        "codex": _codex,
        "opencode": _opencode,
        "openwebui": _open_webui,
    }
    if client not in builders:
        raise ConfigError(
            f"unknown client {client!r}.", hint=f"Choose one of: {', '.join(CLIENTS)}."
        )
    setup = builders[client](endpoint, home)
    return ClientSetup(
        setup.client,
        setup.command + extra_args,
        setup.env,
        setup.unset,
        setup.files,
        setup.notes,
    )


def _claude(endpoint: Endpoint, _home: Path) -> ClientSetup:
    model = endpoint.model
    env = {
        "ANTHROPIC_BASE_URL": endpoint.url,
        "ANTHROPIC_AUTH_TOKEN": endpoint.api_key,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "CLAUDE_CODE_SUBAGENT_MODEL": model,
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(endpoint.context_tokens),
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(endpoint.output_tokens),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    notes: tuple[str, ...] = ()
    if endpoint.context_tokens >= CLAUDE_DEFAULT_WINDOW:
        notes = (
            f"Claude Code honours CLAUDE_CODE_AUTO_COMPACT_WINDOW only below "
            f"{CLAUDE_DEFAULT_WINDOW:,} tokens; this context ({endpoint.context_tokens:,}) "
            "is not below it, so its own 200K window applies.",
        )
    return ClientSetup("claude", ("claude",), env, ("ANTHROPIC_API_KEY",), notes=notes)


def codex_home(home: Path, env: Mapping[str, str] | None = None) -> Path:
    value = (env if env is not None else os.environ).get("CODEX_HOME")
    return Path(value) if value else home / ".codex"


def _codex(endpoint: Endpoint, home: Path) -> ClientSetup:
    folder = codex_home(home)
    catalog_path = folder / f"{PROVIDER}-models.json"
    entry = codex_catalog_entry(endpoint)
    files = [_codex_profile(endpoint, folder, catalog_path if entry else None)]
    notes: tuple[str, ...] = ()
    if entry is not None:
        content = json.dumps({"models": [entry]}, indent=2) + "\n"
        summary = (
            f"# {len(content):,} bytes: one model, {entry['slug']} (context_window "
            f"{entry['context_window']}), with the instructions of the installed Codex's catalog"
        )
        files.append(FileChange(catalog_path, content, _read(catalog_path), summary))
    else:
        notes = (
            "No model catalog: `codex debug models --bundled` gave none (is Codex installed?). "
            "Codex works without it but warns that the model's metadata is not found; run "
            "`homelab launch codex` again once it is installed.",
        )
    legacy = _codex_legacy_tables(folder / "config.toml")
    if legacy is not None:
        files.append(legacy)
    env = {KEY_VARIABLE: endpoint.api_key}
    command = ("codex", "--profile", PROVIDER)
    return ClientSetup("codex", command, env, files=tuple(files), notes=notes)


def _codex_profile(endpoint: Endpoint, folder: Path, catalog: Path | None) -> FileChange:
    path = folder / f"{PROVIDER}.config.toml"
    compact_tokens = endpoint.context_tokens * 9 // 10  # compact before the window is full
    lines = [
        "# written by `homelab launch codex`: the profile `codex --profile homelab` reads",
        f"model = {json.dumps(endpoint.model)}",
        f'model_provider = "{PROVIDER}"',
        f"model_context_window = {endpoint.context_tokens}",
        f"model_auto_compact_token_limit = {compact_tokens}",
    ]
    if catalog is not None:
        lines.append(f"model_catalog_json = {json.dumps(str(catalog))}")
    lines += [
        "",
        f"[model_providers.{PROVIDER}]",
        'name = "homelab"',
        f"base_url = {json.dumps(endpoint.url + '/v1')}",
        f'env_key = "{KEY_VARIABLE}"',
        'wire_api = "responses"',
        "",
    ]
    return FileChange(path, "\n".join(lines), _read(path))


def _codex_legacy_tables(path: Path) -> FileChange | None:
    """``config.toml`` without the tables an earlier homelab wrote there (Codex refuses to
    start a profile while ``[profiles.homelab]`` is in it); None when it has none."""
    previous = _read(path)
    if previous is None:
        return None
    content = _without_our_tables(previous, path)
    return FileChange(path, content, previous) if content != previous else None


# Codex's fields that would ask homelab for what it does not do (hosted tools, websockets,
# reasoning efforts, speed tiers), set plainly where the template has them.
_CODEX_PLAIN_FIELDS: dict[str, object] = {
    "supported_reasoning_levels": [],
    "default_reasoning_level": None,
    "supports_reasoning_effort_updates": False,
    "apply_patch_tool_type": None,
    "supports_search_tool": False,
    "prefer_websockets": False,
    "use_responses_lite": False,
    "service_tiers": [],
    "additional_speed_tiers": [],
    "input_modalities": ["text"],
    "supports_image_detail_original": False,
    "supports_parallel_tool_calls": False,
    "support_verbosity": False,
    "default_verbosity": None,
    "upgrade": None,
    "availability_nux": None,
}


def codex_catalog_entry(endpoint: Endpoint) -> dict[str, object] | None:
    """The served model as the installed Codex's catalog describes a model, or None."""
    template = _generic_codex_model(_bundled_codex_models())
    if template is None:
        return None
    entry = dict(template)
    for key, value in _CODEX_PLAIN_FIELDS.items():
        if key in entry:
            entry[key] = value
    window = endpoint.context_tokens
    entry.update(
        slug=endpoint.model,
        display_name=endpoint.model,
        description=f"{endpoint.model} on homelab ({endpoint.url})",
        context_window=window,
        max_context_window=window,
        auto_compact_token_limit=window * 9 // 10,
        visibility="list",
        supported_in_api=True,
        priority=0,
    )
    return entry


def _bundled_codex_models() -> list[object]:
    executable = shutil.which("codex")
    if executable is None:
        return []
    try:
        done = subprocess.run(
            [executable, "debug", "models", "--bundled"], capture_output=True, text=True,
            stdin=subprocess.DEVNULL, timeout=CODEX_CATALOG_TIMEOUT_S, check=False,
        )  # fmt: skip
        models = json.loads(done.stdout)["models"]
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
        return []
    return models if isinstance(models, list) else []


def _generic_codex_model(models: list[object]) -> dict[str, object] | None:
    """The listed model with instructions that asks least of a server (no websockets, no
    lite protocol), the oldest of them (the highest priority number)."""
    usable = [
        m
        for m in models
        if isinstance(m, dict)
        and m.get("visibility") == "list"
        and (m.get("base_instructions") or m.get("model_messages"))
        and not m.get("prefer_websockets")
        and not m.get("use_responses_lite")
    ]
    return max(usable, key=lambda m: int(m.get("priority") or 0), default=None)


_TABLE_HEADER = re.compile(r"^\s*\[")
_PROFILE_SELECTOR = re.compile(rf"^\s*profile\s*=\s*[\"']{PROVIDER}[\"']\s*(#.*)?$")


def _without_our_tables(text: str, path: Path) -> str:
    """``text`` without its ``[model_providers.homelab]`` / ``[profiles.homelab]`` tables
    (and their sub-tables) and a top-level ``profile = "homelab"``; checked to parse."""
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"{path} is not valid TOML ({exc}); homelab leaves it as it is.",
            hint="Fix the file (or move it away) and run `homelab launch codex` again.",
        ) from None
    ours_prefixes = (f"[model_providers.{PROVIDER}", f"[profiles.{PROVIDER}")
    kept: list[str] = []
    skipping = in_tables = False
    for line in text.splitlines():
        if _TABLE_HEADER.match(line):
            in_tables = True
            header = line.strip()
            skipping = any(
                header.startswith(p + "]") or header.startswith(p + ".") for p in ours_prefixes
            )
        if not skipping and not (not in_tables and _PROFILE_SELECTOR.match(line)):
            kept.append(line)
    if len(kept) == len(text.splitlines()):
        return text
    content = "\n".join(kept).rstrip() + "\n"
    tomllib.loads(content)
    return content


def _opencode(endpoint: Endpoint, _home: Path) -> ClientSetup:
    path = config_dir() / "clients" / "opencode.json"
    model = {
        "name": endpoint.model,
        "limit": {"context": endpoint.context_tokens, "output": endpoint.output_tokens},
    }
    document = {
        "$schema": "https://opencode.ai/config.json",
        "model": f"{PROVIDER}/{endpoint.model}",
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "homelab",
                "options": {
                    "baseURL": endpoint.url + "/v1",
                    "apiKey": "{env:" + KEY_VARIABLE + "}",
                },
                "models": {endpoint.model: model},
            }
        },
    }
    content = json.dumps(document, indent=2) + "\n"
    env = {
        KEY_VARIABLE: endpoint.api_key,
        "OPENCODE_CONFIG": str(path),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
    }
    files = (FileChange(path, content, _read(path)),)
    return ClientSetup("opencode", ("opencode",), env, files=files)


def _open_webui(endpoint: Endpoint, _home: Path) -> ClientSetup:
    env = {
        "OPENAI_API_BASE_URL": endpoint.url + "/v1",
        "OPENAI_API_KEY": endpoint.api_key,
        "ENABLE_OLLAMA_API": "true" if endpoint.keyless else "false",
        "OLLAMA_BASE_URL": endpoint.url,
    }
    notes: tuple[str, ...] = ()
    if not endpoint.keyless:
        notes = (
            "Open WebUI's Ollama connection is off: this server wants a key and Open WebUI "
            "takes an Ollama key only in its settings (Settings > Connections), not from the "
            "environment. The OpenAI connection carries the key.",
        )
    command = ("open-webui", "serve", "--port", str(OPEN_WEBUI_PORT))
    return ClientSetup("openwebui", command, env, notes=notes)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror}).") from None


def apply(setup: ClientSetup) -> list[str]:
    """Write the setup's files (a changed existing file copied first); what was done, in
    lines to show."""
    done: list[str] = []
    for change in setup.files:
        if not change.changes:
            done.append(f"{change.path}: already set up")
            continue
        change.path.parent.mkdir(parents=True, exist_ok=True)
        if change.previous is not None:
            backup = change.path.with_name(
                f"{change.path.name}.homelab-backup-{time.strftime('%Y%m%d-%H%M%S')}"
            )
            shutil.copy2(change.path, backup)
            done.append(f"{change.path}: changed (your copy: {backup})")
        else:
            done.append(f"{change.path}: written")
        change.path.write_text(change.content, encoding="utf-8")
    return done


def render(setup: ClientSetup, secret: str | None = None) -> str:
    """What ``--print`` shows: the environment, the files and the command (``secret``
    replaced by ``<new key>`` when it is one that would be made)."""

    def shown(text: str) -> str:
        return text.replace(secret, "<new key>") if secret else text

    lines = [f"# {setup.client}: environment"]
    lines += [f"unset {name}" for name in setup.unset]
    lines += [f"export {name}={shown(value)}" for name, value in setup.env.items()]
    for change in setup.files:
        state = "new file" if change.previous is None else "changes your file; a copy is kept"
        if not change.changes:
            state = "unchanged"
        shown_content = change.summary if change.summary is not None else change.content
        lines += ["", f"# file {change.path} ({state})", shown(shown_content).rstrip()]
    lines += ["", "# then runs", " ".join(setup.command)]
    lines += [f"# note: {note}" for note in setup.notes]
    return "\n".join(lines)
