"""A model's context, under every name a client reads it from.

* ``/v1/models`` entries (:func:`model_details`): ``context_length`` (OpenRouter's, read by
  LiteLLM-style fetchers), ``max_model_len`` (vLLM's), ``meta.n_ctx`` (llama-server's),
  ``loaded_context_length`` / ``max_context_length`` (LM Studio's), Ollama's capability strings;
* ``/props`` (:func:`props_body`): llama-server's ``default_generation_settings.n_ctx``
  (``?model=NAME`` on a server with several models, as llama-server's router takes it);
* ``/api/v0/models`` (:func:`lmstudio_entry`): LM Studio's REST listing, with ``state`` and
  ``loaded_context_length`` (what LM Studio clients such as Cline read);
* Ollama's ``/api/show`` and ``/api/ps``: :mod:`homelab.server.ollama_models`.

Everywhere it is what one request may use — the slot's context, not the trained maximum.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from fastapi import FastAPI
from starlette.responses import JSONResponse

from homelab import __version__
from homelab.server.config import ServerConfig
from homelab.server.engine_seam import EngineLike
from homelab.server.errors import ApiError, invalid_request
from homelab.server.fleet import Fleet
from homelab.server.ollama_models import ListedModel, capabilities, listed_models


class CardsHost(Protocol):
    config: ServerConfig
    fleet: Fleet | None
    engine_provider: Callable[[], EngineLike | None]


def model_details(engine: EngineLike) -> dict[str, Any]:
    """A loaded model's context and capabilities, under the names clients read them
    (``architecture.input_modalities`` has images when a vision projector is loaded)."""
    template = engine.chat_template
    info = engine.model_info
    caps = capabilities(engine)
    n_ctx = engine.n_ctx_per_slot
    return {
        "context_length": n_ctx,
        "max_model_len": n_ctx,
        "loaded_context_length": n_ctx,
        "max_context_length": n_ctx,
        "meta": {
            "n_ctx": n_ctx,
            "n_ctx_train": info.context_length,
            "n_vocab": info.n_vocab,
            "n_params": info.n_params,
            "size": info.file_bytes,
        },
        "capabilities": caps,
        "supports": {
            "tools": template is not None and template.supports_tools,
            "reasoning": "thinking" in caps,
            "vision": "vision" in caps,
        },
        "architecture": {
            "input_modalities": ["text", "image"] if "vision" in caps else ["text"],
            "output_modalities": ["text"],
        },
    }


def props_body(engine: EngineLike) -> dict[str, Any]:
    """llama-server's ``/props`` for a loaded model."""
    template = engine.chat_template
    n_ctx = engine.n_ctx_per_slot
    return {
        "default_generation_settings": {"n_ctx": n_ctx, "params": {"n_ctx": n_ctx}},
        "n_ctx": n_ctx,
        "total_slots": engine.metrics().n_slots,
        "model_path": engine.model_info.source,
        "chat_template": template.source if template is not None else "",
        "modalities": {"vision": engine.image_marker is not None, "audio": False},
        "build_info": f"homelab {__version__}",
    }


def lmstudio_entry(model: ListedModel) -> dict[str, Any]:
    """One model as LM Studio's ``/api/v0/models`` lists it."""
    engine, info = model.engine, model.info
    caps = capabilities(engine) if engine is not None else []
    kind = "embeddings" if "embedding" in caps and "tools" not in caps else "llm"
    entry: dict[str, Any] = {
        "id": model.name,
        "object": "model",
        "type": "vlm" if "vision" in caps else kind,
        "publisher": "homelab",
        "arch": info.architecture if info is not None else "",
        "compatibility_type": "gguf",
        "quantization": info.file_type if info is not None else "",
        "state": "loaded" if engine is not None else "not-loaded",
    }
    context = model.context_length
    if context is not None:
        entry["max_context_length"] = context
    if engine is not None:
        entry["loaded_context_length"] = engine.n_ctx_per_slot
    return entry


def add_routes(app: FastAPI, host: CardsHost) -> None:
    @app.get("/props")
    async def props(model: str | None = None) -> JSONResponse:
        return JSONResponse(props_body(_loaded_engine(host, model)))

    @app.get("/api/v0/models")
    async def lmstudio_models() -> JSONResponse:
        listed = await listed_models(host.config, host.fleet, host.engine_provider)
        return JSONResponse({"object": "list", "data": [lmstudio_entry(m) for m in listed]})

    @app.get("/api/v0/models/{model}")
    async def lmstudio_model(model: str) -> JSONResponse:
        listed = await listed_models(host.config, host.fleet, host.engine_provider)
        found = next((m for m in listed if m.name == model), None)
        if found is None:
            raise ApiError(404, f"model '{model}' not found", param="model")
        return JSONResponse(lmstudio_entry(found))


def _loaded_engine(host: CardsHost, model: str | None) -> EngineLike:
    if host.fleet is None:
        engine = host.engine_provider()
        if engine is None:
            raise ApiError(503, "The model is still loading. Retry shortly.", code="model_loading")
        return engine
    if not model:
        raise invalid_request("Name the model: /props?model=NAME.", param="model")
    engine = host.fleet.model(model).engine
    if engine is None:
        raise invalid_request(
            f"The model '{model}' is not loaded; a request for it loads it.", param="model"
        )
    return engine
