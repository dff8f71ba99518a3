"""What the server is told at start-up (one frozen object, shared by every route)."""

from __future__ import annotations

import fnmatch
import ipaddress
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from homelab.errors import ConfigError
from homelab.server.auth import Keys
from homelab.server.history import DEFAULT_VOLATILE_PATTERNS, compiled
from homelab.server.image_parts import DEFAULT_MAX_IMAGES, ImagePolicy

# room for a few realistic images (base64 adds a third) while staying bounded
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class ServerConfig:
    model_id: str = "model"  # the name /v1/models lists and requests must use
    model_aliases: tuple[str, ...] = ()  # other accepted names
    host: str = "127.0.0.1"
    port: int = 8080
    keys: Keys | None = None  # None: no authentication (allowed only on loopback)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # checked before parsing (413)
    default_max_tokens: int = 2048  # when a chat request sets none (also capped by context left)
    default_completion_max_tokens: int = 16  # /v1/completions default, as in OpenAI's API
    max_tokens_limit: int | None = None  # the most a request may ask for; None = slot context
    max_choices: int = 16  # n (times prompts, for /v1/completions)
    log_prompts: bool = False  # log prompts and outputs (admin opt-in; off by default)
    cors_origins: tuple[str, ...] = ()  # exact origins; "*" allows any origin, never credentials
    reasoning_format: str = "auto"  # "auto"/"deepseek": reasoning apart from content; "none"
    enable_thinking: bool | None = None  # default for templates with the switch (None: theirs)
    # (PATTERN, MODEL): a requested name matching PATTERN (fnmatch: "claude-*") means MODEL
    aliases: tuple[tuple[str, str], ...] = ()
    # regexes removed from system messages before rendering (volatile client blocks)
    volatile_patterns: tuple[str, ...] = DEFAULT_VOLATILE_PATTERNS
    history_reasoning: bool = True  # render earlier turns' reasoning back (prefix stability)
    stored_responses: int = 256  # Responses API: kept responses, all tenants together
    stored_response_bytes: int = 64 * 1024 * 1024  # ... and their bytes (oldest dropped first)
    stored_response_ttl_s: float = 3600.0  # ... and how long one is kept
    stored_response_tenant_share: float = 0.25  # each tenant's share of both (response_store)
    # images in chat requests: how many per request, and whether http(s) URLs are fetched
    # (data URLs always work; local paths never)
    max_images: int = DEFAULT_MAX_IMAGES
    allow_image_urls: bool = False
    allow_private_image_urls: bool = False  # ... also loopback / LAN / link-local hosts

    def __post_init__(self) -> None:
        try:
            compiled(self.volatile_patterns)
        except re.error as exc:
            raise ConfigError(
                f"a strip pattern is not a valid regular expression: {exc}",
                hint="Check --strip-pattern / strip_patterns (Python `re` syntax).",
            ) from None
        if not 0 < self.stored_response_tenant_share <= 1:
            raise ConfigError(
                f"a tenant's share of the stored responses must be above 0 and at most 1 "
                f"(got {self.stored_response_tenant_share}).",
                hint="Give --stored-responses-tenant-share a fraction such as 0.25.",
            )
        if self.keys is None and not is_loopback(self.host):
            raise ConfigError(
                f"serving on {self.host} (beyond this machine) needs API keys.",
                hint="Add a key with `homelab serve --new-key TENANT`, or serve on 127.0.0.1.",
            )

    @property
    def image_policy(self) -> ImagePolicy:
        return ImagePolicy(
            max_images=self.max_images,
            allow_urls=self.allow_image_urls or self.allow_private_image_urls,
            allow_private_urls=self.allow_private_image_urls,
        )

    @property
    def bound_to_loopback(self) -> bool:
        return is_loopback(self.host)

    def accepts_model(self, name: str) -> bool:
        return self._serves(name) or self._serves(self.resolve_alias(name))

    def _serves(self, name: str) -> bool:
        return name == self.model_id or name in self.model_aliases

    def resolve_alias(self, name: str) -> str:
        """The model ``name`` stands for: the first alias whose pattern matches it, else
        ``name`` itself (so clients with their own model names, ``claude-*``, reach ours)."""
        for pattern, model in self.aliases:
            if fnmatch.fnmatchcase(name, pattern):
                return model
        return name


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


SERVE_FILE_NAME = "serve.toml"


@dataclass(frozen=True)
class ServeFile:
    """What ``serve.toml`` (``homelab serve --config``) sets; the flags add to it.

    ::

        [aliases]                 # PATTERN = MODEL (fnmatch patterns, first match wins)
        "claude-*" = "qwen3-coder-30b"
        [prompt]
        strip_patterns = ['(?m)^Current time: .*$']   # also removed from system messages
        history_reasoning = true  # render earlier reasoning back (false: drop it)
    """

    aliases: tuple[tuple[str, str], ...] = ()
    strip_patterns: tuple[str, ...] = ()
    history_reasoning: bool = True


def parse_alias(text: str) -> tuple[str, str]:
    """``PATTERN=MODEL`` (``--alias 'claude-*=qwen3'``) as a pair."""
    pattern, sep, model = text.partition("=")
    if not sep or not pattern.strip() or not model.strip():
        raise ConfigError(
            f"--alias {text!r} is not PATTERN=MODEL.",
            hint="For example --alias 'claude-*=qwen3-coder' (quote the pattern).",
        )
    return pattern.strip(), model.strip()


def read_serve_file(path: Path) -> ServeFile:
    """``serve.toml`` (a missing file is an empty one); errors name the file."""
    if not path.is_file():
        return ServeFile()
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
        return _serve_file(document)
    except (tomllib.TOMLDecodeError, ValueError, TypeError) as exc:
        raise ConfigError(
            f"{path} is not a valid serve config: {exc}",
            hint="See `homelab serve --help` and the README's agent recipes.",
        ) from None


def _serve_file(document: dict[str, Any]) -> ServeFile:
    aliases = document.get("aliases", {})
    prompt = document.get("prompt", {})
    if not isinstance(aliases, dict) or not isinstance(prompt, dict):
        raise ValueError("[aliases] and [prompt] must be tables")
    if not all(isinstance(v, str) for v in aliases.values()):
        raise ValueError("each alias maps a pattern to a model name (a string)")
    patterns = prompt.get("strip_patterns", [])
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise ValueError("prompt.strip_patterns must be a list of strings")
    keep = prompt.get("history_reasoning", True)
    if not isinstance(keep, bool):
        raise ValueError("prompt.history_reasoning must be true or false")
    return ServeFile(tuple(aliases.items()), tuple(patterns), keep)
