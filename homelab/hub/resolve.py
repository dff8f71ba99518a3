"""``REPO[:QUANT]`` as a model: the downloaded copy when there is one, else remote headers.

A hub ref of :mod:`homelab.models.ref` plans over :func:`hub_variants`, so
``homelab plan org/name`` plans every quant of a repo before anything is downloaded, and
``homelab plan org/name:Q4_K_M`` plans one. :func:`best_quant` is what ``homelab pull REPO``
downloads when no quant is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from homelab.errors import HomelabError, HubError
from homelab.gguf.model import ModelInfo
from homelab.gguf.reader import read_model
from homelab.hub import cache
from homelab.hub.client import (
    HubOfflineError,
    HubUnavailableError,
    RepoListing,
    repo_listing,
    require_online,
)
from homelab.hub.pull import cached_entries, choose_entry, find_cached
from homelab.hub.quants import GgufEntry, ModelRef, parse_model_ref
from homelab.hub.remote import remote_model, remote_models
from homelab.hub.settings import HubSettings, hub_settings

if TYPE_CHECKING:
    from homelab.planner.budget import Hardware


def hub_variants(name: str, quant: str | None = None) -> list[ModelInfo] | None:
    """The quant variants ``name`` stands for, or None when it is not shaped like a repo.

    With a quant (``org/name:Q4_K_M`` or ``quant``): that one. Without: every quant the repo
    has (headers read remotely, in parallel); offline, the downloaded ones. When the hub
    cannot be reached and nothing is downloaded, a repo the model catalogue knows gives None
    too, so the planner falls back to the catalogue.
    """
    ref = parse_model_ref(name)
    if ref is None:
        return None
    try:
        return _variants(ref, name, quant)
    except HubUnavailableError:
        if ref.selector is None and _in_catalogue(ref.repo_id):
            return None
        raise


def _variants(ref: ModelRef, name: str, quant: str | None) -> list[ModelInfo]:
    if quant or ref.selector:
        return [resolve_hub_model(name, quant)]
    settings = hub_settings()
    if settings.offline:
        return _cached_models(settings, ref)
    return _all_entries(settings, repo_listing(settings, ref.repo_id))


def _in_catalogue(repo_id: str) -> bool:
    from homelab.gguf.catalogue import find_model

    try:
        find_model(repo_id)
    except HomelabError:
        return False
    return True


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
        raise HubOfflineError(
            f"Nothing of {ref} is downloaded, and HF_HUB_OFFLINE is set.",
            hint="Unset HF_HUB_OFFLINE to read the repo's headers from the hub.",
        )
    return [read_model(c.paths[0]) for c in newest]


def _all_entries(settings: HubSettings, listing: RepoListing) -> list[ModelInfo]:
    """Every entry: downloaded ones read from disk (the planner can dry-run them), the rest
    from remote headers."""
    if not listing.entries:
        raise HubError(
            f"{listing.repo_id} has no GGUF model files.",
            hint="Search for a GGUF repo with `homelab search WORDS`.",
        )
    local = {e: _downloaded(settings, listing, e) for e in listing.entries}
    remote = [e for e, path in local.items() if path is None]
    fetched = dict(zip(remote, remote_models(settings, listing, tuple(remote)), strict=True))
    models = [read_model(path) if path else fetched[e] for e, path in local.items()]
    readable = [m for m in models if isinstance(m, ModelInfo)]
    if not readable:
        raise next(m for m in models if not isinstance(m, ModelInfo))
    return readable


def _downloaded(settings: HubSettings, listing: RepoListing, entry: GgufEntry) -> Path | None:
    paths = [
        cache.snapshot_path(settings.cache_dir, listing.repo_id, listing.commit, f.path)
        for f in entry.files
    ]
    return paths[0] if all(p.is_file() for p in paths) else None


def best_quant(ref: ModelRef, hardware: Hardware) -> tuple[ModelRef, GgufEntry | None]:
    """``ref`` with the quant the planner picks for ``hardware`` (headers read remotely) and
    that entry; ``ref`` itself when there is nothing to choose (a quant given, offline, a
    repo with one file)."""
    settings = hub_settings()
    if ref.selector is not None or settings.offline:
        return ref, None  # offline, pull() uses what is cached, or says why it cannot
    listing = repo_listing(settings, ref.repo_id)
    if len(listing.entries) <= 1:
        return ref, None
    from homelab.hub.matrix import best_entry

    entry = best_entry(settings, listing, hardware)
    return ModelRef(ref.repo_id, entry.label), entry
