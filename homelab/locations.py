"""Every filesystem location homelab uses, in one place (platformdirs based).

``HOMELAB_HOME`` overrides the root of all of them (tests point it at a temp dir).
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "homelab"


def _root_override() -> Path | None:
    value = os.environ.get("HOMELAB_HOME")
    return Path(value) if value else None


def config_dir() -> Path:
    """Settings and API keys (keys.toml, mode 0600)."""
    root = _root_override()
    return root / "config" if root else Path(platformdirs.user_config_dir(APP_NAME))


def data_dir() -> Path:
    """Hardware profiles, calibration records, quality results."""
    root = _root_override()
    return root / "data" if root else Path(platformdirs.user_data_dir(APP_NAME))


def cache_dir() -> Path:
    """Generated demo models and other re-creatable files."""
    root = _root_override()
    return root / "cache" if root else Path(platformdirs.user_cache_dir(APP_NAME))


def demo_models_dir() -> Path:
    return cache_dir() / "demo-models"


def profiles_dir() -> Path:
    """The bundled data files (GPU profiles, model catalogue)."""
    bundled = Path(__file__).resolve().parent / "profiles"
    if bundled.is_dir():
        return bundled
    return Path(__file__).resolve().parent.parent / "profiles"


def ensure_dir(path: Path, *, private: bool = False) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700 if private else 0o755)
    return path
