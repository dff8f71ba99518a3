"""The one doorway to NVML (the NVIDIA Management Library, via ``pynvml``).

Nothing else in homelab imports ``pynvml``. Everything NVML goes through :class:`Nvml`, which

* turns an unsupported query (old driver, GeForce card without a sensor, container without
  permission) into ``None`` — shown as "N/A" — instead of raising;
* logs a function the driver lacks once, and remembers it so the report can say so;
* explains each NVML error with its usual cause (:data:`NVML_ERRORS`), so "no GPU" is always
  one readable sentence, never a traceback.

The module object is injectable (``open_nvml(fake)``): there is no NVIDIA GPU on the machines
the tests run on, so tests hand in a fake ``pynvml`` with the same function names.
"""

from __future__ import annotations

import atexit
import logging
import threading
from types import ModuleType
from typing import Any, NamedTuple

logger = logging.getLogger(__name__)


class NvmlErrorInfo(NamedTuple):
    label: str
    usual_cause: str


# NVML return codes (nvml.h) with the situation that usually produces them.
NVML_ERRORS: dict[int, NvmlErrorInfo] = {
    1: NvmlErrorInfo("NVML not initialized", "nvmlInit was not called or was shut down (a bug)"),
    2: NvmlErrorInfo("invalid argument", "a bad device index or handle was passed"),
    3: NvmlErrorInfo("not supported", "this GPU or driver does not offer the query"),
    4: NvmlErrorInfo(
        "insufficient permissions",
        "the query needs root, or the container was not given access to the device",
    ),
    5: NvmlErrorInfo("already initialized", "harmless: NVML was initialized twice"),
    6: NvmlErrorInfo("not found", "the device or process disappeared while being queried"),
    7: NvmlErrorInfo("insufficient size", "a buffer was too small (pynvml retries this itself)"),
    8: NvmlErrorInfo("insufficient external power", "a PCIe power cable is not plugged in"),
    9: NvmlErrorInfo(
        "NVIDIA driver not loaded",
        "the nvidia kernel module is not loaded (DKMS build failed after a kernel update, "
        "or Secure Boot blocked it); check `lsmod | grep nvidia` and `dmesg`",
    ),
    10: NvmlErrorInfo("timeout", "the GPU did not answer in time; check `dmesg`"),
    11: NvmlErrorInfo("interrupt problem", "the kernel reports an IRQ issue with the GPU"),
    12: NvmlErrorInfo(
        "NVML library not found (libnvidia-ml.so.1)",
        "no NVIDIA driver is installed, or this container was started without the NVIDIA "
        "runtime (`docker run --gpus all`)",
    ),
    13: NvmlErrorInfo(
        "function not found",
        "the NVIDIA driver is older than this query; update the driver to get it",
    ),
    14: NvmlErrorInfo("corrupted infoROM", "the GPU's infoROM is damaged; the GPU may misbehave"),
    15: NvmlErrorInfo(
        "GPU is lost",
        "the GPU fell off the bus (power, cooling or riser problem); a reboot is needed",
    ),
    16: NvmlErrorInfo("GPU reset required", "reset the GPU (`nvidia-smi -r`) or reboot"),
    17: NvmlErrorInfo("blocked by the operating system", "the OS refused the request"),
    18: NvmlErrorInfo(
        "driver/library version mismatch",
        "the NVIDIA driver was upgraded but the old kernel module is still loaded; reboot",
    ),
    19: NvmlErrorInfo("in use", "another process holds the resource"),
    20: NvmlErrorInfo("insufficient host memory", "the host ran out of memory"),
    21: NvmlErrorInfo("no data", "the driver has no sample yet for this query"),
    25: NvmlErrorInfo(
        "argument version mismatch",
        "nvidia-ml-py is newer than the driver for this query; update the driver",
    ),
    26: NvmlErrorInfo("deprecated", "the driver no longer offers this query"),
    27: NvmlErrorInfo("not ready", "the GPU is still initializing"),
    28: NvmlErrorInfo("GPU not found", "the device is gone or hidden from this process"),
    999: NvmlErrorInfo("unknown NVML error", "check `nvidia-smi` and `dmesg`"),
}

NOT_SUPPORTED = 3
FUNCTION_NOT_FOUND = 13


