"""llama.cpp's RPC backend: remote workers as devices of this process, and a worker in-process.

A *worker* (``homelab worker``, llama.cpp's ``rpc-server``) offers its local devices over TCP;
the main process registers each worker's endpoint with ggml (:func:`register_workers`), after
which the worker's devices are in llama.cpp's device list — named ``RPC<n>``, with buffers
logged as ``RPC<d>[HOST:PORT]`` — and a model's layers can be split over them.

llama.cpp aborts the whole process when it cannot connect to a worker or the worker speaks
another protocol version. So before any ggml call touches an endpoint, :func:`probe` does the
handshake itself from Python (a HELLO and a device count, with a timeout) and turns each
failure into an :class:`RpcError` that names the worker. A worker lost *while in use* is
llama.cpp's abort too: ``homelab.llamacpp.abort`` keeps the process alive, and
:func:`worker_lost` names the worker gone (:func:`serves_a_client` asks each one). The
protocol has no authentication: a worker must only be reachable over loopback or a private
link.

    RpcError            (EngineError)
      RpcUnavailable        this llama.cpp build has no RPC backend (built without GGML_RPC)
      WorkerUnreachable     nothing answers at the endpoint (or it is not an RPC worker)
      WorkerBusy            it accepted the connection but serves another client
      WorkerVersionMismatch it speaks another RPC protocol version
      WorkerLost            a worker in use went away (the engine over it is failed)
"""

from __future__ import annotations

import ctypes
import socket
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from homelab.errors import EngineError
from homelab.llamacpp import abort
from homelab.llamacpp._lib import ggml_library, to_bytes
from homelab.llamacpp.devices import devices as local_devices
from homelab.llamacpp.devices import open_registry

# ggml-rpc.h of the vendored llama.cpp: a client and a worker must agree on the major
# version, and the worker's minor version must not be newer than the client's.
PROTOCOL_VERSION = (7, 0, 0)
DEFAULT_PORT = 50052
PROBE_TIMEOUT_S = 5.0
RPC_REBUILD_HINT = (
    'Rebuild llama-cpp-python with the RPC backend: CMAKE_ARGS="-DGGML_RPC=on" '
    ".venv/bin/pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36 "
    "(or `make` in a fresh checkout)."
)

_CMD_HELLO = 14  # enum rpc_cmd (ggml-rpc.cpp); HELLO is pinned to 14 across versions
_CMD_DEVICE_COUNT = 15
_CONN_CAPS_SIZE = 24  # rpc_msg_hello_req: uint8 conn_caps[24]
_HELLO_RESPONSE_SIZE = 4 + _CONN_CAPS_SIZE  # major, minor, patch, padding, conn_caps
_GPU_DEVICE = 1  # enum ggml_backend_dev_type

_registered: dict[str, int] = {}  # endpoint -> its ggml backend registry
_register_lock = threading.Lock()


class RpcError(EngineError):
    title = "llama.cpp RPC"


class RpcUnavailable(RpcError):
    def __init__(self, why: str) -> None:
        super().__init__(f"This llama.cpp build has no RPC backend ({why}).", hint=RPC_REBUILD_HINT)


class WorkerUnreachable(RpcError):
    def __init__(self, endpoint: str, why: str) -> None:
        self.endpoint = endpoint
        super().__init__(
            f"RPC worker {endpoint} is unreachable: {why}.",
            hint=f"Start it there with `homelab worker --port {port_of(endpoint)}` (or check "
            "the SSH tunnel / private link to it).",
        )


class WorkerBusy(RpcError):
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        super().__init__(
            f"RPC worker {endpoint} accepted the connection but did not answer: it serves one "
            "client at a time and is probably busy with another one.",
            hint="Stop the other homelab process that uses this worker, or start another "
            "worker on a different port.",
        )


