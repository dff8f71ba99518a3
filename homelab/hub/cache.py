"""The Hugging Face cache on disk, in the layout ``huggingface_hub`` itself reads and writes.

    <cache>/models--<org>--<name>/
        blobs/<sha256>                      file contents, named by their LFS sha256
        snapshots/<commit>/<path>           symlinks to the blobs, as the repo lays them out
        refs/main                           the commit ``main`` pointed at when last fetched

homelab's downloads land here, so ``hf_hub_download``, llama.cpp's ``-hf`` and other tools
find them, and files they fetched are found by homelab. A download in progress lives next to
its blob as ``<sha256>.homelab-partial`` and survives an interruption, to be resumed.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from homelab.hub.quants import RemoteFile

PARTIAL_SUFFIX = ".homelab-partial"


@dataclass(frozen=True)
class CachedFile:
    """A file of a repo as found in a snapshot folder."""

    commit: str
    path: str  # path inside the repo
    local_path: Path  # the snapshot entry (a symlink to the blob, or a plain file)


def repo_dir(cache_dir: Path, repo_id: str) -> Path:
    return cache_dir / ("models--" + repo_id.replace("/", "--"))


def blob_name(remote: RemoteFile) -> str | None:
    """The blob's name: the LFS sha256, else the git blob id; None when the hub gave neither."""
    return remote.sha256 or remote.blob_id


def blob_path(cache_dir: Path, repo_id: str, name: str) -> Path:
    return repo_dir(cache_dir, repo_id) / "blobs" / name


def lock_path(cache_dir: Path, repo_id: str, name: str) -> Path:
    """The lock ``huggingface_hub`` also takes while it downloads this blob."""
    path = cache_dir / ".locks" / repo_dir(cache_dir, repo_id).name / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def snapshot_path(cache_dir: Path, repo_id: str, commit: str, path: str) -> Path:
    return repo_dir(cache_dir, repo_id) / "snapshots" / commit / Path(*path.split("/"))


def read_ref(cache_dir: Path, repo_id: str, revision: str = "main") -> str | None:
    try:
        return (repo_dir(cache_dir, repo_id) / "refs" / revision).read_text().strip() or None
    except OSError:
        return None


def write_ref(cache_dir: Path, repo_id: str, commit: str, revision: str = "main") -> None:
    ref = repo_dir(cache_dir, repo_id) / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    if not ref.exists() or ref.read_text().strip() != commit:
        ref.write_text(commit)


def link_snapshot(blob: Path, pointer: Path) -> None:
    """Point the snapshot entry at the blob: a relative symlink, or a copy where symlinks fail."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_symlink() or pointer.exists():
        pointer.unlink()
    try:
        os.symlink(os.path.relpath(blob, pointer.parent), pointer)
    except OSError:  # e.g. Windows without developer mode: the hub library copies too
        shutil.copyfile(blob, pointer)


def cached_files(cache_dir: Path, repo_id: str) -> list[CachedFile]:
    """Every file in the repo's snapshots, the ``main`` commit's first, then newest first."""
    snapshots = repo_dir(cache_dir, repo_id) / "snapshots"
    if not snapshots.is_dir():
        return []
    main = read_ref(cache_dir, repo_id)
    folders = sorted(snapshots.iterdir(), key=lambda p: (p.name != main, -_mtime(p)))
    found = []
    for folder in folders:
        for local in sorted(folder.rglob("*")):
            if local.is_file():  # follows the symlink: a dangling link is not a file
                found.append(CachedFile(folder.name, local.relative_to(folder).as_posix(), local))
    return found


def cached_repos(cache_dir: Path) -> list[str]:
    """Repo ids of the model repos in the cache."""
    if not cache_dir.is_dir():
        return []
    names = (p.name for p in cache_dir.iterdir() if p.name.startswith("models--"))
    return sorted(name.removeprefix("models--").replace("--", "/", 1) for name in names)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
