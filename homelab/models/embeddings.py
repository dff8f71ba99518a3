"""Plan-then-load when embeddings are involved (what ``homelab serve`` loads), and the
memory planned for them.

- An embedding model (BERT, nomic-bert…, or any GGUF naming a pooling) is served alone:
  :class:`~homelab.engine.embeddings.EmbeddingModelEngine` with the plan's placement and
  threads; ``/v1/embeddings`` works, chat and completions answer 400.
- A generative model served with ``--embeddings mean|cls|last`` gets an
  :class:`~homelab.engine.embeddings.Embedder` beside its engine, on the same weights. Its
  context's bytes (:func:`homelab.planner.embeddings.embedding_memory`) are taken out of the
  budget before the generation context is planned (:func:`planning_hardware`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from homelab.engine.embeddings import (
    Embedder,
    EmbeddingModelEngine,
    EmbeddingOptions,
    is_embedding_model,
)
from homelab.gguf.reader import read_model
from homelab.models.launch import Overrides, load_plan, planned_file
from homelab.models.ref import ModelRef
from homelab.planner.embeddings import embedding_memory, reserve_embeddings

if TYPE_CHECKING:
    from homelab.engine.engine import Engine
    from homelab.engine.prompt_cache.store import PromptCache
    from homelab.planner.budget import Hardware
    from homelab.planner.plan import Plan

EMBEDDING_POOLINGS = ("mean", "cls", "last")


def planning_hardware(model_path: Path, hardware: Hardware, pooling: str | None) -> Hardware:
    """``hardware`` less an embeddings context beside a generative model (when asked for)."""
    info = read_model(model_path)
    if pooling is None or is_embedding_model(info):
        return hardware
    options = EmbeddingOptions(pooling=pooling)
    memory = embedding_memory(info, options.max_input_tokens, options.n_seq)
    return reserve_embeddings(hardware, memory)


def load_serving_engine(
    ref: ModelRef,
    plan: Plan,
    overrides: Overrides | None = None,
    pooling: str | None = None,
    prompt_cache: PromptCache | None = None,
) -> Engine | EmbeddingModelEngine:
    """The engine ``homelab serve`` runs for ``ref``: an embedding model alone, or the planned
    generation engine (with an embedder beside it when ``pooling`` is given), keeping its
    slots' states in ``prompt_cache`` when one is given."""
    path = planned_file(ref, plan)
    info = read_model(path)
    if is_embedding_model(info):
        settings = (overrides or Overrides()).apply(plan.settings)
        return EmbeddingModelEngine.load(path, settings, info, EmbeddingOptions(pooling=pooling))
    engine = load_plan(ref, plan, overrides, prompt_cache=prompt_cache)
    if pooling is None:
        return engine
    try:
        Embedder.beside(engine, EmbeddingOptions(pooling=pooling))
    except BaseException:
        engine.close()
        raise
    return engine
