"""``homelab worker`` and the RPC handshake: loopback by default, clear errors naming the worker.

The first tests need no RPC build: refusing a network address happens before llama.cpp is
loaded, and the handshake is homelab's own Python. A worker speaking another protocol version
cannot exist here (one llama.cpp is installed), so a socket answering HELLO with version 6 or
hanging up stands in for it; everything else is a real ``homelab worker`` process.
"""

from __future__ import annotations

import signal
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from rpc_workers import Worker, free_port

from homelab.cli import main
from homelab.cli.worker import _endpoint, is_loopback
from homelab.errors import ConfigError
from homelab.llamacpp.rpc import (
    WorkerBusy,
    WorkerUnreachable,
    WorkerVersionMismatch,
    parse_endpoint,
    probe,
)


def test_binding_a_network_address_is_refused_without_allow_network(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["worker", "--host", "0.0.0.0", "--port", str(free_port())]) == 1
    err = capsys.readouterr().err
    assert "Refusing to bind the RPC worker to 0.0.0.0" in err
    assert "no authentication" in err and "SSH tunnel" in err and "--allow-network" in err


def test_allow_network_warns_about_the_unauthenticated_protocol(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _endpoint("10.0.0.5", 50052, allow_network=True) == "10.0.0.5:50052"
    err = capsys.readouterr().err
    assert "WARNING" in err and "no authentication" in err and "WireGuard" in err
    assert _endpoint("127.0.0.1", 50052, allow_network=False) == "127.0.0.1:50052"
    assert capsys.readouterr().err == ""  # loopback: no warning


def test_only_loopback_counts_as_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("127.8.0.1") and is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2")
    assert not is_loopback("my-box.lan")  # a name may resolve to anything


def test_endpoints_are_normalised_and_checked() -> None:
    assert parse_endpoint(" 10.0.0.5:50053 ") == "10.0.0.5:50053"
    assert parse_endpoint("box") == "box:50052"
    with pytest.raises(ConfigError, match="HOST:PORT"):
        parse_endpoint("box:99999")


def test_an_unreachable_worker_is_named() -> None:
    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(WorkerUnreachable, match=f"RPC worker {endpoint} is unreachable"):
        probe(endpoint, timeout_s=2.0)


@contextmanager
def fake_listener(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """A one-connection TCP server on loopback that answers with ``answer``."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    endpoint = f"127.0.0.1:{server.getsockname()[1]}"

    def serve() -> None:
        connection, _ = server.accept()
        with connection:
            answer(connection)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield endpoint
    finally:
        server.close()
        thread.join(timeout=5)


def _read_hello(connection: socket.socket) -> None:
    wanted = 1 + 8 + 24
    data = b""
    while len(data) < wanted:
        data += connection.recv(wanted - len(data))


def test_a_worker_of_another_protocol_version_is_named() -> None:
    def version_6(connection: socket.socket) -> None:
        _read_hello(connection)
        connection.sendall(struct.pack("<Q", 28) + bytes([6, 0, 0, 0]) + bytes(24))

    with fake_listener(version_6) as endpoint:
        expected = f"{endpoint} speaks RPC protocol 6.0.0"
        with pytest.raises(WorkerVersionMismatch, match=expected):
            probe(endpoint, timeout_s=2.0)


def test_a_worker_that_hangs_up_at_the_handshake_is_a_version_mismatch() -> None:
    with fake_listener(_read_hello) as endpoint:  # reads HELLO, closes without answering
        expected = f"RPC worker {endpoint} speaks"
        with pytest.raises(WorkerVersionMismatch, match=expected):
            probe(endpoint, timeout_s=2.0)


def test_a_silent_worker_is_reported_busy() -> None:
    done = threading.Event()
    with fake_listener(lambda connection: done.wait(5)) as endpoint:
        with pytest.raises(WorkerBusy, match=f"{endpoint} accepted the connection"):
            probe(endpoint, timeout_s=0.5)
        done.set()


# --- real workers --------------------------------------------------------------------------


def test_worker_offers_its_cpu_and_answers_the_handshake(
    start_worker: Callable[[], Worker],
) -> None:
    worker = start_worker()
    banner = "".join(worker.banner)
    assert f"listening on {worker.endpoint}" in banner and "  CPU · " in banner
    info = probe(worker.endpoint)
    assert info.version == "7.0.0" and len(info.devices) == 1
    device = info.devices[0]
    assert device.buffer_name == f"RPC0[{worker.endpoint}]"
    assert 0 < device.free_bytes <= device.total_bytes


def test_a_worker_serving_another_client_is_reported_busy(
    start_worker: Callable[[], Worker],
) -> None:
    worker = start_worker()
    with socket.create_connection(("127.0.0.1", worker.port)) as first_client:
        first_client.sendall(struct.pack("<BQ", 14, 24) + bytes(24))
        assert len(first_client.recv(64)) > 0  # the worker now serves this client only
        with pytest.raises(WorkerBusy, match=worker.endpoint):
            probe(worker.endpoint, timeout_s=1.0)
    probe(worker.endpoint)  # free again once that client left


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_worker_stops_cleanly(start_worker: Callable[[], Worker], stop_signal: int) -> None:
    worker = start_worker()
    assert worker.stop(stop_signal) == 0
    assert worker.process.stdout is not None
    assert "homelab worker stopped" in worker.process.stdout.read()
    with pytest.raises(WorkerUnreachable):
        probe(worker.endpoint, timeout_s=1.0)


def test_a_taken_port_is_a_clear_error(
    start_worker: Callable[[], Worker], capsys: pytest.CaptureFixture[str]
) -> None:
    worker = start_worker()
    import subprocess
    import sys

    finished = subprocess.run(
        [sys.executable, "-m", "homelab.cli", "worker", "--port", str(worker.port)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert finished.returncode == 1
    assert f"could not listen on {worker.endpoint}" in finished.stderr


def test_worker_json_is_one_document_on_stdout(rpc_build: None) -> None:
    import json
    import subprocess
    import sys

    port = free_port()
    command = [sys.executable, "-m", "homelab.cli", "worker", "--json", "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--device", "CPU"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        document = json.loads(process.stdout.readline())
        assert document["endpoint"] == f"127.0.0.1:{port}"
        assert [d["name"] for d in document["devices"]] == ["CPU"]
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0 and out == ""  # llama.cpp's own banner went to stderr
    assert "Starting RPC server" in err and "homelab worker stopped" in err
