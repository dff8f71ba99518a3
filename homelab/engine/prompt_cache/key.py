"""What a saved state belongs to: the model's weights and the cache layout that shaped it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from homelab.settings import Settings

DIGEST_HEX_CHARS = 24


@dataclass(frozen=True)
class ModelKey:
    """A model (``homelab.gguf.identity.model_identity``) and the layout of its cache."""

    model_id: str
    layout: str  # e.g. "k=f16 v=f16 fa=0 cells=4096 streams=2 swa_full=0"

    @property
    def digest(self) -> str:
        """A short, file-name safe name for this key (the folder its states live in)."""
        return short_digest(f"{self.model_id}|{self.layout}")


def layout_of(settings: Settings, n_ctx_per_slot: int, n_slots: int) -> str:
    """The settings a state's bytes depend on. llama.cpp restores a state only into a cache
    with the same streams (one per slot unless unified) and enough cells; the K/V types and
    flash attention (V transposed or not) decide what the bytes mean."""
    n_streams = 1 if settings.kv_unified else n_slots
    return (
        f"k={settings.type_k} v={settings.type_v} fa={int(settings.flash_attn)} "
        f"cells={n_ctx_per_slot} streams={n_streams} swa_full={int(settings.swa_full)}"
    )


def short_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:DIGEST_HEX_CHARS]


def tokens_digest(tokens: np.ndarray) -> str:
    """A short digest of int32 token ids (their little-endian bytes)."""
    return hashlib.sha256(tokens.astype("<i4", copy=False).tobytes()).hexdigest()[:DIGEST_HEX_CHARS]


# A tenant's identity: its name, and the generation its keys file gave the name with its first
# key ("name#5f0c2a9e81d4"; names never hold "#"). Whatever is kept for a tenant — slots,
# saved states, stored responses — is kept under its identity, so a name given again to a new
# key holder finds nothing of the old one's; a bare name (no generation) is its own identity.
IDENTITY_MARK = "#"


def tenant_identity(name: str, generation: str = "") -> str:
    return f"{name}{IDENTITY_MARK}{generation}" if generation else name


def tenant_name(identity: str) -> str:
    """The name part of a tenant identity."""
    return identity.partition(IDENTITY_MARK)[0]


def tenant_matches(identity: str, wanted: str | None) -> bool:
    """Whether ``identity`` is ``wanted``: that identity, every identity of that name (a bare
    name), or any (None)."""
    return wanted is None or identity == wanted or tenant_name(identity) == wanted
