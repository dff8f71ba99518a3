"""The local library: every GGUF model on this machine that homelab can run.

Models are found in the library folders (``<data>/models``, where ``homelab quantize``
writes, plus the folders in ``HOMELAB_MODEL_DIRS``, separated by ``os.pathsep``) and in the
Hugging Face cache (what ``homelab pull`` and other tools downloaded). Each is described by
its own header, so a renamed file still shows its true quant. A split set is one model;
vision projectors and partial downloads are skipped. ``homelab models`` and the TUI's model
picker both list models through :func:`list_local_models`.

Each model gets a short library name that every verb takes as MODEL: the file's name without
split suffix and quant label, lower case, without the ``Org_`` prefix bartowski-style repos
put first, then ``:QUANT`` — ``Qwen_Qwen3-8B-Q4_K_M.gguf`` is ``qwen3-8b:Q4_K_M``. Names are
derived from the disk alone, so they are the same on every call. When two models would get
the same name, the first in listing order (library folders in order, then the Hugging Face
cache by repo) keeps it and the others are qualified by their hub org or their folder:
``qwen3-8b@unsloth:Q4_K_M`` (then ``@unsloth-2``… should that collide too). Every model
also answers to its qualified name, and to its bare name without ``:QUANT`` when that is
unambiguous.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from homelab.errors import HomelabError, ModelFileError
from homelab.gguf.model import ModelInfo
from homelab.gguf.quantize import Provenance, read_provenance
from homelab.gguf.reader import SPLIT_RE, read_model
from homelab.hub import cache
from homelab.hub.quants import (
    UNKNOWN_QUANT,
    is_projector,
    parse_model_ref,
    quant_label,
    strip_quant,
)
from homelab.hub.settings import hf_cache_dir
from homelab.locations import data_dir

MAX_SCAN_DEPTH = 6  # folders below a library folder that are searched
GENERIC_STEMS = frozenset({"", "model", "ggml-model", "gguf"})  # say nothing: use the repo's name
_UNSAFE = re.compile(r"[^a-z0-9._+-]+")  # ":", "@" and "/" mean something in a MODEL name


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
    name: str = ""  # the library name (see the module docstring); set by list_local_models
    mmproj: Path | None = None  # the vision projector beside it (set by `homelab models`)

    @property
    def file_stem(self) -> str:
        """The file name without extension and split suffix."""
        match = SPLIT_RE.match(self.path.name)
        return match["stem"] if match else self.path.stem

    @property
    def base_name(self) -> str:
        """The library name without ``:QUANT`` or qualifier."""
        return library_base(self.path, self.repo_id)

    @property
    def name_quant(self) -> str | None:
        """The quant in the library name: the file name's label, else the header's."""
        label = quant_label(self.path.name)
        if label != UNKNOWN_QUANT:
            return label
        return None if self.quant in (UNKNOWN_QUANT, "unknown", "") else self.quant

    @property
    def qualifier(self) -> str:
        """What tells this model apart from a namesake: its hub org, else its folder."""
        owner = self.repo_id.split("/", 1)[0] if self.repo_id else self.path.parent.name
        return _safe(owner) or "local"

    @property
    def qualified_name(self) -> str:
        return with_quant(f"{self.base_name}@{self.qualifier}", self.name_quant)

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
    """Every local model, library folders first, then the Hugging Face cache, each with its
    library name."""
    found: list[LocalModel] = []
    seen: set[Path] = set()
    for folder in library_dirs(extra_dirs):
        for path in _gguf_files(folder):
            _add(found, seen, path, str(folder), None)
    if include_hf_cache:
        for repo_id, path in _hf_cache_files():
            _add(found, seen, path, f"hf · {repo_id}", repo_id)
    return assign_names(found)


# --- library names ---------------------------------------------------------------------------


def _safe(text: str) -> str:
    return _UNSAFE.sub("-", text.lower()).strip("-._")


def library_base(path: Path, repo_id: str | None = None) -> str:
    """A model file's short name without quant (see the module docstring)."""
    stem = strip_quant(path.name)
    org, underscore, rest = stem.partition("_")
    repo_name = repo_id.split("/", 1)[-1].lower() if repo_id else ""
    by_org = rest.lower().startswith(org.lower()) or repo_name.startswith(f"{org.lower()}_")
    if underscore and rest and org.isalnum() and by_org:
        stem = rest  # bartowski's Qwen_Qwen3-8B, google_gemma-3-12b-it
    base = _safe(stem)
    if base in GENERIC_STEMS and repo_name:
        base = _safe(repo_name.removesuffix("-gguf"))
    return base or "model"


def with_quant(base: str, quant: str | None) -> str:
    return base if not quant else f"{base}:{quant}"


def assign_names(models: Sequence[LocalModel]) -> list[LocalModel]:
    """``models`` with distinct library names, the first in order keeping a shared name."""
    taken: set[str] = set()
    named = []
    for model in models:
        name = _free_name(model, taken)
        taken.add(name.lower())
        named.append(replace(model, name=name))
    return named


def _free_name(model: LocalModel, taken: set[str]) -> str:
    plain = with_quant(model.base_name, model.name_quant)
    if plain.lower() not in taken:
        return plain
    qualified = model.qualified_name
    number = 1
    while qualified.lower() in taken:
        number += 1
        qualified = with_quant(f"{model.base_name}@{model.qualifier}-{number}", model.name_quant)
    return qualified


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
    found = LocalModel(path, origin, repo_id, quant, size, info, problem, read_provenance(path))
    return replace(found, name=with_quant(found.base_name, found.name_quant))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def find_local(name: str, models: Sequence[LocalModel] | None = None) -> LocalModel | None:
    """A local model by path, ``REPO[:QUANT]`` (from the HF cache), library name (plain,
    qualified, or without ``:QUANT`` when only one model has that base) or file name/stem."""
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
    lowered = name.strip().lower()
    for key in (_name_key, _qualified_key, _base_key, _file_key):
        matches = [m for m in candidates if lowered in key(m)]
        if matches:
            return matches[0] if len(matches) == 1 else None
    return None


def namesakes(name: str, models: Sequence[LocalModel] | None = None) -> list[LocalModel]:
    """The local models whose name without ``:QUANT`` is ``name`` (to say which to pick)."""
    candidates = list(models) if models is not None else list_local_models()
    return [m for m in candidates if name.strip().lower() in _base_key(m)]


def _name_key(model: LocalModel) -> tuple[str, ...]:
    return (model.name.lower(),)


def _qualified_key(model: LocalModel) -> tuple[str, ...]:
    return (model.qualified_name.lower(),)


def _base_key(model: LocalModel) -> tuple[str, ...]:
    return (model.base_name, model.name.lower().partition(":")[0])


def _file_key(model: LocalModel) -> tuple[str, ...]:
    stems = (model.file_stem.lower(), model.path.stem.lower(), model.path.name.lower())
    return stems


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
