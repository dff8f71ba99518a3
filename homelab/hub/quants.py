"""Make sense of a repo's file list: which GGUF files exist, grouped by quant, split sets as one.

Repos name their files by convention, not by rule: ``Qwen3-8B-Q4_K_M.gguf``,
``model.q8_0.gguf``, ``Q4_K_M/Model-Q4_K_M-00001-of-00002.gguf``, ``UD-Q4_K_XL``…  The quant
label is taken from the file name, else from its folder. Vision projectors (``mmproj*``) are
kept apart: they are not models to plan or run on their own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from homelab.errors import HubError
from homelab.gguf.reader import SPLIT_RE

QUANT_RE = re.compile(
    r"(?<![A-Za-z0-9])(?P<label>(?:UD-)?(?:I?Q[1-8](?:_[A-Z0-9]{1,4}){0,3}|BF16|FP16|F16|F32|"
    r"MXFP4(?:_MOE)?|TQ[12]_0))(?![A-Za-z0-9])",
    re.IGNORECASE,
)
REPO_RE = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<selector>[^:]+))?$")
UNKNOWN_QUANT = "?"


@dataclass(frozen=True)
class RemoteFile:
    """One file of a repo as the hub's file listing describes it."""

    path: str  # path inside the repo
    size_bytes: int
    sha256: str | None  # LFS sha256 (GGUFs are LFS files on the hub)
    blob_id: str | None  # git blob id, the only checksum of a non-LFS file


@dataclass(frozen=True)
class GgufEntry:
    """One downloadable model: a single GGUF file, or every part of a split set."""

    quant: str  # e.g. "Q4_K_M", "UD-Q4_K_XL", "BF16"; "?" when the name says nothing
    stem: str  # the file name without quant, split suffix and extension
    files: tuple[RemoteFile, ...]  # in part order
    missing_parts: tuple[str, ...] = ()  # parts of a split set the repo does not have

    @property
    def total_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    @property
    def is_split(self) -> bool:
        return len(self.files) > 1 or bool(self.missing_parts)

    @property
    def first_path(self) -> str:
        return self.files[0].path

    @property
    def label(self) -> str:
        """What the user types after ``REPO:`` to pick this entry."""
        return self.quant if self.quant != UNKNOWN_QUANT else self.first_path


@dataclass(frozen=True)
class ModelRef:
    """``REPO[:QUANT]`` — a repo and, optionally, which of its files."""

    repo_id: str
    selector: str | None = None

    def __str__(self) -> str:
        return self.repo_id if self.selector is None else f"{self.repo_id}:{self.selector}"


def parse_model_ref(text: str) -> ModelRef | None:
    """``org/name`` or ``org/name:Q4_K_M``; None when ``text`` is not shaped like a repo."""
    match = REPO_RE.match(text.strip())
    if not match or match["repo"].endswith(".gguf"):
        return None
    return ModelRef(match["repo"], match["selector"])


def quant_label(path: str) -> str:
    """The quant a file's name (or, failing that, its folder) announces."""
    name = path.rsplit("/", 1)[-1]
    for part in (_strip_name(name), *reversed(path.split("/")[:-1])):
        labels = [m["label"].upper() for m in QUANT_RE.finditer(part)]
        if labels:
            return labels[-1].replace("FP16", "F16")
    return UNKNOWN_QUANT


def _strip_name(name: str) -> str:
    match = SPLIT_RE.match(name)
    return match["stem"] if match else name.removesuffix(".gguf")


def strip_quant(name: str) -> str:
    """A file name without split suffix, extension and trailing quant label."""
    return _stem(name, quant_label(name.rsplit("/", 1)[-1]))


def _stem(path: str, quant: str) -> str:
    stem = _strip_name(path.rsplit("/", 1)[-1])
    if quant == UNKNOWN_QUANT:
        return stem
    cut = re.sub(rf"[-_.]?{re.escape(quant)}$", "", stem, flags=re.IGNORECASE)
    return cut or stem


