"""The served models as Ollama describes them: ``/api/tags``, ``/api/show``, ``/api/ps``.

One model (``serve MODEL``) or every model of the fleet, each with its GGUF facts (from the
loaded engine, else read from the file's header off the event loop). The context reported
is what one request of the asking tenant may use — the slot's, not the trained maximum:
the loaded engine's, the fleet's plan for it, or (``/api/show`` of a model not loaded yet) the
plan it would get now, beside the models loaded. :func:`capabilities` is also what
``/v1/models`` reports (Ollama's capability strings).
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio.to_thread

from homelab.errors import HomelabError
from homelab.gguf.model import ModelInfo
from homelab.gguf.reader import read_model
from homelab.server.config import ServerConfig
from homelab.server.engine_seam import EngineLike, LoadedEngine
from homelab.server.fleet import Fleet, FleetModel
from homelab.server.reasoning import detect_reasoning

NEVER = "9999-12-31T23:59:59Z"  # expires_at of a model no keep-alive unloads


@dataclass(frozen=True)
class ListedModel:
    name: str
    info: ModelInfo | None  # None: not loaded yet and its header cannot be read
    engine: EngineLike | None  # None: not loaded
    fleet_model: FleetModel | None = None  # None: the one model of `serve MODEL`
    modified_s: float = 0.0

    @property
    def context_length(self) -> int | None:
        """The context one request may use (None: not known without a plan)."""
        if self.engine is not None:
            return self.engine.n_ctx_per_slot
        plan = self.fleet_model.plan if self.fleet_model is not None else None
        return plan.settings.n_ctx_per_slot if plan is not None else None


def capabilities(engine: EngineLike) -> list[str]:
    """Ollama's capability strings for a loaded model."""
    template = engine.chat_template
    generates = template is not None
    return [
        *(["completion"] if generates or engine.embedder is None else []),
        *(["tools"] if template is not None and template.supports_tools else []),
        *(["thinking"] if template is not None and detect_reasoning(template.source) else []),
        *(["vision"] if engine.image_marker is not None else []),
        *(["embedding"] if engine.embedder is not None else []),
    ]


def header_capabilities(info: ModelInfo) -> list[str]:
    """What a model not loaded yet shows in its header (its projector is known once loaded)."""
    source = info.chat_template or ""
    return [
        "completion",
        *(["tools"] if "tools" in source else []),
        *(["thinking"] if source and detect_reasoning(source) else []),
    ]


async def listed_models(
    config: ServerConfig, fleet: Fleet | None, engine_provider: Callable[[], EngineLike | None]
) -> list[ListedModel]:
    if fleet is None:
        engine = engine_provider()
        info = engine.model_info if engine is not None else None
        return [ListedModel(config.model_id, info, engine, modified_s=_mtime(info))]
    return await anyio.to_thread.run_sync(_fleet_models, fleet)


def _fleet_models(fleet: Fleet) -> list[ListedModel]:
    listed = []
    for name in fleet.names():
        model = fleet.models[name]
        engine = model.engine
        path = model.servable.path
        info = engine.model_info if engine is not None else _header(path)
        listed.append(ListedModel(name, info, engine, model, modified_s=_mtime_of(path)))
    return listed


def _header(path: Path) -> ModelInfo | None:
    try:
        stat = path.stat()
        return _header_at(str(path), stat.st_mtime_ns, stat.st_size)
    except (OSError, HomelabError, ValueError):
        return None


@functools.lru_cache(maxsize=256)
def _header_at(path: str, _mtime_ns: int, _size_bytes: int) -> ModelInfo:
    return read_model(Path(path))


def _mtime(info: ModelInfo | None) -> float:
    return _mtime_of(Path(info.source)) if info is not None else time.time()


