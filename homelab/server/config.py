"""What the server is told at start-up (one frozen object, shared by every route)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from homelab.errors import ConfigError
from homelab.server.auth import KeyRing

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class ServerConfig:
    model_id: str = "model"  # the name /v1/models lists and requests must use
    model_aliases: tuple[str, ...] = ()  # other accepted names
    host: str = "127.0.0.1"
    port: int = 8080
    keys: KeyRing | None = None  # None: no authentication (allowed only on loopback)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # checked before parsing (413)
    default_max_tokens: int = 2048  # when a chat request sets none (also capped by context left)
    default_completion_max_tokens: int = 16  # /v1/completions default, as in OpenAI's API
    max_tokens_limit: int | None = None  # the most a request may ask for; None = slot context
    max_choices: int = 16  # n (times prompts, for /v1/completions)
    log_prompts: bool = False  # log prompts and outputs (admin opt-in; off by default)
    cors_origins: tuple[str, ...] = ()  # exact origins; "*" allows any origin, never credentials
    reasoning_format: str = "auto"  # "auto"/"deepseek": reasoning apart from content; "none"
    enable_thinking: bool | None = None  # default for templates with the switch (None: theirs)

    def __post_init__(self) -> None:
        if self.keys is None and not is_loopback(self.host):
            raise ConfigError(
                f"serving on {self.host} (beyond this machine) needs API keys.",
                hint="Add a key with `homelab serve --new-key TENANT`, or serve on 127.0.0.1.",
            )

    @property
    def bound_to_loopback(self) -> bool:
        return is_loopback(self.host)

    def accepts_model(self, name: str) -> bool:
        return name == self.model_id or name in self.model_aliases


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
