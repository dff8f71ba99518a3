"""Turn what the user typed (a path, a catalogue name) into the quant variants to plan over.

:func:`resolve_model` is the one place that does it; the hub's ``REPO[:QUANT]`` included.
A local file brings along the other quants of the same model lying next to it: files in the
same folder whose names differ only in the trailing quant label
(``Model-Q8_0.gguf``, ``Model-Q4_K_M.gguf``).
"""

from __future__ import annotations

import re
from pathlib import Path

from homelab.errors import ModelFileError, PlanError
from homelab.gguf.model import ModelInfo
from homelab.gguf.reader import SPLIT_RE, read_model

# a trailing quant label: -Q4_K_M, .Q8_0, -IQ4_XS, -F16, -BF16, -MXFP4_MOE, -UD-Q4_K_XL ...
QUANT_SUFFIX = re.compile(
    r"[-._](?P<quant>(?:UD-)?(?:I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4(?:_MOE)?))$",
    re.IGNORECASE,
)


def resolve_model(name: str, quant: str | None = None) -> list[ModelInfo]:
    """The quant variants ``name`` stands for (a GGUF path, a ``demo[:ARCH][:SIZE][:QUANT]``
    model, ``ORG/NAME[:QUANT]`` on the Hugging Face hub, or a catalogue name), best first.

    With ``quant``, only that variant (PlanError listing the available ones if it is absent).
    """
    from homelab.gguf.demo import demo_ref_path, is_demo_ref

    if is_demo_ref(name):  # demo[:ARCH][:SIZE][:QUANT], generated on first use
        return _local_variants(demo_ref_path(name), quant)
    path = Path(name).expanduser()
    if path.suffix.lower() == ".gguf" or path.exists():
        return _local_variants(path, quant)
    from homelab.hub.resolve import hub_variants  # ORG/NAME[:QUANT]: cached file or remote headers

    hub = hub_variants(name, quant)
    if hub is not None:
        return hub
    return _catalogue_variants(name, quant)


def _local_variants(path: Path, quant: str | None) -> list[ModelInfo]:
    if not path.exists():
        raise ModelFileError(
            path, "file not found", hint="Check the path, or give a catalogue name."
        )
    variants = [read_model(path)]
    for sibling in sibling_quants(path):
        try:
            variants.append(read_model(sibling))
        except ModelFileError:
            continue  # an unreadable neighbour must not break planning the file asked for
    if quant is not None:
        chosen = [m for m in variants if m.file_type.lower() == quant.lower()]
        if not chosen:
            known = ", ".join(sorted({m.file_type for m in variants}))
            raise PlanError(f"No {quant} variant of {path.name} is here.", hint=f"Found: {known}.")
        return chosen
    return variants


def model_stem(path: Path) -> tuple[str, str | None]:
    """(the name without split suffix and quant label, the quant label)."""
    split = SPLIT_RE.match(path.name)
    stem = split["stem"] if split else path.stem
    match = QUANT_SUFFIX.search(stem)
    if match is None:
        return stem, None
    return stem[: match.start()], match["quant"]


def sibling_quants(path: Path) -> list[Path]:
    """Other quant files of the same model in ``path``'s folder (first parts of split sets)."""
    stem, label = model_stem(path)
    if label is None:
        return []
    siblings = []
    for candidate in sorted(path.parent.glob("*.gguf")):
        if candidate.resolve() == path.resolve():
            continue
        split = SPLIT_RE.match(candidate.name)
        if split and int(split["no"]) != 1:
            continue
        other_stem, other_label = model_stem(candidate)
        if other_label is not None and other_stem == stem and other_label.lower() != label.lower():
            siblings.append(candidate)
    return siblings


def _catalogue_variants(name: str, quant: str | None) -> list[ModelInfo]:
    from homelab.gguf.catalogue import find_model

    entry = find_model(name)
    if quant is not None:
        return [entry.model_info(entry.quant_file(quant).quant)]
    return [entry.model_info(q.quant) for q in entry.quants]
