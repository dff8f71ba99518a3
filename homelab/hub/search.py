"""What ``homelab search`` asks the hub: GGUF repos matching words, and one repo's GGUF files
grouped by quant (the ``--plan`` matrix is :mod:`homelab.hub.matrix`; the text and JSON views
are in :mod:`homelab.hub.render`)."""

from __future__ import annotations

from homelab.hub.client import RepoListing, RepoSummary, repo_listing, search_repos
from homelab.hub.settings import hub_settings


def find_repos(query: str, limit: int) -> list[RepoSummary]:
    """GGUF repos on the hub matching ``query``, most downloaded first."""
    return search_repos(hub_settings(), query, limit)


def repo_files(repo_id: str) -> RepoListing:
    """The GGUF files of ``repo_id`` at its ``main`` commit."""
    return repo_listing(hub_settings(), repo_id)
