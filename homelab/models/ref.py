"""MODEL, as a user types it, turned into a typed :data:`ModelRef` — the one place that does it.

:func:`resolve` tries the forms in this order:

1. ``demo[:ARCH][:SIZE][:QUANT]`` — :class:`DemoModel`: ``demo`` the shipped trained model,
   ``demo:ARCH…`` / ``demo:SIZE…`` a random-weight one generated on first use;
2. an existing file — :class:`LocalFile` (it plans with its sibling quant files);
3. ``ORG/NAME[:QUANT]`` — :class:`HubModel`: loads the downloaded file, plans from remote
   headers (or the cache) before anything is downloaded;
4. any other ``*.gguf`` path — a missing file (ModelFileError);
5. a name ``homelab models`` lists (``qwen3-8b:Q4_K_M``) — :class:`LocalFile` of the library;
6. a catalogue name (``llama-3.1-8b``) — :class:`CatalogueModel`: plans from its published
   shape; it loads once :mod:`homelab.models.fetch` has downloaded its default repo's quant.

``resolve`` only looks at the disk (no network, nothing generated, no header read): it says
*what* MODEL is, or raises ModelFileError when it is nothing. Each ref then gives what its
callers need: :meth:`variants` — the ModelInfos to plan over — and :meth:`local_path` — the file
to load, or a ModelFileError saying why there is none and which command gets it. A ref whose
file is not here (``on_disk`` false) becomes one that is through
:func:`homelab.models.fetch.ensure_local`, which shows the plan and downloads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from homelab.errors import HomelabError, ModelFileError
from homelab.gguf.model import ModelInfo
from homelab.gguf.reader import SPLIT_RE, read_model

if TYPE_CHECKING:
    from homelab.gguf.catalogue import CatalogueEntry
    from homelab.hub.library import LocalModel

Kind = Literal["local", "demo", "hub", "catalogue"]

# a trailing quant label: -Q4_K_M, .Q8_0, -IQ4_XS, -F16, -BF16, -MXFP4_MOE, -UD-Q4_K_XL ...
QUANT_SUFFIX = re.compile(
    r"[-._](?P<quant>(?:UD-)?(?:I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4(?:_MOE)?))$",
    re.IGNORECASE,
)
FORMS_HINT = (
    "MODEL is a GGUF path, demo[:ARCH][:SIZE][:QUANT], a name from `homelab models`, "
    "a hub repo ORG/NAME[:QUANT], or a catalogue name"
)


# --- the refs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalFile:
    """A GGUF file on this machine: a path, or a model of the local library."""

    text: str  # what was typed
    path: Path  # the file to load (the first part of a split set)
    label: str  # the name to show: the file name, or REPO:QUANT for a Hugging Face cache file
    origin: str = "local file"  # where it was found: a library folder, "hf · org/name"
    kind: ClassVar[Kind] = "local"

    @property
    def on_disk(self) -> bool:
        return True

    def local_path(self) -> Path:
        if not self.path.is_file():
            raise ModelFileError(self.path, "file not found", hint="Check the path.")
        return self.path

    def variants(self) -> list[ModelInfo]:
        return local_variants(self.local_path())

    def pull_name(self, quant: str | None = None) -> str | None:
        return None  # already here


@dataclass(frozen=True)
class DemoModel:
    """The shipped model trained on Python's documentation (``demo[:QUANT]``), or a generated
    one with random weights (``demo:ARCH[:SIZE][:QUANT]``, ``demo:SIZE[:QUANT]``)."""

    text: str
    arch: str
    size: str
    quant: str
    kind: ClassVar[Kind] = "demo"

    @property
    def origin(self) -> str:
        return "shipped with homelab" if self.arch == "trained" else "generated locally"

    @property
    def label(self) -> str:
        if self.arch == "trained":
            return "small demo model trained on Python's documentation"
        return f"{self.arch} {self.size} demo"

    @property
    def on_disk(self) -> bool:
        return True  # generated when it is first asked for

    def local_path(self) -> Path:
        from homelab.gguf.demo import demo_model_path

        return demo_model_path(self.arch, self.size, self.quant)

    def variants(self) -> list[ModelInfo]:
        return local_variants(self.local_path())

    def pull_name(self, quant: str | None = None) -> str | None:
        return None


@dataclass(frozen=True)
class HubModel:
    """``ORG/NAME[:QUANT]`` on the Hugging Face hub: the downloaded file when there is one."""

    text: str
    repo_id: str
    quant: str | None  # the selector after the colon: a quant label or a file name
    cached: Path | None  # the downloaded file (first part of a split set) this ref names
    downloaded: tuple[str, ...] = ()  # the quants of the repo in the cache
    kind: ClassVar[Kind] = "hub"

    @property
    def label(self) -> str:
        return self.repo_id if self.quant is None else f"{self.repo_id}:{self.quant}"

    @property
    def origin(self) -> str:
        return f"hf · {self.repo_id}" if self.cached else "Hugging Face hub"

    @property
    def on_disk(self) -> bool:
        return self.cached is not None

    def local_path(self) -> Path:
        if self.cached is not None:
            return self.cached
        if self.quant is None and len(self.downloaded) > 1:
            raise ModelFileError(
                self.text,
                f"several quants are downloaded ({', '.join(self.downloaded)}); say which",
                hint=f"e.g. {self.repo_id}:{self.downloaded[0]}",
            )
        if self.quant is None:
            hint = (
                f"Download it first: `homelab pull {self.repo_id}` picks the quant that fits "
                f"this machine (`homelab search {self.repo_id}` lists them all)."
            )
        else:
            hint = f"Download it first: homelab pull {self.label}"
        raise ModelFileError(self.text, "not downloaded yet", hint=hint)

    def variants(self) -> list[ModelInfo]:
        """With a quant, that one; without, every quant of the repo (remote headers; offline,
        the downloaded ones). A repo the catalogue knows falls back to it when the hub is out
        of reach."""
        from homelab.hub.resolve import hub_variants

        found = hub_variants(self.label)
        if found is not None:
            return found
        from homelab.gguf.catalogue import find_model

        return catalogue_variants(find_model(self.repo_id))

    def pull_name(self, quant: str | None = None) -> str | None:
        return self.label if quant is None or self.quant else f"{self.repo_id}:{quant}"


@dataclass(frozen=True)
class CatalogueModel:
    """An entry of ``profiles/models.toml``: planned from its published shape; loaded after
    :mod:`homelab.models.fetch` downloads a quant of its ``hf_repo``."""

    text: str
    entry: CatalogueEntry
    kind: ClassVar[Kind] = "catalogue"

    @property
    def label(self) -> str:
        return self.entry.display_name

    @property
    def origin(self) -> str:
        return f"catalogue · {self.entry.hf_repo}"

    @property
    def on_disk(self) -> bool:
        return False

    def local_path(self) -> Path:
        repo = self.entry.hf_repo
        raise ModelFileError(
            self.text,
            f"a catalogue entry, not downloaded yet (no quant of {repo} is here)",
            hint=f"`homelab run {self.text} --yes` downloads the quant the planner picks for "
            f"this machine and runs it; `homelab pull {self.text}` only downloads it.",
        )

    def variants(self) -> list[ModelInfo]:
        return catalogue_variants(self.entry)

    def pull_name(self, quant: str | None = None) -> str | None:
        return f"{self.entry.hf_repo}:{quant or self.entry.quants[-1].quant}"


ModelRef = LocalFile | DemoModel | HubModel | CatalogueModel


# --- resolve ---------------------------------------------------------------------------------


def resolve(text: str) -> ModelRef:
    """What ``text`` names (see the module docstring for the forms and their order)."""
    from homelab.gguf.demo import is_demo_ref, parse_demo_ref

    typed = text.strip()
    if not typed:
        raise ModelFileError("''", "no model given", hint=FORMS_HINT + ".")
    if is_demo_ref(typed):
        return DemoModel(typed, *parse_demo_ref(typed))
    path = Path(typed).expanduser()
    if path.is_file():
        return _local_file(typed, path)
    hub = _hub_model(typed)  # before the suffix test: ORG/NAME:file.gguf names a hub file
    if hub is not None:
        return hub
    if path.suffix.lower() == ".gguf":
        return _local_file(typed, path)
    return _named(typed)


def _local_file(text: str, path: Path) -> LocalFile:
    if not path.is_file():
        raise ModelFileError(path, "file not found", hint="Check the path.")
    return LocalFile(text, path, path.name)


def _hub_model(text: str) -> HubModel | None:
    from homelab.hub.pull import cached_entries, find_cached
    from homelab.hub.quants import parse_model_ref
    from homelab.hub.settings import hub_settings

    ref = parse_model_ref(text)
    if ref is None:
        return None
    settings = hub_settings()
    cached = find_cached(settings, ref)
    entries = cached_entries(settings, ref.repo_id)
    downloaded = tuple(dict.fromkeys(c.entry.label for c in entries))
    return HubModel(
        text, ref.repo_id, ref.selector, cached.paths[0] if cached else None, downloaded
    )


def _named(text: str) -> LocalFile | CatalogueModel:
    """A model of the local library by name, else a catalogue entry."""
    from homelab.gguf.catalogue import find_model, load_catalogue
    from homelab.hub.library import find_local, list_local_models, namesakes

    models = list_local_models()
    found = find_local(text, models)
    if found is not None:
        return from_library(found, text)
    try:
        return CatalogueModel(text, find_model(text))
    except HomelabError:
        pass
    several = namesakes(text, models)
    if several:
        names = ", ".join(m.name for m in several)
        raise ModelFileError(text, f"several local models have this name: {names}; say which")
    known = ", ".join(sorted(load_catalogue()))
    raise ModelFileError(text, "no such model", hint=f"{FORMS_HINT} (the catalogue knows {known}).")


def from_library(model: LocalModel, text: str | None = None) -> LocalFile:
    """The ref of a model ``homelab models`` lists (ModelFileError when it is unreadable)."""
    if model.info is None:
        raise ModelFileError(model.path, model.problem or "unreadable")
    label = model.file_stem if model.repo_id is None else model.ref
    return LocalFile(text or model.ref, model.path, label, model.origin)


def catalogue_ref(slug: str) -> CatalogueModel:
    from homelab.gguf.catalogue import find_model

    return CatalogueModel(slug, find_model(slug))


# --- what a ref plans over -------------------------------------------------------------------


def catalogue_variants(entry: CatalogueEntry) -> list[ModelInfo]:
    return [entry.model_info(q.quant) for q in entry.quants]


def local_variants(path: Path) -> list[ModelInfo]:
    """``path`` and the other quants of the same model lying next to it."""
    variants = [read_model(path)]
    for sibling in sibling_quants(path):
        try:
            variants.append(read_model(sibling))
        except ModelFileError:
            continue  # an unreadable neighbour must not break planning the file asked for
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
    """Other quant files of the same model in ``path``'s folder: files whose names differ only
    in the trailing quant label (``Model-Q8_0.gguf``, ``Model-Q4_K_M.gguf``); first parts of
    split sets."""
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
