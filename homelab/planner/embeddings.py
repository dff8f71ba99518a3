"""The memory of an embeddings context beside a model (``homelab serve --embeddings``).

An embeddings context (see ``homelab.engine.embeddings``) holds one decode of whole sequences:
``n_tokens`` cells of K/V shared by its ``n_seq`` sequences (a unified cache; none for an
encoder such as BERT), a compute buffer for a ubatch of ``n_tokens`` (ubatch = batch, so a
sequence is pooled in one piece) and an output buffer of ``n_seq`` rows of logits and vectors.
The same arithmetic as the generation context (:mod:`~homelab.planner.cache`,
:mod:`~homelab.planner.compute`) with those settings; checked against llama.cpp's own buffer
lines by tests/engine/test_embeddings.py.

:func:`reserve_embeddings` takes these bytes out of the device budgets before the generation
context is planned, so the two fit together: from the last GPU (it holds the output layer and
the last blocks, where a partly offloaded model computes) or, without a GPU, from the host.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from homelab.gguf.model import ModelInfo
from homelab.planner.budget import Hardware
from homelab.planner.cache import kv_bytes, pad
from homelab.planner.compute import model_compute_bytes
from homelab.settings import Settings

F32 = 4


@dataclass(frozen=True)
class EmbeddingMemory:
    """Bytes of one embeddings context."""

    n_tokens: int  # the longest input, and the most tokens of one decode
    n_seq: int  # sequences per decode
    kv_bytes: int
    compute_bytes: int
    output_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.kv_bytes + self.compute_bytes + self.output_bytes


def is_causal(model: ModelInfo) -> bool:
    return model.metadata.get(f"{model.architecture}.attention.causal") is not False


def embedding_settings(n_tokens: int, n_seq: int) -> Settings:
    """The context llama.cpp makes for an embeddings context of ``n_tokens`` and ``n_seq``."""
    cells = pad(n_tokens)
    return Settings(
        n_ctx=cells,
        n_ctx_per_slot=cells,
        n_parallel=n_seq,
        n_batch=n_tokens,
        n_ubatch=n_tokens,
        flash_attn=False,
        swa_full=True,
        kv_unified=True,
    )


def embedding_memory(model: ModelInfo, n_tokens: int, n_seq: int) -> EmbeddingMemory:
    n_tokens = min(n_tokens, model.context_length) if model.context_length else n_tokens
    settings = embedding_settings(n_tokens, n_seq)
    return EmbeddingMemory(
        n_tokens=n_tokens,
        n_seq=n_seq,
        kv_bytes=kv_bytes(model, settings) if is_causal(model) else 0,
        compute_bytes=model_compute_bytes(model, settings),
        output_bytes=F32 * n_seq * (model.n_vocab + model.n_embd),
    )


def reserve_embeddings(hardware: Hardware, memory: EmbeddingMemory) -> Hardware:
    """``hardware`` with the embeddings context's bytes taken from the device it lands on."""
    index = len(hardware.devices) - 1  # the last GPU, or the host when there is none
    device = hardware.devices[index]
    budget = max(device.budget_bytes - memory.total_bytes, 0)
    note = f"{device.budget_note}, minus {memory.total_bytes} bytes for the embeddings context"
    reserved = replace(device, budget_bytes=budget, budget_note=note)
    devices = (*hardware.devices[:index], reserved, *hardware.devices[index + 1 :])
    return replace(hardware, devices=devices)
