"""Loading a GGUF into llama.cpp: the one loader of the engine, the dry run and quality runs.

:class:`ModelParams` says where the weights go: ``n_gpu_layers`` (llama.cpp offloads the
output head first, then the last blocks), ``n_cpu_moe`` (MoE expert tensors of the first N
blocks stay in host memory, through tensor buffer-type overrides — llama.cpp's
``--n-cpu-moe``) and ``allocate``. ``allocate=False`` is the dry run: ``no_alloc`` with
``LLAMA_LOAD_MODE_NONE`` (the mmap path asserts in that mode); llama.cpp then sizes every
buffer and logs it, in milliseconds, without reading or allocating the weights.

A failed load raises :class:`ModelLoadError`, which keeps llama.cpp's log: the engine reads
from it whether the failure was about memory (then stepping down can help).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from homelab.errors import EngineError
from homelab.llamacpp._lib import Closing, lib, to_bytes
from homelab.llamacpp.devices import cpu_buffer_type
from homelab.llamacpp.log import capture_log, is_memory_failure, joined, problem_lines
from homelab.llamacpp.rpc import any_registered, offload_devices, register_workers
from homelab.llamacpp.vocab import Vocab
from homelab.settings import Settings

ALL_LAYERS = -1  # n_gpu_layers: every layer the devices can take (llama.cpp's default)


@dataclass(frozen=True)
class ModelParams:
    """Where llama.cpp puts a model's weights, and whether it allocates them at all."""

    n_gpu_layers: int = ALL_LAYERS
    n_cpu_moe: int = 0  # MoE experts of blocks 0..n_cpu_moe-1 stay in host memory
    allocate: bool = True  # False: the dry run (sizes logged, nothing read or allocated)
    rpc_servers: tuple[str, ...] = ()  # RPC workers whose devices come first (registered)
    tensor_split: tuple[float, ...] = ()  # share of the offloaded layers per device
    split_mode: str = "layer"  # "layer", "row" (CUDA: matrices split by rows), "none"
    main_gpu: int = 0  # the one offload device of split_mode "none"
    vocab_only: bool = False  # the tokenizer alone (a ggml-vocab-*.gguf has no weights)

    @classmethod
    def from_settings(cls, settings: Settings, *, allocate: bool = True) -> ModelParams:
        return cls(
            settings.n_gpu_layers,
            settings.n_cpu_moe,
            allocate,
            tuple(settings.rpc_servers),
            tuple(float(share) for share in settings.tensor_split),
            settings.split_mode,
            settings.main_gpu,
        )


class ModelLoadError(EngineError):
    """llama.cpp refused to load a file; ``log_text`` is what it logged while trying."""

    def __init__(self, path: Path, log_text: str) -> None:
        self.path = path
        self.log_text = log_text
        self.for_memory = is_memory_failure(log_text)
        self.reason = problem_lines(log_text)
        super().__init__(
            f"llama.cpp could not load the model from {path}: {self.reason}",
            hint="Check that the file is a complete GGUF of an architecture this llama.cpp "
            "knows, and that its weights fit in memory.",
        )


def expert_override_patterns(n_cpu_moe: int) -> list[str]:
    """llama.cpp's ``--n-cpu-moe N`` patterns: the experts of blocks 0..N-1 in host memory."""
    return [rf"blk\.{i}\.ffn_(up|down|gate|gate_up)_(ch|)exps" for i in range(n_cpu_moe)]


class _BuftOverride(ctypes.Structure):  # struct llama_model_tensor_buft_override
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


