"""Which vision projector (mmproj GGUF) goes with a text model, if any.

Three ways, in this order: ``--no-mmproj`` (none), ``--mmproj PATH`` (that file), else the one
found beside the model — llama.cpp's naming, ``mmproj-*.gguf`` or ``*mmproj*.gguf`` in the
model's folder (a Hugging Face snapshot is one folder per repo, so a pulled repo's projector
is found the same way). With several there, the choice prefers one whose name carries the
model's name, then the model's own quant, then F16 over BF16, Q8_0, other quants and F32.

A projector is checked before anything loads: it must be a projector (``clip``
architecture) with a vision encoder, and feed embeddings as wide as the text model's
``n_embd`` (:func:`homelab.gguf.projector.check_pair`) — else a ModelFileError that says
which file and what to do.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from homelab.errors import ModelFileError
from homelab.gguf.model import ModelInfo
from homelab.gguf.projector import ProjectorInfo, check_pair, read_projector
from homelab.models.ref import model_stem

if TYPE_CHECKING:
    from homelab.planner.search import PlanRequest

log = logging.getLogger("homelab.models")
TYPE_PREFERENCE = ("f16", "bf16", "q8_0")  # then other quants, then f32 last
_NOT_NAME = re.compile(r"[^a-z0-9]+")


def is_mmproj_name(name: str) -> bool:
    """Whether a file name follows llama.cpp's naming for projectors."""
    lower = name.lower()
    return lower.endswith(".gguf") and "mmproj" in lower


def mmproj_candidates(model_path: Path) -> list[Path]:
    """The projector files in ``model_path``'s folder (and, for a file in a subfolder of a
    Hugging Face snapshot, at the snapshot's top, where repos keep their projectors)."""
    folders = [model_path.expanduser().parent]
    parts = folders[0].parts
    if "snapshots" in parts[:-1]:
        top = Path(*parts[: parts.index("snapshots") + 2])
        folders += [top] if top != folders[0] else []
    return sorted(
        p
        for folder in folders
        if folder.is_dir()
        for p in folder.iterdir()
        if p.is_file() and is_mmproj_name(p.name)
    )


def choose_mmproj(model_path: Path, candidates: list[Path]) -> Path | None:
    """The best of ``candidates`` for the model at ``model_path`` (see the module docstring)."""
    ranked = ranked_mmproj(model_path, candidates)
    return ranked[0] if ranked else None


def ranked_mmproj(model_path: Path, candidates: list[Path]) -> list[Path]:
    """``candidates`` best first: named after the model, of its quant, F16 over F32."""
    stem, quant = model_stem(model_path)

    def rank(path: Path) -> tuple[int, int, int, str]:
        own_quant = model_stem(path)[1]
        same_quant = int(quant is not None and (own_quant or "").lower() == quant.lower())
        return (-int(names_model(path, stem)), -same_quant, _type_rank(own_quant), path.name)

    return sorted(candidates, key=rank)


def names_model(path: Path, model_stem_text: str) -> bool:
    """Whether the projector's file name carries the model's name (quant left out)."""
    model_name = _plain(model_stem_text)
    return bool(model_name) and model_name in _plain(model_stem(path)[0])


def _plain(text: str) -> str:
    return _NOT_NAME.sub("", text.lower().replace("mmproj", ""))


def _type_rank(quant: str | None) -> int:
    label = (quant or "").lower()
    if label in TYPE_PREFERENCE:
        return TYPE_PREFERENCE.index(label)
    return len(TYPE_PREFERENCE) + (1 if label == "f32" else 0)


def find_mmproj(model_path: Path) -> Path | None:
    """The best-named projector beside the model at ``model_path``, or None (unchecked)."""
    path = model_path.expanduser()
    return choose_mmproj(path, [c for c in mmproj_candidates(path) if c != path])


def projector_for(
    model: ModelInfo, given: str | Path | None = None, *, skip: bool = False
) -> ProjectorInfo | None:
    """The checked projector for ``model`` (its ``source`` a local file): ``given`` (the
    ``--mmproj`` flag), else the one beside it; None with ``skip`` (``--no-mmproj``) or when
    there is none. A projector named after the model, or given, that does not fit it is an
    error (an unreadable one beside it is skipped with a warning); unnamed ones
    (``mmproj-F16.gguf``, a folder of several models) are tried in order and the first that
    fits is taken."""
    if skip:
        return None
    if given:
        return _checked(Path(given).expanduser(), model)
    path = Path(model.source).expanduser()
    ranked = ranked_mmproj(path, [c for c in mmproj_candidates(path) if c != path])
    stem = model_stem(path)[0]
    for candidate in ranked:
        try:
            projector = read_projector(candidate)
        except ModelFileError as error:
            log.warning("skipping %s: %s", candidate.name, error)
            continue  # unreadable, or not a projector: the text model still loads
        if names_model(candidate, stem):
            check_pair(projector, model.n_embd, model.name)  # its own projector must fit
            return projector
        try:
            check_pair(projector, model.n_embd, model.name)
            return projector
        except ModelFileError:
            continue  # another model's projector in a shared folder
    return None


def _checked(path: Path, model: ModelInfo) -> ProjectorInfo:
    projector = read_projector(path)
    check_pair(projector, model.n_embd, model.name)
    return projector


def with_projector(request: PlanRequest, model: ModelInfo) -> PlanRequest:
    """``request`` with the projector ``model`` loads (its ``mmproj_path`` / ``no_mmproj``)."""
    if request.projector is not None:
        return request
    projector = projector_for(model, request.mmproj_path, skip=request.no_mmproj)
    return replace(request, projector=projector) if projector is not None else request
