"""How homelab reaches the Hugging Face hub, read from the environment at call time.

``huggingface_hub`` reads ``HF_ENDPOINT``, ``HF_HOME`` and ``HF_HUB_OFFLINE`` once, when it is
imported; homelab reads them on every call instead, so a TUI session or a test that changes
them is obeyed. The variables are the hub's own: ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HOME``,
``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``, ``HF_HUB_ETAG_TIMEOUT``, ``HF_HUB_DOWNLOAD_TIMEOUT``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_METADATA_TIMEOUT_S = 10.0
DEFAULT_DOWNLOAD_TIMEOUT_S = 10.0
_TRUE = {"1", "on", "yes", "true"}


@dataclass(frozen=True)
class HubSettings:
    """Where the hub is, who we are, where files go, and how long we wait."""

    endpoint: str
    cache_dir: Path  # the Hugging Face hub cache (models--org--name/blobs, snapshots, refs)
    offline: bool
    metadata_timeout_s: float  # API calls and header reads: connect and per-read timeout
    download_timeout_s: float  # downloads: connect and per-read timeout
    token: str | None = field(default=None, repr=False)  # never printed


def _env_float(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default


def hf_home() -> Path:
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface"


def hf_cache_dir() -> Path:
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    return hf_home() / "hub"


def is_offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in _TRUE


def _token() -> str | None:
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if os.environ.get(name):
            return os.environ[name].strip()
    token_file = Path(os.environ.get("HF_TOKEN_PATH") or hf_home() / "token")
    try:
        return token_file.read_text().strip() or None
    except OSError:
        return None


def hub_settings() -> HubSettings:
    """The settings in force now."""
    return HubSettings(
        endpoint=(os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/"),
        cache_dir=hf_cache_dir(),
        offline=is_offline(),
        metadata_timeout_s=_env_float("HF_HUB_ETAG_TIMEOUT", DEFAULT_METADATA_TIMEOUT_S),
        download_timeout_s=_env_float("HF_HUB_DOWNLOAD_TIMEOUT", DEFAULT_DOWNLOAD_TIMEOUT_S),
        token=_token(),
    )
