"""The local library: every GGUF model on this machine that homelab can run.

Models are found in the library folders (``<data>/models``, where ``homelab quantize``
writes, plus the folders in ``HOMELAB_MODEL_DIRS``, separated by ``os.pathsep``) and in the
Hugging Face cache (what ``homelab pull`` and other tools downloaded). Each is described by
its own header, so a renamed file still shows its true quant. A split set is one model;
vision projectors and partial downloads are skipped. ``homelab models`` and the TUI's model
picker both list models through :func:`list_local_models`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from homelab.errors import HomelabError, ModelFileError
from homelab.gguf.model import ModelInfo
from homelab.gguf.quantize import Provenance, read_provenance
from homelab.gguf.reader import SPLIT_RE, read_model
from homelab.hub import cache
from homelab.hub.quants import is_projector, parse_model_ref, quant_label
from homelab.hub.settings import hf_cache_dir
from homelab.locations import data_dir

MAX_SCAN_DEPTH = 6  # folders below a library folder that are searched


@dataclass(frozen=True)
class LocalModel:
    """One runnable model on disk (a single file or a whole split set)."""

    path: Path  # the file to load (the first part of a split set)
    origin: str  # where it was found: "hf · org/name" or the library folder
    repo_id: str | None  # the hub repo, for files in the Hugging Face cache
    quant: str  # the weights' type from the header, else from the file name
    size_bytes: int  # all parts together
    info: ModelInfo | None  # None when the header cannot be read (see problem)
    problem: str | None
    provenance: Provenance | None  # set for files made by `homelab quantize`

    @property
    def name(self) -> str:
        match = SPLIT_RE.match(self.path.name)
        return match["stem"] if match else self.path.stem

    @property
    def ref(self) -> str:
        """What to type to use this model: ``REPO:QUANT`` for hub files, else the path."""
        return f"{self.repo_id}:{self.quant}" if self.repo_id else str(self.path)


def default_library_dir() -> Path:
    return data_dir() / "models"


def library_dirs(extra: Sequence[Path] = ()) -> list[Path]:
    """The library folders, in order, without duplicates."""
    configured = [
        Path(p).expanduser()
        for p in os.environ.get("HOMELAB_MODEL_DIRS", "").split(os.pathsep)
        if p
    ]
    folders: list[Path] = []
    for folder in (default_library_dir(), *configured, *extra):
        if folder.resolve() not in {f.resolve() for f in folders}:
            folders.append(folder)
    return folders


def list_local_models(
    extra_dirs: Sequence[Path] = (), *, include_hf_cache: bool = True
) -> list[LocalModel]:
    """Every local model, library folders first, then the Hugging Face cache."""
    found: list[LocalModel] = []
    seen: set[Path] = set()
    for folder in library_dirs(extra_dirs):
        for path in _gguf_files(folder):
            _add(found, seen, path, str(folder), None)
    if include_hf_cache:
        for repo_id, path in _hf_cache_files():
            _add(found, seen, path, f"hf · {repo_id}", repo_id)
    return found


def _add(
    found: list[LocalModel], seen: set[Path], path: Path, origin: str, repo_id: str | None
) -> None:
    real = path.resolve()
    if real not in seen:
        seen.add(real)
        found.append(describe(path, origin, repo_id))


def _gguf_files(folder: Path) -> Iterable[Path]:
    if not folder.is_dir():
        return []
    files = []
    for root, dirs, names in os.walk(folder):
        depth = len(Path(root).relative_to(folder).parts)
        dirs[:] = (
            [] if depth >= MAX_SCAN_DEPTH else sorted(d for d in dirs if not d.startswith("."))
        )
        files += [Path(root) / n for n in sorted(names) if _is_model_file(n)]
    return files


def _is_model_file(name: str) -> bool:
    if not name.lower().endswith(".gguf") or is_projector(name):
        return False
    match = SPLIT_RE.match(name)
    return match is None or int(match["no"]) == 1  # a split set is listed by its first part


def _hf_cache_files() -> Iterable[tuple[str, Path]]:
    cache_dir = hf_cache_dir()
    for repo_id in cache.cached_repos(cache_dir):
        main = cache.read_ref(cache_dir, repo_id)
        files = cache.cached_files(cache_dir, repo_id)
        current = [f for f in files if f.commit == main] or files
        for cached in current:
            if _is_model_file(cached.local_path.name):
                yield repo_id, cached.local_path


def describe(path: Path, origin: str, repo_id: str | None = None) -> LocalModel:
    """Read ``path``'s header; an unreadable file is listed with its problem, not dropped."""
    try:
        info: ModelInfo | None = read_model(path)
        problem = None
    except HomelabError as error:  # ModelFileError, mostly: a truncated or foreign file
        info, problem = None, str(error)
    size = info.file_bytes if info else _size(path)
    quant = info.file_type if info and info.file_type != "unknown" else quant_label(path.name)
    return LocalModel(path, origin, repo_id, quant, size, info, problem, read_provenance(path))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def find_local(name: str, models: Sequence[LocalModel] | None = None) -> LocalModel | None:
    """A local model by path, ``REPO[:QUANT]`` (from the HF cache) or file name/stem."""
    path = Path(name).expanduser()
    if path.is_file():
        repo_id = hf_cache_repo(path)
        return describe(path, f"hf · {repo_id}" if repo_id else str(path.parent), repo_id)
    candidates = list(models) if models is not None else list_local_models()
    ref = parse_model_ref(name)
    if ref is not None:
        in_repo = [m for m in candidates if m.repo_id == ref.repo_id]
        if ref.selector:
            wanted = ref.selector.upper()
            in_repo = [m for m in in_repo if wanted in (m.quant.upper(), quant_label(m.path.name))]
        return in_repo[0] if len(in_repo) == 1 else None
    lowered = name.lower().removesuffix(".gguf")
    matches = [m for m in candidates if lowered in (m.name.lower(), m.path.stem.lower())]
    return matches[0] if len(matches) == 1 else None


def hf_cache_repo(path: Path) -> str | None:
    """The repo a file of the Hugging Face cache belongs to (None: not in the cache)."""
    try:
        relative = path.absolute().relative_to(hf_cache_dir().absolute())
    except ValueError:
        return None
    top = relative.parts[0] if relative.parts else ""
    if not top.startswith("models--"):
        return None
    return top.removeprefix("models--").replace("--", "/", 1)


def require_local(name: str) -> LocalModel:
    found = find_local(name)
    if found is None:
        raise ModelFileError(
            name,
            "no such local model",
            hint="Give a path, or see `homelab models`; `homelab pull REPO:QUANT` downloads one.",
        )
    if found.info is None:
        raise ModelFileError(found.path, found.problem or "unreadable")
    return found
