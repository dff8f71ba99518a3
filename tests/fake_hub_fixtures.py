"""FakeHub fixtures shared by every test package that downloads (``tests/hub``, the TUI's
picker): one FakeHub per session, and the environment (HF_ENDPOINT, HF_HOME…) that points
the real ``huggingface_hub`` client and homelab's own pull at it. Registered as a plugin in
``tests/conftest.py``; the repos each package serves are set up by that package."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_hub import FakeHub


@pytest.fixture(scope="session")
def _running_fake_hub() -> Iterator[FakeHub]:
    hub = FakeHub().start()  # stopping a server takes ~0.5 s: start them once
    yield hub
    hub.stop()


@pytest.fixture
def fake_hub(_running_fake_hub: FakeHub) -> FakeHub:
    """The session's FakeHub, emptied: no repos, no faults, an empty request log."""
    _running_fake_hub.reset()
    return _running_fake_hub


@pytest.fixture
def hub_env(fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point homelab (and huggingface_hub calls homelab makes) at the FakeHub; returns HF_HOME."""
    hf_home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.endpoint)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "5")
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "5")
    for name in (
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_TOKEN_PATH",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("homelab.hub.pull.RETRY_WAITS_S", (0.01,))
    # huggingface_hub reads HF_HUB_OFFLINE once, at import: an earlier test that ran offline
    # (the TUI's do) would leave its client refusing every request
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    # huggingface_hub fetches an "agent harness" registry from the endpoint it saw at import
    # time while building its User-Agent; keep that telemetry call out of the request logs
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_DISABLE_TELEMETRY", True)
    return hf_home
