"""Each bench test gets its own HOMELAB_HOME: bench and quality refuse to run while a homelab
server holds its lock there, and the server tests keep one running for the whole session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def own_homelab_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOMELAB_HOME", str(tmp_path / "homelab-home"))