class WorkerVersionMismatch(RpcError):
    def __init__(self, endpoint: str, version: str) -> None:
        self.endpoint = endpoint
        ours = ".".join(map(str, PROTOCOL_VERSION))
        super().__init__(
            f"RPC worker {endpoint} speaks RPC protocol {version}; this llama.cpp speaks {ours}.",
            hint="Run the same llama-cpp-python release (0.3.36) on the worker and here.",
        )


@dataclass(frozen=True)
class WorkerDevice:
    """One device a worker offers, with the memory it reports now."""

    endpoint: str
    index: int  # the device's index on its worker
    free_bytes: int
    total_bytes: int

    @property
    def buffer_name(self) -> str:
        """How llama.cpp names this device's buffers in its log: ``RPC0[10.0.0.5:50052]``."""
        return f"RPC{self.index}[{self.endpoint}]"


@dataclass(frozen=True)
class WorkerInfo:
    endpoint: str
    version: str  # the worker's protocol version, "7.0.0"
    devices: tuple[WorkerDevice, ...]


# --- endpoints --------------------------------------------------------------------------


def parse_endpoint(text: str) -> str:
    """``HOST:PORT`` (``[v6]:PORT`` too) normalised; a bare host gets the default port."""
    from homelab.errors import ConfigError

    cleaned = text.strip()
    host, sep, port = cleaned.rpartition(":")
    if not sep or "]" in port:
        host, port = cleaned, str(DEFAULT_PORT)
    host = host.strip()
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"{text!r} is not an RPC worker address.",
            hint=f"Write it as HOST:PORT, e.g. 127.0.0.1:{DEFAULT_PORT}.",
        )
    return f"{host}:{int(port)}"


def port_of(endpoint: str) -> int:
    return int(endpoint.rpartition(":")[2])


def _host_of(endpoint: str) -> str:
    return endpoint.rpartition(":")[0].strip("[]")


# --- the handshake, from Python ---------------------------------------------------------


def probe(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> WorkerInfo:
    """Connect, check the protocol version, count the devices and read their memory."""
    endpoint = parse_endpoint(endpoint)
    try:
        connection = socket.create_connection((_host_of(endpoint), port_of(endpoint)), timeout_s)
    except OSError as error:
        raise WorkerUnreachable(endpoint, error.strerror or str(error)) from error
    with connection:
        version = _hello(connection, endpoint)
        count = _device_count(connection, endpoint)
    devices = tuple(_device_memory(endpoint, index) for index in range(count))
    return WorkerInfo(endpoint, version, devices)


def _hello(connection: socket.socket, endpoint: str) -> str:
    request = struct.pack("<BQ", _CMD_HELLO, _CONN_CAPS_SIZE) + bytes(_CONN_CAPS_SIZE)
    reply = _exchange(connection, endpoint, request)
    if len(reply) != _HELLO_RESPONSE_SIZE:
        raise WorkerVersionMismatch(endpoint, f"with a {len(reply)}-byte handshake")
    major, minor, patch = reply[0], reply[1], reply[2]
    version = f"{major}.{minor}.{patch}"
    if major != PROTOCOL_VERSION[0] or minor > PROTOCOL_VERSION[1]:
        raise WorkerVersionMismatch(endpoint, version)
    return version


def _device_count(connection: socket.socket, endpoint: str) -> int:
    reply = _exchange(connection, endpoint, struct.pack("<BQ", _CMD_DEVICE_COUNT, 0))
    if len(reply) != 4:
        raise WorkerVersionMismatch(endpoint, "with an unexpected device-count reply")
    (count,) = struct.unpack("<I", reply)
    return int(count)


def _exchange(connection: socket.socket, endpoint: str, request: bytes) -> bytes:
    """Send one command; the reply is ``uint64 size`` then ``size`` bytes."""
    try:
        connection.sendall(request)
        (size,) = struct.unpack("<Q", _receive(connection, 8))
        if size > 4096:
            raise WorkerUnreachable(endpoint, "it does not speak llama.cpp's RPC protocol")
        return _receive(connection, size)
    except TimeoutError as error:
        raise WorkerBusy(endpoint) from error
    except ConnectionError as error:
        # an older or newer worker drops a HELLO of the wrong size without answering
        raise WorkerVersionMismatch(endpoint, "that closed the connection at the handshake") from (
            error
        )


def _receive(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionResetError("closed")
        data += chunk
    return data


# --- ggml's RPC functions -----------------------------------------------------------------


def available() -> bool:
    """Whether the installed llama.cpp build has the RPC backend."""
    try:
        _rpc_library()
    except RpcUnavailable:
        return False
    return True


def _rpc_library() -> ctypes.CDLL:
    """The library exporting ``ggml_backend_rpc_*`` (libggml-rpc beside libggml), typed."""
    try:
        library = ggml_library("ggml-rpc")
    except OSError as error:
        raise RpcUnavailable("libggml-rpc.so is not in the wheel") from error
    try:
        library.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    except AttributeError as error:
        raise RpcUnavailable("libggml-rpc.so lacks ggml_backend_rpc_add_server") from error
    library.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    library.ggml_backend_rpc_get_device_memory.restype = None
    library.ggml_backend_rpc_get_device_memory.argtypes = [
        ctypes.c_char_p,
        ctypes.c_uint32,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_size_t),
    ]
    library.ggml_backend_rpc_start_server.restype = None
    library.ggml_backend_rpc_start_server.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_void_p),
    ]
    return library


