"""A MODEL that is not on this machine, made local: the plan first, then the download.

    path = ensure_local(resolve("qwen3-8b"), confirm=ask_the_user, progress=bar)

A ref with a file here (a path, a demo model, a library name, a downloaded hub file) is
returned as it is. For a hub ref or a catalogue name:

1. a quant of the repo that is already downloaded and fits wins — the planner's pick among
   them, no network (a catalogue name's repo is its ``hf_repo``);
2. offline (``HF_HUB_OFFLINE``) or with the hub out of reach, :class:`DownloadRefused` says
   so and what to do;
3. the quant to fetch: the one named (``ORG/NAME:QUANT``, ``--quant``), else the planner's
   pick for this machine — over the repo's remote headers, or a catalogue entry's published
   shapes;
4. that file's remote header is planned with the verb's knobs: a :class:`DownloadOffer`
   (fits or not, at what context, KV type and speed);
5. an offer that does not fit is refused (PlanError) unless ``force``;
6. ``confirm(offer)`` decides (the CLI asks, or ``--yes``; the TUI's picker has asked);
7. the verified, resumable :func:`homelab.hub.pull.pull`, reporting to ``progress``.

The verbs call this through ``homelab.cli.flags.local_model`` before the one plan-then-load
(:mod:`homelab.models.launch`); the TUI's picker through ``pull_choice``. ``confirm=None``
means "never download": the ref's own "not downloaded yet" error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from homelab.errors import HomelabError, HubError, PlanError
from homelab.models.ref import CatalogueModel, HubModel, ModelRef, resolve
from homelab.units import format_size

if TYPE_CHECKING:
    from homelab.gguf.model import ModelInfo
    from homelab.hub.client import RepoListing
    from homelab.hub.progress import ProgressSink
    from homelab.hub.quants import GgufEntry
    from homelab.hub.settings import HubSettings
    from homelab.planner.budget import Hardware
    from homelab.planner.plan import Plan
    from homelab.planner.search import PlanRequest


class DownloadRefused(HubError):
    """The model is not here and will not be downloaded now (offline, not confirmed…)."""

    title = "Not downloaded"


@dataclass(frozen=True)
class DownloadOffer:
    """What would be downloaded for a MODEL, and how it would run: shown before asking."""

    requested: str  # MODEL as typed
    repo_id: str
    quant: str  # the label after REPO: (a quant, or a file name when it has none)
    size_bytes: int
    n_files: int
    picked: bool  # the planner picked the quant (none was named)
    hardware: str  # what it was planned for, in words
    plan: Plan | None  # the plan from the remote header (None: nothing fits)
    problem: str | None  # why it does not fit
    cache_dir: Path  # where it goes (the Hugging Face cache)

    @property
    def name(self) -> str:
        return f"{self.repo_id}:{self.quant}"

    @property
    def fits(self) -> bool:
        return self.plan is not None and self.plan.fits

    def verdict(self) -> str:
        """``fits · CPU · 32k ctx × 1 slot · KV q8_0 · 9.1 t/s``, or why it does not."""
        if self.plan is None or not self.plan.fits:
            return f"does not fit: {self.problem or 'the planner found no configuration'}"
        from homelab.hub.labels import placement, speed_label, tokens_label

        s = self.plan.settings
        slots = "slot" if s.n_parallel == 1 else "slots"
        kv = s.type_k if s.type_k == s.type_v else f"{s.type_k}/{s.type_v}"
        speed = speed_label(self.plan.predicted.decode_tok_s)
        return (
            f"fits · {placement(self.plan)} · {tokens_label(s.n_ctx_per_slot)} ctx × "
            f"{s.n_parallel} {slots} · KV {kv} · {speed}"
        )

    def describe(self) -> str:
        """The offer in words (the CLI prints it on stderr before asking)."""
        why = "the planner picks " if self.picked else ""
        files = "1 file" if self.n_files == 1 else f"{self.n_files} files"
        return (
            f"{self.requested} is not on this machine: {why}{self.name}, "
            f"{format_size(self.size_bytes)} in {files}.\n"
            f"  plan from its remote header, for {self.hardware}: {self.verdict()}\n"
            f"  download to {self.cache_dir} (verified, resumable)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "name": self.name,
            "repo": self.repo_id,
            "quant": self.quant,
            "size_bytes": self.size_bytes,
            "n_files": self.n_files,
            "picked_by_planner": self.picked,
            "hardware": self.hardware,
            "fits": self.fits,
            "verdict": self.verdict(),
            "plan": self.plan.to_dict() if self.plan is not None else None,
            "cache_dir": str(self.cache_dir),
        }


Confirm = Callable[[DownloadOffer], bool]


def agree(offer: DownloadOffer) -> bool:
    """A ``confirm`` for callers whose user has already said yes (the TUI's picker)."""
    return True


def ensure_local(
    ref: ModelRef,
    *,
    confirm: Confirm | None,
    progress: ProgressSink | None = None,
    request: PlanRequest | None = None,
    hardware: Hardware | None = None,
    force: bool = False,
) -> Path:
    """The file to load for ``ref``, downloaded first when it is not here (module docstring)."""
    return fetch_model(
        ref, confirm=confirm, progress=progress, request=request, hardware=hardware, force=force
    ).local_path()


def fetch_model(
    ref: ModelRef,
    *,
    confirm: Confirm | None,
    progress: ProgressSink | None = None,
    request: PlanRequest | None = None,
    hardware: Hardware | None = None,
    force: bool = False,
) -> ModelRef:
    """``ref`` itself when its file is here, else the ref of the downloaded file (a
    :class:`HubModel` with its file); see the module docstring."""
    if ref.on_disk or not isinstance(ref, HubModel | CatalogueModel):
        return ref
    if confirm is None:
        ref.local_path()  # raises: not downloaded yet, and how to get it
    request, hardware = _knobs(request, hardware)
    repo_id = ref.repo_id if isinstance(ref, HubModel) else ref.entry.hf_repo
    downloaded = downloaded_fit(ref.text, repo_id, _wanted(ref, request), request, hardware)
    if downloaded is not None:
        return downloaded
    offer = plan_download(ref, request, hardware)
    if not offer.fits and not force:
        raise PlanError(
            f"{offer.name} ({format_size(offer.size_bytes)}) was not downloaded: it does not "
            f"fit (planned for {offer.hardware}): {offer.problem or 'nothing fits'}",
            hint="Pick a smaller quant or model (`homelab search "
            f"{offer.repo_id} --plan` shows which fit), or pass --force to download it anyway.",
        )
    if confirm is None or not confirm(offer):
        raise DownloadRefused(
            f"{offer.requested} is not downloaded yet: the download of {offer.name} was declined.",
            hint=f"Download it any time with `homelab pull {offer.name}`.",
        )
    return _download(ref.text, offer, progress)


# --- 1. what is downloaded already -----------------------------------------------------------


def _knobs(request: PlanRequest | None, hardware: Hardware | None) -> tuple[PlanRequest, Hardware]:
    from homelab.planner.budget import resolve_hardware
    from homelab.planner.search import PlanRequest

    return request or PlanRequest(), hardware or resolve_hardware()


def _wanted(ref: HubModel | CatalogueModel, request: PlanRequest) -> str | None:
    """The quant (or file) asked for: ``ORG/NAME:QUANT``'s, else ``--quant``."""
    if isinstance(ref, HubModel) and ref.quant:
        return ref.quant
    return request.quant


def downloaded_fit(
    text: str, repo_id: str, wanted: str | None, request: PlanRequest, hardware: Hardware
) -> HubModel | None:
    """The downloaded quant of ``repo_id`` the planner picks (``wanted`` only, when given),
    when one fits; None otherwise."""
    from homelab.gguf.reader import read_model
    from homelab.hub.pull import cached_entries, find_cached
    from homelab.hub.quants import ModelRef as HubRef
    from homelab.hub.settings import hub_settings

    settings = hub_settings()
    if wanted is not None:
        cached = find_cached(settings, HubRef(repo_id, wanted))
        candidates = [cached] if cached is not None else []
    else:
        candidates = _newest_first(cached_entries(settings, repo_id))
    by_source = {str(c.paths[0]): c for c in candidates}
    if not by_source:
        return None
    try:
        infos = [read_model(Path(source)) for source in by_source]
        plan = _plan(infos, replace(request, quant=None), hardware)
    except HomelabError:
        return None  # an unreadable or unplannable download: fetch a good one instead
    if not plan.fits or plan.model_source not in by_source:
        return None
    chosen = by_source[plan.model_source]
    return _hub_ref(text, repo_id, chosen.entry.label)


def _newest_first(entries: list[Any]) -> list[Any]:
    """One cached entry per quant label, the ``main`` commit's first."""
    seen: dict[str, Any] = {}
    for cached in entries:
        seen.setdefault(cached.entry.label, cached)
    return list(seen.values())


def _hub_ref(text: str, repo_id: str, label: str) -> HubModel:
    ref = resolve(f"{repo_id}:{label}")
    if not isinstance(ref, HubModel) or not ref.on_disk:
        raise HubError(f"{repo_id}:{label} was downloaded but cannot be found in the cache.")
    return replace(ref, text=text)


def _plan(models: list[ModelInfo], request: PlanRequest, hardware: Hardware) -> Plan:
    from homelab.planner.plan import plan_model

    return plan_model(models, hardware, request, verify=False)


# --- 2-4. the offer --------------------------------------------------------------------------


def plan_download(
    ref: HubModel | CatalogueModel, request: PlanRequest, hardware: Hardware
) -> DownloadOffer:
    """What would be downloaded for ``ref`` and its plan from the remote header (network:
    the repo's listing and headers; DownloadRefused offline or when the hub is out of reach)."""
    from homelab.hub.client import HubUnavailableError
    from homelab.hub.settings import hub_settings

    settings = hub_settings()
    if settings.offline:
        raise DownloadRefused(
            f"{ref.text} is not downloaded yet, and HF_HUB_OFFLINE is set: homelab will not "
            "contact the hub to download it.",
            hint="Unset HF_HUB_OFFLINE on a machine with a network to download it, or run a "
            "model that is here (`homelab models` lists them).",
        )
    try:
        return _offer(settings, ref, request, hardware)
    except HubUnavailableError as error:
        raise DownloadRefused(
            f"{ref.text} is not downloaded yet, and the hub cannot be reached to download it "
            f"({error.message})",
            hint="Check the network (and HF_ENDPOINT or the proxy settings); offline, run a "
            "model that is here (`homelab models`) or set HF_HUB_OFFLINE=1.",
        ) from error


def _offer(
    settings: HubSettings, ref: HubModel | CatalogueModel, request: PlanRequest, hardware: Hardware
) -> DownloadOffer:
    from homelab.hub.client import repo_listing

    repo_id = ref.repo_id if isinstance(ref, HubModel) else ref.entry.hf_repo
    listing = repo_listing(settings, repo_id)
    entry, picked = _entry_to_fetch(settings, listing, ref, request, hardware)
    plan, problem = _remote_plan(settings, listing, entry, request, hardware)
    return DownloadOffer(
        requested=ref.text,
        repo_id=listing.repo_id,
        quant=entry.label,
        size_bytes=entry.total_bytes,
        n_files=len(entry.files),
        picked=picked,
        hardware=hardware_words(hardware),
        plan=plan,
        problem=problem,
        cache_dir=settings.cache_dir,
    )


def hardware_words(hardware: Hardware) -> str:
    """``GeForce RTX 4090 (21.5 GiB usable)``, ``CPU and RAM (1.00 MiB usable)``."""
    devices = hardware.gpus or (hardware.cpu,)
    names = [d.label if d.kind == "gpu" else "CPU and RAM" for d in devices]
    return " + ".join(
        f"{name} ({format_size(d.budget_bytes)} usable)"
        for name, d in zip(names, devices, strict=True)
    )


def _entry_to_fetch(
    settings: HubSettings,
    listing: RepoListing,
    ref: HubModel | CatalogueModel,
    request: PlanRequest,
    hardware: Hardware,
) -> tuple[GgufEntry, bool]:
    """The repo entry to download, and whether the planner picked it."""
    from homelab.hub.pull import choose_entry

    wanted = _wanted(ref, request)
    if isinstance(ref, CatalogueModel):
        quant = wanted or catalogue_pick(ref, request, hardware)
        file = ref.entry.quant_file(quant).file if _in_catalogue(ref, quant) else quant
        return choose_entry(listing, file), wanted is None
    if wanted is not None or len(listing.entries) == 1:
        return choose_entry(listing, wanted), False
    return _remote_pick(settings, listing, request, hardware), True


def _in_catalogue(ref: CatalogueModel, quant: str) -> bool:
    return any(q.quant.lower() == quant.lower() for q in ref.entry.quants)


def catalogue_pick(ref: CatalogueModel, request: PlanRequest, hardware: Hardware) -> str:
    """The quant the planner picks from the entry's published shapes (the smallest when
    nothing fits: its remote plan then says why)."""
    try:
        quant = _plan(ref.variants(), request, hardware).settings.quant
    except PlanError:
        quant = None
    return quant or ref.entry.quants[-1].quant


def _remote_pick(
    settings: HubSettings, listing: RepoListing, request: PlanRequest, hardware: Hardware
) -> GgufEntry:
    """The entry the planner picks over every readable remote header (the smallest when
    nothing fits)."""
    from homelab.gguf.model import ModelInfo
    from homelab.hub.pull import choose_entry
    from homelab.hub.remote import remote_models, remote_source

    if not listing.entries:
        choose_entry(listing, None)  # raises: no GGUF files
    models = remote_models(settings, listing, listing.entries)
    readable = [m for m in models if isinstance(m, ModelInfo)]
    if not readable:
        raise next(m for m in models if not isinstance(m, ModelInfo))
    try:
        source = _plan(readable, request, hardware).model_source
    except PlanError:
        return listing.entries[-1]
    return next(e for e in listing.entries if remote_source(listing, e) == source)


def _remote_plan(
    settings: HubSettings,
    listing: RepoListing,
    entry: GgufEntry,
    request: PlanRequest,
    hardware: Hardware,
) -> tuple[Plan | None, str | None]:
    from homelab.hub.remote import remote_model

    info = remote_model(settings, listing, entry)
    request = with_remote_projector(settings, listing, entry, request, info)
    try:
        plan = _plan([info], replace(request, quant=None), hardware)
    except PlanError as error:
        return None, error.message
    return plan, None if plan.fits else "the planner's best configuration exceeds the budget"


def with_remote_projector(
    settings: HubSettings,
    listing: RepoListing,
    entry: GgufEntry,
    request: PlanRequest,
    info: ModelInfo,
) -> PlanRequest:
    """``request`` with the projector the pull would fetch beside ``entry`` (its memory in
    the offer's plan), unless ``--no-mmproj``/``--mmproj`` decide, or it does not fit."""
    from homelab.errors import ModelFileError
    from homelab.gguf.projector import check_pair
    from homelab.hub.remote import remote_projector

    if request.no_mmproj or request.mmproj_path or request.projector is not None:
        return request
    projector = remote_projector(settings, listing, entry)
    if projector is None:
        return request
    try:
        check_pair(projector, info.n_embd, info.name)
    except ModelFileError:
        return request
    return replace(request, projector=projector)


# --- 7. the download ---------------------------------------------------------------------


def _download(text: str, offer: DownloadOffer, progress: ProgressSink | None) -> HubModel:
    from homelab.hub.pull import pull
    from homelab.hub.quants import ModelRef as HubRef

    pulled = pull(HubRef(offer.repo_id, offer.quant), progress=progress)
    if progress is not None:
        how = "downloaded and verified" if pulled.downloaded_bytes else "already downloaded"
        progress.note(f"{offer.name}: {format_size(pulled.total_bytes)} {how} -> {pulled.path}")
    return _hub_ref(text, pulled.repo_id, offer.quant)