class Model(Closing):
    """A loaded llama.cpp model; free it with :meth:`close` (or use it as a context manager)."""

    def __init__(self, pointer: Any, path: Path, load_log: str, keepalive: list[Any]) -> None:
        self._lib = lib()
        self.pointer: Any = pointer
        self.path = path
        self.load_log = load_log  # llama.cpp's log of the load (buffer sizes, placement)
        self._keepalive = keepalive  # ctypes memory the load parameters point to
        self.vocab = Vocab(self._lib.llama_model_get_vocab(pointer))

    @classmethod
    def load(cls, path: str | Path, params: ModelParams | None = None) -> Model:
        """Load ``path`` (the first part of a split set names the whole set)."""
        path = Path(path)
        keepalive: list[Any] = []
        params = params or ModelParams()
        if params.rpc_servers:
            register_workers(params.rpc_servers)  # RpcError naming the worker, before loading
        c_params = _c_params(params, keepalive)
        with capture_log() as lines:
            pointer = lib().llama_model_load_from_file(to_bytes(path), c_params)
        if not pointer:
            raise ModelLoadError(path, joined(lines))
        return cls(pointer, path, joined(lines), keepalive)

    @property
    def keeps_recurrent_state(self) -> bool:
        """Recurrent or hybrid (Mamba, RWKV, Jamba…): its memory cannot drop a suffix."""
        return bool(self._lib.llama_model_is_recurrent(self.pointer)) or bool(
            self._lib.llama_model_is_hybrid(self.pointer)
        )

    @property
    def n_params(self) -> int:
        return int(self._lib.llama_model_n_params(self.pointer))

    def close(self) -> None:
        if self.pointer is not None:
            self.vocab.pointer = None  # it lives in the model: tokenizing now would crash
            self._lib.llama_model_free(self.pointer)
            self.pointer = None


def _c_params(params: ModelParams, keepalive: list[Any]) -> Any:
    module = lib()
    c_params = module.llama_model_default_params()
    c_params.n_gpu_layers = params.n_gpu_layers
    c_params.vocab_only = params.vocab_only
    if not params.allocate:
        c_params.no_alloc = True
        c_params.load_mode = module.LLAMA_LOAD_MODE_NONE
    if params.n_cpu_moe > 0:
        c_params.tensor_buft_overrides = _expert_overrides(params.n_cpu_moe, keepalive)
    if params.rpc_servers or any_registered():  # workers of an earlier load stay registered
        c_params.devices = _device_list(offload_devices(params.rpc_servers), keepalive)
    c_params.split_mode = _split_mode_id(params.split_mode)
    c_params.main_gpu = params.main_gpu
    if params.tensor_split and params.split_mode != "none":  # none: one device, no split
        shares = (ctypes.c_float * module.llama_max_devices())(*params.tensor_split)
        keepalive.append(shares)
        c_params.tensor_split = ctypes.cast(shares, ctypes.POINTER(ctypes.c_float))
    return c_params


SPLIT_MODE_IDS = {"none": 0, "layer": 1, "row": 2}  # enum llama_split_mode


def _split_mode_id(split_mode: str) -> int:
    if split_mode not in SPLIT_MODE_IDS:
        raise EngineError(
            f"split mode {split_mode!r} is not one llama.cpp knows",
            hint=f"Use one of: {', '.join(SPLIT_MODE_IDS)}.",
        )
    return SPLIT_MODE_IDS[split_mode]


def _device_list(devices: list[int], keepalive: list[Any]) -> int:
    """A NULL-terminated ``ggml_backend_dev_t`` array (llama_model_params.devices)."""
    array = (ctypes.c_void_p * (len(devices) + 1))(*devices)
    keepalive.append(array)
    return ctypes.addressof(array)


def _expert_overrides(n_cpu_moe: int, keepalive: list[Any]) -> int:
    """A NULL-terminated override array for :func:`expert_override_patterns`; its address."""
    patterns = [p.encode() for p in expert_override_patterns(n_cpu_moe)]
    host = cpu_buffer_type()
    overrides = (_BuftOverride * (len(patterns) + 1))()  # the last entry stays NULL
    for entry, pattern in zip(overrides, patterns, strict=False):
        entry.pattern, entry.buft = pattern, host
    keepalive.extend([patterns, overrides])  # llama.cpp reads them while loading
    return ctypes.addressof(overrides)
