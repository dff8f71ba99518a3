"""A running server holds the lock that keeps `homelab bench` / `quality` from competing."""

from __future__ import annotations

import pytest

from homelab.errors import BenchError
from homelab.lock import refuse_if_server_running, running_server
from homelab.server.runner import start_server


def test_a_running_server_makes_bench_refuse_until_it_stops() -> None:
    handle = start_server(lambda: None)  # no engine yet: the server answers 503 while "loading"
    try:
        lock = running_server()
        assert lock is not None and lock.url == handle.url
        with pytest.raises(BenchError, match="a homelab server is running"):
            refuse_if_server_running()
    finally:
        handle.stop()
    assert running_server() is None
    refuse_if_server_running()  # no server: no error