class NvmlUnavailable(Exception):
    """NVML cannot be used at all; ``reason`` is one sentence saying why and what to do."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def nvml_error_types(library: Any) -> tuple[type[BaseException], ...]:
    """NVMLError, plus the error pynvml raises when its struct version is newer than the driver."""
    names = ("NVMLError", "NVMLLibraryMismatchError")
    found = [getattr(library, name, None) for name in names]
    return tuple(kind for kind in found if isinstance(kind, type)) or (Exception,)


def error_code(error: BaseException) -> int | None:
    if type(error).__name__ == "NVMLLibraryMismatchError":
        return FUNCTION_NOT_FOUND  # an unversioned call the driver is too old for
    value = getattr(error, "value", None)
    return value if isinstance(value, int) else None


def explain(error: BaseException) -> str:
    """One line: what NVML said and what usually causes it."""
    code = error_code(error)
    return explain_code(code) if code is not None else f"NVML failed ({type(error).__name__})"


def explain_code(code: int | None) -> str:
    info = NVML_ERRORS.get(code) if code is not None else None
    if info is None:
        return f"NVML error {code}"
    return f"{info.label} — {info.usual_cause}"


class Nvml:
    """An initialized NVML library. Every query returns ``None`` when it cannot be answered."""

    def __init__(self, library: Any) -> None:
        self._library = library
        self._error_types = nvml_error_types(library)
        self._missing: set[str] = set()
        self._lock = threading.Lock()

    @property
    def library(self) -> Any:
        return self._library

    @property
    def missing_functions(self) -> tuple[str, ...]:
        """Functions this driver (or nvidia-ml-py) lacks, sorted by name."""
        with self._lock:
            return tuple(sorted(self._missing))

    def constant(self, name: str, default: int) -> int:
        value = getattr(self._library, name, default)
        return value if isinstance(value, int) else default

    def query(self, function_name: str, *args: object) -> Any | None:
        """Call an NVML function; ``None`` if the driver cannot answer (the field shows N/A)."""
        return self.attempt(function_name, *args)[0]

    def query_any(self, function_names: tuple[str, ...], *args: object) -> Any | None:
        """The first of several versions of a query that the driver answers (newest first)."""
        for function_name in function_names:
            value, code = self._call(function_name, args)
            if code is None:
                return value
            if code != FUNCTION_NOT_FOUND:
                return None
        self._note_missing(function_names[0])
        return None

    def attempt(self, function_name: str, *args: object) -> tuple[Any | None, int | None]:
        """Like :meth:`query`, also returning the NVML error code (None on success)."""
        value, code = self._call(function_name, args)
        if code == FUNCTION_NOT_FOUND:
            self._note_missing(function_name)
        return value, code

    def _call(self, function_name: str, args: tuple[object, ...]) -> tuple[Any | None, int | None]:
        function = getattr(self._library, function_name, None)
        if not callable(function):
            return None, FUNCTION_NOT_FOUND
        try:
            return function(*args), None
        except self._error_types as error:
            code = error_code(error)
            if code != FUNCTION_NOT_FOUND:
                logger.debug("NVML %s: %s", function_name, explain(error))
            return None, code

    def require(self, function_name: str, *args: object) -> Any:
        """Call an NVML function whose answer we cannot do without; raises NvmlUnavailable."""
        function = getattr(self._library, function_name, None)
        if not callable(function):
            raise NvmlUnavailable(f"the NVIDIA driver lacks {function_name}; update the driver")
        try:
            return function(*args)
        except self._error_types as error:
            raise NvmlUnavailable(f"{function_name} failed: {explain(error)}") from error

    def shutdown(self) -> None:
        self.query("nvmlShutdown")

    def _note_missing(self, function_name: str) -> None:
        with self._lock:
            if function_name in self._missing:
                return
            self._missing.add(function_name)
        logger.info("NVML: the driver lacks %s; that field is reported as N/A", function_name)


def import_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as error:
        raise NvmlUnavailable(
            "the nvidia-ml-py package is not installed (`.venv/bin/pip install nvidia-ml-py`)"
        ) from error
    return pynvml


def open_nvml(library: Any | None = None) -> Nvml:
    """Initialize NVML from ``library`` (default: the real ``pynvml``); raises NvmlUnavailable."""
    library = import_pynvml() if library is None else library
    try:
        library.nvmlInit()
    except nvml_error_types(library) as error:
        raise NvmlUnavailable(explain(error)) from error
    return Nvml(library)


_shared_lock = threading.Lock()
_shared: Nvml | NvmlUnavailable | None = None


def shared_nvml() -> Nvml:
    """The process-wide NVML session over the real pynvml, opened once (for ~1 Hz polling).

    A failure is remembered too, so polling a machine without a driver costs nothing.
    """
    global _shared
    with _shared_lock:
        if _shared is None:
            try:
                _shared = open_nvml()
                atexit.register(_shared.shutdown)
            except NvmlUnavailable as unavailable:
                _shared = unavailable
        if isinstance(_shared, NvmlUnavailable):
            raise NvmlUnavailable(_shared.reason)
        return _shared
