"""Fixtures of the RPC tests: real ``homelab worker`` processes on 127.0.0.1, started per test
and always stopped; every test that needs them skips, saying why, when the installed llama.cpp
has no RPC backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from rpc_workers import Worker, free_port


@pytest.fixture(scope="session")
def rpc_build() -> None:
    from homelab.llamacpp.rpc import available

    if not available():
        pytest.skip(
            "the installed llama-cpp-python has no RPC backend (build it with "
            'CMAKE_ARGS="-DGGML_RPC=on", as `make` does)'
        )


@pytest.fixture
def start_worker(rpc_build: None) -> Iterator[Callable[[], Worker]]:
    started: list[Worker] = []

    def start() -> Worker:
        worker = Worker(free_port())
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
        for stream in (worker.process.stdout, worker.process.stderr):
            if stream is not None:
                stream.close()