def _mtime_of(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()


def _iso(wall_s: float) -> str:
    return datetime.fromtimestamp(wall_s, UTC).isoformat().replace("+00:00", "Z")


def parameter_size(n_params: int) -> str:
    """``7.6B``, ``135M``, ``4.1K``: Ollama's way to write a parameter count."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n_params >= scale:
            return f"{n_params / scale:.1f}{suffix}"
    return str(n_params)


def details(info: ModelInfo | None) -> dict[str, Any]:
    arch = info.architecture if info is not None else ""
    return {
        "parent_model": "",
        "format": "gguf",
        "family": arch,
        "families": [arch] if arch else None,
        "parameter_size": parameter_size(info.n_params) if info is not None else "",
        "quantization_level": info.file_type if info is not None else "",
    }


def _digest(model: ListedModel) -> str:
    """A stable stand-in for Ollama's manifest digest: the file's name, size and time."""
    info = model.info
    key = f"{model.name}:{info.source if info else ''}:{info.file_bytes if info else 0}"
    return hashlib.sha256(f"{key}:{model.modified_s}".encode()).hexdigest()


def tag_entry(model: ListedModel) -> dict[str, Any]:
    return {
        "name": model.name,
        "model": model.name,
        "modified_at": _iso(model.modified_s),
        "size": model.info.file_bytes if model.info is not None else 0,
        "digest": _digest(model),
        "details": details(model.info),
    }


def ps_entry(model: ListedModel) -> dict[str, Any]:
    """A loaded model: its bytes (on GPUs: ``size_vram``), when it unloads, its context."""
    total_bytes, gpu_bytes = _memory_bytes(model)
    return {
        "name": model.name,
        "model": model.name,
        "size": total_bytes,
        "digest": _digest(model),
        "details": details(model.info),
        "expires_at": _expires_at(model.fleet_model),
        "size_vram": gpu_bytes,
        "context_length": model.context_length,
    }


def _memory_bytes(model: ListedModel) -> tuple[int, int]:
    """(all bytes, bytes on GPUs): the fleet's per-device account, or what llama.cpp
    reported allocating for the one model."""
    if model.fleet_model is not None:
        per_device = model.fleet_model.device_bytes()
    elif isinstance(model.engine, LoadedEngine):
        buffers = model.engine.load_report.buffers
        per_device = {}
        for kind in (buffers.model, buffers.kv, buffers.recurrent, buffers.compute, buffers.output):
            for name, n_bytes in kind.items():
                per_device[name] = per_device.get(name, 0) + int(n_bytes)
    else:
        per_device = {}
    total = sum(per_device.values()) or (model.info.file_bytes if model.info else 0)
    gpu = sum(n for name, n in per_device.items() if not name.upper().startswith("CPU"))
    return total, gpu


def _expires_at(model: FleetModel | None) -> str:
    if model is None or model.expires_at is None:
        return NEVER  # `serve MODEL` keeps its model; a busy fleet model is not unloading
    return _iso(time.time() + (model.expires_at - time.monotonic()))


async def show_body(model: ListedModel, fleet: Fleet | None) -> dict[str, Any]:
    info = model.info
    context = model.context_length
    if context is None and fleet is not None and model.fleet_model is not None:
        context = await _planned_context(fleet, model.fleet_model)
    arch = info.architecture if info is not None else "unknown"
    model_info: dict[str, Any] = {"general.architecture": arch}
    if info is not None:
        model_info |= {
            "general.name": info.name,
            "general.parameter_count": info.n_params,
            "general.file_type": info.file_type,
            f"{arch}.block_count": info.n_layer,
            f"{arch}.embedding_length": info.n_embd,
            "homelab.context_length_trained": info.context_length,
        }
    if context is not None:
        model_info[f"{arch}.context_length"] = context
    template = model.engine.chat_template if model.engine is not None else None
    caps = capabilities(model.engine) if model.engine is not None else None
    return {
        "modelfile": f"# served by homelab: {model.name}\n",
        "parameters": "",
        "template": template.source
        if template is not None
        else (info and info.chat_template) or "",
        "details": details(info),
        "model_info": model_info,
        "capabilities": caps if caps is not None else header_capabilities(info) if info else [],
        "modified_at": _iso(model.modified_s),
    }


async def _planned_context(fleet: Fleet, model: FleetModel) -> int | None:
    """The context a model not loaded would get if it loaded now, beside the residents."""
    left = fleet.hardware_left([m for m in fleet.residents() if m is not model])
    try:
        plan = await anyio.to_thread.run_sync(fleet.plan_fn, model.servable, left)
    except (HomelabError, OSError, ValueError):
        return None
    return plan.settings.n_ctx_per_slot