def _device_memory(endpoint: str, index: int) -> WorkerDevice:
    """``ggml_backend_rpc_get_device_memory`` (only after :func:`probe` reached the worker)."""
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    _rpc_library().ggml_backend_rpc_get_device_memory(
        to_bytes(endpoint), index, ctypes.byref(free), ctypes.byref(total)
    )
    return WorkerDevice(endpoint, index, int(free.value), int(total.value))


def register_workers(endpoints: tuple[str, ...] | list[str]) -> tuple[WorkerInfo, ...]:
    """Make each worker's devices llama.cpp devices of this process (once per endpoint).

    Every endpoint is probed first, so an unreachable or incompatible worker is an
    :class:`RpcError` naming it before llama.cpp is asked anything.
    """
    library = _rpc_library() if endpoints else None
    infos = tuple(probe(endpoint) for endpoint in endpoints)
    with _register_lock:
        for info in infos:
            if info.endpoint in _registered:
                continue
            assert library is not None
            registry = library.ggml_backend_rpc_add_server(to_bytes(info.endpoint))
            if not registry:
                raise WorkerUnreachable(info.endpoint, "it offers no devices")
            ggml = ggml_library("ggml")
            ggml.ggml_backend_register.restype = None
            ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
            ggml.ggml_backend_register(registry)
            _registered[info.endpoint] = int(registry)
    abort.install()  # a worker lost later ends the engine, not the process
    return infos


# --- a worker lost while in use -----------------------------------------------------------

LOSS_PROBE_TIMEOUT_S = 1.0


class WorkerLost(RpcError):
    """A worker in use stopped answering; llama.cpp cannot go on without it (see ``abort``)."""

    title = "RPC worker lost"

    def __init__(self, lost: tuple[str, ...], candidates: tuple[str, ...], detail: str) -> None:
        self.lost = lost
        who = ", ".join(lost or candidates)
        subject = f"RPC worker {who}" if lost else f"One of the RPC workers ({who})"
        super().__init__(
            f"{subject} lost during generation ({detail}) — restart the worker, then restart "
            "homelab serve (or the homelab command that used it).",
            hint="llama.cpp cannot recover a model whose worker went away: the engine "
            "refuses new requests until this process is restarted.",
        )