def is_projector(path: str) -> bool:
    """A vision projector by llama.cpp's naming: ``mmproj-*.gguf`` or ``*mmproj*.gguf``."""
    return "mmproj" in path.rsplit("/", 1)[-1].lower()


PROJECTOR_TYPES = ("F16", "BF16", "Q8_0")  # preferred in this order; then others, F32 last


def best_projector(projectors: tuple[RemoteFile, ...], entry: GgufEntry) -> RemoteFile | None:
    """The projector to fetch with ``entry``: one named after it first, then by type."""
    model_name = _plain(entry.stem)

    def rank(remote: RemoteFile) -> tuple[int, int, str]:
        named = bool(model_name) and model_name in _plain(strip_quant(remote.path))
        label = quant_label(remote.path)
        by_type = PROJECTOR_TYPES.index(label) if label in PROJECTOR_TYPES else 3 + (label == "F32")
        return (-int(named), by_type, remote.path)

    return min(projectors, key=rank, default=None)


def _plain(text: str) -> str:
    return "".join(c for c in text.lower().replace("mmproj", "") if c.isalnum())


def group_entries(files: list[RemoteFile]) -> tuple[GgufEntry, ...]:
    """Group a repo's ``.gguf`` model files into entries, largest first."""
    groups: dict[tuple[str, str, int], list[tuple[int, RemoteFile]]] = {}
    for remote in files:
        if not remote.path.lower().endswith(".gguf") or is_projector(remote.path):
            continue
        match = SPLIT_RE.match(remote.path)
        key = (match["stem"], "split", int(match["count"])) if match else (remote.path, "one", 1)
        groups.setdefault(key, []).append((int(match["no"]) if match else 1, remote))
    entries = [_entry(key[0], key[2], parts) for key, parts in groups.items()]
    return tuple(sorted(entries, key=lambda e: (-e.total_bytes, e.first_path)))


def _entry(base: str, count: int, parts: list[tuple[int, RemoteFile]]) -> GgufEntry:
    parts.sort(key=lambda item: item[0])
    present = {number for number, _ in parts}
    missing = tuple(
        f"{base}-{n:05d}-of-{count:05d}.gguf" for n in range(1, count + 1) if n not in present
    )
    first = parts[0][1].path
    quant = quant_label(first)
    return GgufEntry(quant, _stem(first, quant), tuple(f for _, f in parts), missing)


def projector_files(files: list[RemoteFile]) -> tuple[RemoteFile, ...]:
    return tuple(f for f in files if f.path.lower().endswith(".gguf") and is_projector(f.path))


def select_entry(repo_id: str, entries: tuple[GgufEntry, ...], selector: str) -> GgufEntry:
    """The entry ``selector`` names: a quant label (any case) or a file path."""
    wanted = selector.strip().upper().removesuffix(".GGUF")
    by_path = [
        e for e in entries if any(f.path.upper().removesuffix(".GGUF") == wanted for f in e.files)
    ]
    by_quant = [e for e in entries if e.quant.upper() in (wanted, f"UD-{wanted}")]
    exact = [e for e in by_quant if e.quant.upper() == wanted]
    matches = by_path or exact or by_quant
    if len(matches) == 1:
        return _complete(repo_id, matches[0])
    if not matches:
        available = ", ".join(e.label for e in entries) or "none"
        raise HubError(
            f"{repo_id} has no GGUF file for {selector!r}.",
            hint=f"Available: {available}. See `homelab search {repo_id}`.",
        )
    names = ", ".join(m.first_path for m in matches)
    raise HubError(
        f"{repo_id}:{selector} matches several files ({names}).",
        hint=f"Name the file instead, e.g. {repo_id}:{matches[0].first_path}.",
    )


def _complete(repo_id: str, entry: GgufEntry) -> GgufEntry:
    if entry.missing_parts:
        raise HubError(
            f"{repo_id}: the split set {entry.first_path} is incomplete on the hub "
            f"(missing {', '.join(entry.missing_parts)}).",
            hint="Pick another quant; this one cannot be loaded.",
        )
    return entry
