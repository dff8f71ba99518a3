"""``REPO[:QUANT]`` as a model: the downloaded copy when there is one, else remote headers.

The planner's ``resolve_model`` calls :func:`hub_variants` for names shaped like a repo, so
``homelab plan org/name`` plans every quant of a repo before anything is downloaded, and
``homelab plan org/name:Q4_K_M`` plans one.
"""

from __future__ import annotations

from homelab.errors import HubError
from homelab.gguf.model import ModelInfo
from homelab.gguf.reader import read_model
from homelab.hub.client import RepoListing, repo_listing, require_online
from homelab.hub.pull import cached_entries, choose_entry, find_cached
from homelab.hub.quants import ModelRef, parse_model_ref
from homelab.hub.remote import remote_model, remote_models
from homelab.hub.settings import HubSettings, hub_settings


def looks_like_repo(name: str) -> bool:
    return parse_model_ref(name) is not None


def hub_variants(name: str, quant: str | None = None) -> list[ModelInfo] | None:
    """The quant variants ``name`` stands for, or None when it is not shaped like a repo.

    With a quant (``org/name:Q4_K_M`` or ``quant``): that one. Without: every quant the repo
    has (headers read remotely, in parallel); offline, the downloaded ones.
    """
    ref = parse_model_ref(name)
    if ref is None:
        return None
    if quant or ref.selector:
        return [resolve_hub_model(name, quant)]
    settings = hub_settings()
    if settings.offline:
        return _cached_models(settings, ref)
    listing = repo_listing(settings, ref.repo_id)
    return _all_entries(settings, listing)


def resolve_hub_model(name: str, quant: str | None = None) -> ModelInfo:
    """The ModelInfo of ``name`` (``org/repo`` or ``org/repo:QUANT``; ``quant`` overrides)."""
    ref = parse_model_ref(name)
    if ref is None:
        raise HubError(f"{name!r} is not a hub repo name.", hint="Use org/name or org/name:QUANT.")
    if quant:
        ref = ModelRef(ref.repo_id, quant)
    settings = hub_settings()
    cached = find_cached(settings, ref)
    if cached is not None:
        return read_model(cached.paths[0])
    require_online(settings, f"read the header of {ref}")
    listing = repo_listing(settings, ref.repo_id)
    return remote_model(settings, listing, choose_entry(listing, ref.selector))


def _cached_models(settings: HubSettings, ref: ModelRef) -> list[ModelInfo]:
    found = cached_entries(settings, ref.repo_id)
    newest = [c for c in found if c.commit == found[0].commit] if found else []
    if not newest:
        raise HubError(
            f"Nothing of {ref} is downloaded, and HF_HUB_OFFLINE is set.",
            hint="Unset HF_HUB_OFFLINE to read the repo's headers from the hub.",
        )
    return [read_model(c.paths[0]) for c in newest]


def _all_entries(settings: HubSettings, listing: RepoListing) -> list[ModelInfo]:
    if not listing.entries:
        raise HubError(
            f"{listing.repo_id} has no GGUF model files.",
            hint="Search for a GGUF repo with `homelab search WORDS`.",
        )
    models = remote_models(settings, listing, listing.entries)
    readable = [m for m in models if isinstance(m, ModelInfo)]
    if not readable:
        raise next(m for m in models if not isinstance(m, ModelInfo))
    return readable