def worker_lost(endpoints: tuple[str, ...] | list[str], abort_message: str) -> WorkerLost:
    """The error for llama.cpp's RPC abort ``abort_message``, naming the workers gone."""
    candidates = tuple(parse_endpoint(endpoint) for endpoint in endpoints)
    lost = tuple(endpoint for endpoint in candidates if not serves_a_client(endpoint))
    detail = abort_message.rpartition(": ")[2].strip() or "no answer"
    return WorkerLost(lost, candidates, f"llama.cpp: {detail}")


def serves_a_client(endpoint: str, timeout_s: float = LOSS_PROBE_TIMEOUT_S) -> bool:
    """Whether the worker at ``endpoint`` is up and busy with a client — this process, which
    still holds its connection. A worker serves one client at a time, so one that answers our
    HELLO (restarted) is no longer ours, and one that refuses is gone."""
    try:
        connection = socket.create_connection((_host_of(endpoint), port_of(endpoint)), timeout_s)
    except OSError:
        return False
    with connection:
        try:
            _hello(connection, endpoint)
        except WorkerBusy:
            return True
        except RpcError:
            return False
    return False


def any_registered() -> bool:
    """Whether this process has registered RPC workers (llama.cpp's default device list then
    includes them, so a load that should not use them must name its devices)."""
    return bool(_registered)


def offload_devices(endpoints: tuple[str, ...] | list[str]) -> list[int]:
    """The devices llama.cpp should split over, in the plan's order: every device of each
    worker in ``endpoints`` (registered), then the local GPUs — ``llama_model_params.devices``."""
    ggml, base = open_registry()
    base.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    base.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    base.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    base.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    chosen: list[int] = []
    for endpoint in endpoints:
        registry = _registered[parse_endpoint(endpoint)]
        for index in range(base.ggml_backend_reg_dev_count(registry)):
            chosen.append(int(base.ggml_backend_reg_dev_get(registry, index)))
    for index in range(ggml.ggml_backend_dev_count()):
        device = ggml.ggml_backend_dev_get(index)
        name = (base.ggml_backend_dev_name(device) or b"").decode()
        if base.ggml_backend_dev_type(device) == _GPU_DEVICE and not name.startswith("RPC"):
            chosen.append(int(device))
    return chosen


# --- a worker in this process -----------------------------------------------------------


@dataclass(frozen=True)
class LocalDevice:
    name: str  # "CPU", "CUDA0"
    description: str
    free_bytes: int
    total_bytes: int


def worker_devices(names: tuple[str, ...] = ()) -> tuple[LocalDevice, ...]:
    """The local devices a worker offers: ``names``, or every GPU (the CPU when there is none)."""
    known = local_devices()
    if names:
        by_name = {d.name.lower(): d for d in known}
        missing = [n for n in names if n.lower() not in by_name]
        if missing:
            raise RpcError(
                f"No device named {', '.join(missing)} here.",
                hint=f"Choose from: {', '.join(d.name for d in known)}.",
            )
        chosen = [by_name[n.lower()] for n in names]
    else:
        chosen = [d for d in known if d.kind not in ("cpu", "accel") and "RPC" not in d.name]
        chosen = chosen or [d for d in known if d.kind == "cpu"][:1]
    return tuple(LocalDevice(d.name, d.description, d.free_bytes, d.total_bytes) for d in chosen)


def serve(
    endpoint: str, devices: tuple[LocalDevice, ...], cache_dir: Path | None, n_threads: int
) -> None:
    """Run llama.cpp's RPC server over ``devices`` on ``endpoint``; returns only on failure
    (the port is taken, a backend cannot start). Call it from a thread you can abandon."""
    library = _rpc_library()
    ggml = ggml_library("ggml")
    ggml.ggml_backend_dev_by_name.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_name.argtypes = [ctypes.c_char_p]
    handles = (ctypes.c_void_p * len(devices))(
        *[ggml.ggml_backend_dev_by_name(d.name.encode()) for d in devices]
    )
    cache = to_bytes(cache_dir) if cache_dir is not None else None
    library.ggml_backend_rpc_start_server(
        to_bytes(endpoint), cache, n_threads, len(devices), handles
    )
