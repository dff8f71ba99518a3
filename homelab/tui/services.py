"""The dashboard's doorway to the headless core (Textual-free, so it is testable alone).

Everything the UI does to a model — choose it, plan it, load it, serve it — goes through
these functions, which call ``homelab.models`` (names are resolved and plans loaded exactly
as the CLI verbs do), ``homelab.planner``, ``homelab.server`` and ``homelab.hub`` and return
their own objects (a ``Plan``, an ``Engine``...). They block, so the app calls them from
thread workers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from homelab.engine.api import DEFAULT_TEMPERATURE
from homelab.errors import HomelabError
from homelab.tui.format import human_tokens
from homelab.tui.knobs import Knobs
from homelab.units import format_size

if TYPE_CHECKING:
    from homelab.engine.loader import LoadReport
    from homelab.engine.prompt_cache.store import PromptCache
    from homelab.engine.speculation.config import SpeculationConfig
    from homelab.hardware.report import HardwareReport
    from homelab.hub.library import LocalModel
    from homelab.images.decoded import DecodedImage
    from homelab.models.ref import ModelRef
    from homelab.planner.budget import Hardware
    from homelab.planner.plan import Plan
    from homelab.planner.search import PlanRequest
    from homelab.server.middleware import RequestRecord
    from homelab.server.runner import EngineHolder
    from homelab.server.yielding import YieldController
    from homelab.tui.hardware_source import HardwareSource
    from homelab.tui.protocols import AnswerStream, DashboardEngine, HttpServerHandle

ModelKind = Literal["local", "catalogue", "hub", "demo"]
DEMO_REF = "demo"  # the offline default: shipped weights, trained on Python's docs
TRAINED_NOTE = "small demo model trained on Python's documentation: simple English, knows nothing"
RANDOM_NOTE = "demo model, random weights"


@dataclass(frozen=True)
class ModelChoice:
    """A model the user can pick, as the picker and the plan panel show it. ``model`` is what
    it is (a :mod:`homelab.models.ref` ref): planning and loading use that and nothing else."""

    model: ModelRef
    ref: str  # the picker's key: the file's path, else the name as typed
    label: str  # what the UI shows
    kind: ModelKind
    path: Path | None  # None: not on this machine (a catalogue entry or hub file to pull first)
    size_bytes: int | None = None
    detail: str = ""  # e.g. "hf · org/name", "catalogue · org/name-GGUF"
    note: str = ""  # what a demo model is and is not (RANDOM_NOTE / TRAINED_NOTE)

    @property
    def is_demo(self) -> bool:
        return self.kind == "demo"

    @property
    def runnable(self) -> bool:
        return self.path is not None

    @property
    def title(self) -> str:
        """The name with the plain warning a demo model needs."""
        return f"{self.label} — {self.note}" if self.note else self.label


@dataclass(frozen=True)
class FitBadge:
    """How a model fits this machine, in a few words, computed by the planner."""

    label: str  # e.g. "fits · f16 KV · 32k tokens"
    level: Literal["good", "ok", "offload", "no", "unknown"]
    quant: str | None = None  # the quant the plan chose (what a download should fetch)


# --- choosing a model ----------------------------------------------------------------------


def choice_for(model: ModelRef, size_bytes: int | None = None) -> ModelChoice:
    """How ``model`` is shown (a demo model's file is shown as one wherever it was found)."""
    path = model.local_path() if model.on_disk else None
    demo = demo_identity(path) if path is not None else None
    if size_bytes is None and path is not None:
        size_bytes = path.stat().st_size
    return ModelChoice(
        model=model,
        ref=str(path) if path is not None else model.text,
        label=demo[0] if demo else model.label,
        kind="demo" if demo else model.kind,
        path=path,
        size_bytes=size_bytes,
        detail=model.origin,
        note=demo[1] if demo else "",
    )


def demo_choice(name: str = DEMO_REF) -> ModelChoice:
    """A demo model: the trained one by default, ``demo:llama:tiny`` and the like on request."""
    from homelab.models.ref import resolve

    return choice_for(resolve(name))


def demo_identity(path: Path) -> tuple[str, str] | None:
    """(label, note) of a demo model's file wherever it lies, else None: "trained demo" for
    the shipped homelab-trained-llama-Q4_K_M.gguf, "llama tiny demo" (random weights) for a
    generated homelab-demo-llama-tiny-v2-F16.gguf."""
    from homelab.gguf.demo import TRAINED_STEM

    if path.stem.startswith(f"{TRAINED_STEM}-"):
        return "trained demo", TRAINED_NOTE
    parts = path.stem.split("-")
    if len(parts) < 5 or parts[:2] != ["homelab", "demo"]:
        return None
    return f"{parts[2]} {parts[3]} demo", RANDOM_NOTE


def catalogue_choice(slug: str) -> ModelChoice:
    from homelab.models.ref import catalogue_ref

    model = catalogue_ref(slug)
    best = model.entry.quants[0] if model.entry.quants else None
    return choice_for(model, size_bytes=best.size_bytes if best else None)


def choose_model(requested: str | None) -> ModelChoice:
    """``requested`` as given on the command line, resolved like every verb's MODEL
    (:func:`homelab.models.ref.resolve`); None: the first local model, else the demo."""
    if requested is None:
        local = [choice for choice in local_choices() if choice.runnable]
        return local[0] if local else demo_choice()
    from homelab.models.ref import resolve

    return choice_for(resolve(requested))


def local_choices() -> list[ModelChoice]:
    """GGUF files in the library folders and the Hugging Face cache, readable ones first."""
    from homelab.hub.library import list_local_models

    models = list_local_models()
    return [_from_library(model) for model in sorted(models, key=lambda m: m.info is None)]


def _from_library(model: LocalModel) -> ModelChoice:
    from homelab.models.ref import LocalFile, from_library

    if model.info is not None:
        return choice_for(from_library(model), size_bytes=model.size_bytes)
    unreadable = LocalFile(
        model.ref, model.path, model.file_stem, model.origin
    )  # listed, not loaded
    shown = choice_for(unreadable, size_bytes=model.size_bytes)
    return replace(shown, path=None, detail=f"{model.origin} · unreadable: {model.problem}")


def catalogue_choices() -> list[ModelChoice]:
    from homelab.gguf.catalogue import load_catalogue

    return [catalogue_choice(slug) for slug in load_catalogue()]


def picker_choices() -> list[ModelChoice]:
    """Everything the picker lists: local files, then catalogue entries, then the demo."""
    choices = local_choices()
    with contextlib.suppress(HomelabError):  # a broken catalogue must not hide local models
        choices += catalogue_choices()
    if not any(choice.is_demo for choice in choices):
        choices.append(demo_choice())
    return choices


def model_line(choice: ModelChoice) -> str:
    """The plan panel's first line (markup)."""
    from rich.markup import escape

    size = "" if choice.size_bytes is None else f" · {format_size(choice.size_bytes)}"
    demo = f" [b $warning]{escape(choice.note)}[/]" if choice.note else ""
    where = "" if choice.runnable else " [dim](not downloaded)[/]"
    return f"[b]{escape(choice.label)}[/b]{demo}{where}[dim]{size} · {escape(choice.detail)}[/]"


def quant_options(plan: Plan) -> tuple[str, ...]:
    """Quants the user can switch between: the variants the planner considered (a catalogue
    entry's files, or sibling files next to a local one), best first."""
    return tuple(plan.quants_considered)


# --- planning ------------------------------------------------------------------------------


def plan_request(knobs: Knobs) -> PlanRequest:
    from homelab.planner.search import PlanRequest

    kv = None if knobs.kv_type is None else (knobs.kv_type, knobs.kv_type)
    return PlanRequest(
        ctx=knobs.n_ctx_per_slot, parallel=knobs.n_parallel, kv=kv, quant=knobs.quant
    )


def plan_choice(
    choice: ModelChoice,
    report: HardwareReport,
    knobs: Knobs,
    *,
    verify: bool = False,
    rpc: tuple[str, ...] = (),
    rpc_budget_bytes: int | None = None,
) -> Plan:
    """Plan ``choice`` for the machine in ``report`` with the user's knobs, and the devices
    of the RPC workers ``rpc`` (``--rpc``; asked for their free memory now, as every verb
    does — :func:`homelab.planner.budget.with_workers`), each device capped at
    ``rpc_budget_bytes`` (``--rpc-budget``) when given.

    Without ``verify`` this is pure arithmetic (milliseconds: knobs re-plan instantly); with
    it, a plan for a local file is confirmed by a llama.cpp dry run (a second or so).
    """
    from homelab.planner.budget import hardware_from_report, with_workers

    hardware = with_workers(hardware_from_report(report), rpc, rpc_budget_bytes)
    return plan_for(choice, hardware, knobs, verify=verify)


def plan_for(choice: ModelChoice, hardware: Hardware, knobs: Knobs, *, verify: bool) -> Plan:
    """Plan ``choice`` for ``hardware`` with the user's knobs (and the mmproj beside it)."""
    from homelab.models.mmproj import with_projector
    from homelab.planner.plan import plan_model

    variants = choice.model.variants()
    request = with_projector(plan_request(knobs), variants[0])  # the mmproj beside the file
    return plan_model(variants, hardware, request, verify=verify)


def probe_workers(
    endpoints: tuple[str, ...], budget_bytes: int | None = None
) -> tuple[WorkerLine, ...]:
    """Each RPC worker's devices and free memory (and the ``--rpc-budget`` a plan gives each
    device, never more than it has free), or why it cannot be reached."""
    from homelab.llamacpp.rpc import probe

    lines: list[WorkerLine] = []
    for endpoint in endpoints:
        try:
            info = probe(endpoint)
        except HomelabError as error:
            lines.append(WorkerLine(endpoint, None, 0, 0, problem=error.message))
            continue
        for device in info.devices:
            free, total = device.free_bytes, device.total_bytes
            budget = None if budget_bytes is None else min(budget_bytes, free)
            lines.append(WorkerLine(endpoint, device.buffer_name, free, total, budget_bytes=budget))
    return tuple(lines)


@dataclass(frozen=True)
class WorkerLine:
    """One device of an RPC worker as the hardware panel lists it."""

    endpoint: str
    device: str | None  # llama.cpp's name for it, "RPC0[127.0.0.1:50052]"; None: unreachable
    free_bytes: int
    total_bytes: int
    problem: str = ""
    budget_bytes: int | None = None  # --rpc-budget: what a plan may put on this device


def fit_badge(choice: ModelChoice, report: HardwareReport) -> FitBadge:
    """How ``choice`` fits this machine with the planner's own choices."""
    from homelab.errors import PlanError

    try:
        plan = plan_choice(choice, report, Knobs())
    except PlanError:
        return FitBadge("does not fit", "no")
    except HomelabError as error:
        return FitBadge(f"cannot plan: {error.message}", "unknown")
    return badge_for(plan)


BADGE_MIN_CONTEXT = 4096  # a KV type "fits" when a slot gets at least this much context


def badge_for(plan: Plan) -> FitBadge:
    """The best KV type that gives a useful context with the plan's weights and offload."""
    return replace(_badge(plan), quant=plan.settings.quant)


def _badge(plan: Plan) -> FitBadge:
    if not plan.fits:
        return FitBadge("does not fit", "no")
    s = plan.settings
    if plan.hardware.has_gpu and (s.n_gpu_layers < plan.full_offload_layers or s.n_cpu_moe):
        return FitBadge(f"needs offload · {human_tokens(s.n_ctx_per_slot)} tokens", "offload")
    wanted = min(BADGE_MIN_CONTEXT, plan.trained_context)
    where = "" if plan.hardware.has_gpu else " on CPU"
    for row in plan.capacity:
        if row.type_k == row.type_v and row.max_ctx >= wanted:
            level: Literal["good", "ok"] = "good" if row.type_k == "f16" else "ok"
            return FitBadge(
                f"fits{where} with {row.type_k} KV at {human_tokens(row.max_ctx)} tokens", level
            )
    return FitBadge(f"fits{where} at {human_tokens(s.n_ctx_per_slot)} tokens", "ok")


# --- downloading -------------------------------------------------------------------------


def pull_name(choice: ModelChoice, quant: str | None) -> str:
    """``ORG/NAME:QUANT`` for a catalogue entry or hub reference."""
    name = None if choice.runnable else choice.model.pull_name(quant)
    if name is None:
        raise HomelabError(f"{choice.label} is already on this machine.")
    return name


def pull_choice(choice: ModelChoice, quant: str | None, progress: object) -> ModelChoice:
    """Download ``choice`` (``quant``: the one its fit badge planned) the way every verb does
    — :func:`homelab.models.fetch.fetch_model`: planned from the remote header, refused when
    it does not fit, then the verified, resumable pull into the Hugging Face cache — and return
    the local model it became. The user asked for it, so nothing more is asked. Blocking:
    minutes for a big file."""
    from homelab.models.fetch import agree, fetch_model
    from homelab.planner.search import PlanRequest

    pull_name(choice, quant)  # raises when it is already here
    local = fetch_model(
        choice.model,
        confirm=agree,
        progress=progress,  # type: ignore[arg-type]
        request=PlanRequest(quant=quant),
    )
    return choice_for(local)


# --- running ---------------------------------------------------------------------------------

CHAT_MAX_TOKENS = 256
CHAT_TEMPERATURE = DEFAULT_TEMPERATURE  # `homelab tui --temperature`; 0 = greedy


def load_engine(
    choice: ModelChoice,
    plan: Plan,
    speculation: SpeculationConfig | None = None,
    prompt_cache: PromptCache | None = None,
) -> DashboardEngine:
    """Load the file ``plan`` was made for (``choice``'s, or the sibling quant the planner
    picked) with the plan's settings, the plan's memory prediction going into the calibration
    record (blocking: seconds for a big model); ``speculation`` (``--spec`` / ``--draft``)
    goes to the engine as ``homelab run`` passes it; its slots' states go to ``prompt_cache``
    when it closes (a yield) and come back from it."""
    from homelab.models.launch import Overrides, load_plan

    overrides = Overrides(speculation=speculation)
    return load_plan(choice.model, plan, overrides, prompt_cache=prompt_cache)


def load_report(engine: DashboardEngine) -> LoadReport | None:
    return getattr(engine, "load_report", None)


def loaded_line(choice: ModelChoice | None, report: LoadReport | None, load_s: str) -> str:
    """The live panel's state line once a model is loaded (markup)."""
    from rich.markup import escape

    name = escape(choice.label) if choice else "model"
    demo = f" [b $warning]({escape(choice.note)})[/]" if choice and choice.note else ""
    summary = report.summary() if report is not None else "loaded"
    slots = ""
    if report is not None:
        noun = "slot" if report.n_slots == 1 else "slots"
        slots = f" · {report.n_slots} {noun} × {report.n_ctx_per_slot:,} tokens"
    return f"[b $success]●[/] {name}{demo} — {escape(summary)} in {load_s}{slots}"


def submit_chat(
    engine: DashboardEngine,
    history: list[dict[str, str]],
    tenant: str,
    max_tokens: int = CHAT_MAX_TOKENS,
    temperature: float = CHAT_TEMPERATURE,
    images: Sequence[DecodedImage] = (),
) -> AnswerStream:
    """Render the conversation with the model's chat template and submit it (``temperature``
    0: greedy). ``images`` are the conversation's, in order: each stands in the turns' text
    as the engine's image marker (:func:`marked_turn`).

    A model without a usable template gets the last prompt as plain text. When the whole
    conversation no longer fits a slot, only the last turn is sent (with its own images).
    """
    from homelab.engine.api import GenerationRequest, SamplingParams
    from homelab.errors import ContextLengthError

    sampling = SamplingParams(
        temperature=temperature, max_tokens=min(max_tokens, engine.n_ctx_per_slot // 2)
    )

    def request(turns: list[dict[str, str]], shown: Sequence[DecodedImage]) -> AnswerStream:
        prompt = _chat_prompt(engine, turns)
        if not shown:
            return engine.submit(GenerationRequest(tenant, prompt, sampling))
        with_images = engine.tokenize_images(prompt, shown, add_bos=True)
        return engine.submit(
            GenerationRequest(tenant, with_images.tokens, sampling, images=with_images)
        )

    try:
        return request(history, images)
    except ContextLengthError:
        if len(history) <= 1:
            raise
        marker = engine.image_marker or ""
        last = history[-1]["content"].count(marker) if marker else 0
        return request(history[-1:], images[len(images) - last :] if last else ())


@dataclass(frozen=True)
class ImageAttachment:
    """An image the chat will send with the next prompt, and what the panel shows of it."""

    name: str
    size_bytes: int
    image: DecodedImage
    n_tokens: int | None  # KV cells it takes with the loaded projector (None: not loaded)

    def describe(self) -> str:
        tokens = f"{self.n_tokens} tokens" if self.n_tokens is not None else "tokens: on load"
        return (
            f"attached {self.name} · {format_size(self.size_bytes)} · "
            f"{self.image.width_px}×{self.image.height_px} px · {tokens}"
        )


MAX_ATTACH_BYTES = 20 * 1024 * 1024  # the server's per-image cap


def attach_image(path: str, engine: DashboardEngine | None) -> ImageAttachment:
    """Read and decode the image at ``path`` (checked as the server checks uploads) and count
    its tokens with ``engine``'s projector; HomelabError when it cannot be sent."""
    from homelab.images.decode import decode_image

    file = Path(path).expanduser()
    try:
        size_bytes = file.stat().st_size
        if size_bytes > MAX_ATTACH_BYTES:
            raise HomelabError(
                f"{file.name} is {size_bytes} bytes, more than {MAX_ATTACH_BYTES}",
                hint="Attach a smaller image.",
            )
        data = file.read_bytes()
    except OSError as exc:
        raise HomelabError(
            f"cannot read the image {file}: {exc.strerror or exc}", hint="Check the path."
        ) from exc
    image = decode_image(data)
    return ImageAttachment(file.name, size_bytes, image, image_tokens(engine, image))


def image_tokens(engine: DashboardEngine | None, image: DecodedImage) -> int | None:
    """The KV cells ``image`` takes with ``engine``'s projector (None: no projector)."""
    marker = engine.image_marker if engine is not None else None
    if engine is None or marker is None:
        return None
    prompt = engine.tokenize_images(marker, [image], add_bos=False)
    return sum(span.n_tokens for span in prompt.images)


def marked_turn(engine: DashboardEngine | None, prompt: str, n_images: int) -> str:
    """A user turn's text with its images first, one marker each (the text alone without)."""
    marker = engine.image_marker if engine is not None else None
    if not n_images or marker is None:
        return prompt
    return marker * n_images + "\n" + prompt


def _chat_prompt(engine: DashboardEngine, turns: list[dict[str, str]]) -> str:
    template = engine.chat_template
    if template is None:
        return turns[-1]["content"]
    return template.render(turns, add_generation_prompt=True)


# --- serving ---------------------------------------------------------------------------------


def start_server(
    holder: EngineHolder,
    name: str,
    host: str,
    port: int,
    *,
    on_request: Callable[[RequestRecord], None],
    yielding: YieldController | None = None,
) -> RunningServer:
    """Serve ``holder``'s engine as ``name`` on ``host:port`` in a background thread;
    ``on_request`` gets each finished request's record (status, tenant, tokens — never prompt
    text). With ``yielding`` its requests wait while the GPU is given back (then 503), and
    ``homelab yield`` / ``resume`` reach it (``/admin/yield``).

    API keys are on when the keys file exists (``homelab serve --new-key`` creates it).
    """
    from homelab.server.auth import default_keys_path, load_keys
    from homelab.server.config import ServerConfig
    from homelab.server.runner import start_server as run_server

    keys_path = default_keys_path()
    keys = load_keys(keys_path) if keys_path.exists() else None
    config = ServerConfig(model_id=name, keys=keys)
    handle = run_server(holder, host, port, config, yielding=yielding)
    handle.subscribe(on_request)
    return RunningServer(handle, keys_on=keys is not None)


@dataclass(frozen=True)
class RunningServer:
    handle: HttpServerHandle  # homelab.server.runner.ServerHandle
    keys_on: bool

    @property
    def url(self) -> str:
        """The OpenAI base URL (what a client's base_url is set to)."""
        return str(self.handle.base_url)

    def stop(self) -> None:
        self.handle.stop()


@dataclass(frozen=True)
class ServedModel:
    """A model the running server has loaded, as the server panel lists it."""

    name: str  # the ``model`` id clients send
    planned_bytes: int | None  # the plan's total for it (None: no plan)
    allocated_bytes: int | None  # what llama.cpp reported allocating (None: not known)
    n_slots: int


def served_models(engine: DashboardEngine, plan: Plan | None) -> tuple[ServedModel, ...]:
    """What the TUI's own server has loaded: its one engine, with planned and real memory."""
    report = load_report(engine)
    return (
        ServedModel(
            name=served_name(engine),
            planned_bytes=plan.memory.total_bytes if plan is not None else None,
            allocated_bytes=report.buffers.total_bytes() if report is not None else None,
            n_slots=report.n_slots if report is not None else 0,
        ),
    )


def served_name(engine: DashboardEngine) -> str:
    """The model id the server answers to (the file's stem, as ``homelab serve`` names it)."""
    return Path(str(engine.model_info.source)).stem


def server_url(server: RunningServer) -> str:
    return server.url


def keys_on(server: RunningServer) -> bool:
    return server.keys_on


# --- giving the GPU back ---------------------------------------------------------------------

PROMPT_CACHE_RAM_BYTES = 256 * 1024 * 1024  # RAM only; beside a model's plan, not in it
YIELD_REASON = "asked from the dashboard"


def open_prompt_cache() -> PromptCache:
    """The dashboard's prompt cache: what a yield saves of its chat and its server's clients
    comes back on resume (and a conversation's longer prefix at any admission)."""
    from homelab.engine.prompt_cache.store import CacheConfig, PromptCache

    return PromptCache(CacheConfig(PROMPT_CACHE_RAM_BYTES, 0, None))


def engine_holder() -> EngineHolder:
    """Where the loaded engine lives for the server and the yield controller (None: none)."""
    from homelab.server.runner import EngineHolder

    return EngineHolder()


def yield_or_resume(controller: YieldController) -> None:
    """Give the GPU back while serving, else take it again (blocking: drains, saves, loads)."""
    if controller.state == "serving":
        controller.call(controller.yield_gpu("asked", YIELD_REASON))
    else:
        controller.call(controller.resume())


@dataclass(frozen=True)
class Loading:
    """How the dashboard loads a model: what a resume needs to load it again."""

    source: HardwareSource
    speculation: SpeculationConfig | None
    prompt_cache: PromptCache | None
    rpc: tuple[str, ...] = ()
    rpc_budget_bytes: int | None = None


def yield_controller(
    holder: EngineHolder, choice: ModelChoice, plan: Plan, knobs: Knobs, loading: Loading
) -> YieldController:
    """Yield and resume ``holder``'s engine (``choice`` loaded with ``plan``): the engine is
    closed (its slots saved) on yield; a resume re-detects the hardware, re-plans ``choice``
    with ``knobs`` for the VRAM free then and loads it. Blocking calls go through
    :meth:`YieldController.call`."""
    from homelab.planner.budget import hardware_from_report, with_workers
    from homelab.server.yield_targets import SingleResidency
    from homelab.server.yielding import YieldController

    def hardware_now() -> Hardware:
        report = loading.source.detect()
        return with_workers(hardware_from_report(report), loading.rpc, loading.rpc_budget_bytes)

    def plan_now(hardware: Hardware) -> Plan:
        return plan_for(choice, hardware, knobs, verify=True)

    def load(planned: Plan) -> DashboardEngine:
        return load_engine(choice, planned, loading.speculation, loading.prompt_cache)

    residency = SingleResidency(holder, choice.label, plan, plan_now, load)
    return YieldController(
        residency,
        hardware_now,
        gpus=lambda: loading.source.sample().gpus,
        prompt_cache=loading.prompt_cache,
    )
