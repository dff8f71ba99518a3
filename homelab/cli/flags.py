"""The flag groups several verbs share, and what they become: a ModelRef, a PlanRequest, the
Hardware to plan for, the engine's overrides, SamplingParams, or (``--no-plan``) Settings.

One spelling per knob, the planner's: ``--ctx 32k``, ``--parallel``, ``--kv q8_0/f16``,
``--n-gpu-layers``, ``--n-cpu-moe``, ``--n-ubatch``, ``--no-flash-attn``. The goals come from
:data:`homelab.planner.search.GOALS`, the KV cache types from :data:`homelab.settings.KV_TYPES`.
Heavy modules are imported inside the functions that need them.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from homelab.settings import KV_TYPES, UNQUANTIZED_KV_TYPES
from homelab.units import format_size

if TYPE_CHECKING:
    from homelab.engine.api import SamplingParams
    from homelab.engine.speculation.config import SpeculationConfig
    from homelab.gguf.model import ModelInfo
    from homelab.models.fetch import Confirm, DownloadOffer
    from homelab.models.launch import Overrides
    from homelab.models.ref import ModelRef
    from homelab.planner.budget import Hardware
    from homelab.planner.search import PlanRequest
    from homelab.settings import Settings

MODEL_HELP = (
    "a GGUF path, demo[:ARCH][:SIZE][:QUANT], a name from `homelab models`, "
    "a hub repo ORG/NAME[:QUANT], or a catalogue name such as llama-3.1-8b"
)
UNPLANNED_CTX = 4096  # --no-plan without --ctx


# --- MODEL -----------------------------------------------------------------------------------


def add_model(parser: argparse.ArgumentParser, *, optional: bool = False, help: str = "") -> None:
    parser.add_argument(
        "model", metavar="MODEL", nargs="?" if optional else None, help=help or MODEL_HELP
    )


def model_ref(text: str) -> ModelRef:
    from homelab.models.ref import resolve

    return resolve(text)


def add_download_flags(parser: argparse.ArgumentParser) -> None:
    """``--yes`` / ``--force``: a MODEL not on this machine is downloaded after its plan."""
    group = parser.add_argument_group("download (MODEL not on this machine yet)")
    group.add_argument(
        "-y", "--yes", action="store_true", help="download without asking (the plan is shown)"
    )
    group.add_argument(
        "--force", action="store_true", help="download even when the plan says it does not fit"
    )


def local_model(
    args: argparse.Namespace, request: PlanRequest | None = None, hardware: Hardware | None = None
) -> ModelRef:
    """``args.model`` with its file on this machine: a hub ref or catalogue name that is not
    downloaded yet is planned (shown on stderr), confirmed (``--yes``, else asked on the
    terminal) and downloaded with a progress bar on stderr — :mod:`homelab.models.fetch`."""
    from homelab.hub.render import TqdmProgress
    from homelab.models.fetch import fetch_model

    ref = model_ref(args.model)
    if ref.on_disk:
        return ref
    return fetch_model(
        ref,
        confirm=ask_to_download(args),
        progress=TqdmProgress(bars=not args.json),
        request=request,
        hardware=hardware,
        force=getattr(args, "force", False),
    )


def ask_to_download(args: argparse.Namespace) -> Confirm:
    """Show the offer on stderr; yes with ``--yes``, a refusal without a terminal, else ask."""
    import sys

    from homelab.models.fetch import DownloadRefused

    def confirm(offer: DownloadOffer) -> bool:
        print(f"homelab: {offer.describe()}", file=sys.stderr, flush=True)
        if getattr(args, "yes", False):
            return True
        if not sys.stdin.isatty():
            raise DownloadRefused(
                f"{offer.requested} is not downloaded yet, and there is no terminal to ask "
                f"whether to download {offer.name} ({format_size(offer.size_bytes)}).",
                hint="Pass --yes to download it without asking, or download it first: "
                f"homelab pull {offer.name}",
            )
        print("Download it now? [y/N] ", end="", file=sys.stderr, flush=True)
        return sys.stdin.readline().strip().lower() in ("y", "yes")

    return confirm


# --- planning --------------------------------------------------------------------------------


def add_target_hardware(parser: argparse.ArgumentParser, *, prefix: str = "") -> None:
    """``--gpu PROFILE`` / ``--vram BYTES``: plan for a GPU this machine may not have."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--gpu", metavar="PROFILE", help=f"{prefix}plan for a GPU profile (e.g. rtx-4090)"
    )
    where.add_argument(
        "--vram", metavar="BYTES", help=f"{prefix}plan for a GPU with this much VRAM (24GiB)"
    )


def add_plan_flags(parser: argparse.ArgumentParser) -> None:
    """The planning knobs of ``plan``, ``run`` and ``serve``: each one given is fixed, the
    planner chooses the others."""
    from homelab.planner.search import GOALS

    group = parser.add_argument_group("plan")
    group.add_argument(
        "--ram", metavar="BYTES", help="host RAM to plan with (default: this machine's)"
    )
    group.add_argument(
        "--ctx",
        metavar="N",
        help="context each request can use (tokens; 32k allowed); the minimum with --goal context",
    )
    group.add_argument(
        "--parallel", type=int, metavar="N", help="parallel slots (requests at once)"
    )
    group.add_argument(
        "--kv",
        metavar="TYPE",
        help=f"KV cache type ({', '.join(KV_TYPES)}), or K/V like q8_0/f16",
    )
    group.add_argument("--quant", metavar="Q", help="weight quant to use (e.g. Q4_K_M)")
    group.add_argument(
        "--goal", choices=GOALS, default=GOALS[0], help=f"what to optimise (default: {GOALS[0]})"
    )
    group.add_argument(
        "--margin", metavar="BYTES", help="VRAM to leave free on each GPU (default 256MiB)"
    )
    group.add_argument(
        "--overhead", metavar="BYTES", help="CUDA runtime overhead per GPU (default: the profile's)"
    )
    group.add_argument(
        "--n-gpu-layers", type=int, metavar="N", help="fix the number of layers on the GPU"
    )
    group.add_argument(
        "--n-cpu-moe",
        type=int,
        metavar="N",
        help="keep the experts of the first N blocks on the CPU",
    )
    group.add_argument("--n-ubatch", type=int, metavar="N", help="fix the micro-batch size")
    flash = group.add_mutually_exclusive_group()
    flash.add_argument(
        "--flash-attn",
        action="store_true",
        help="plan with flash attention (the default where layers are on a GPU; on the CPU it "
        "reads prompts faster but decodes slower as the context fills)",
    )
    flash.add_argument("--no-flash-attn", action="store_true", help="plan without flash attention")
    group.add_argument(
        "--rpc",
        metavar="HOST:PORT[,...]",
        help="also split the model over these llama.cpp RPC workers (`homelab worker`)",
    )
    group.add_argument(
        "--rpc-budget",
        metavar="BYTES",
        help="memory each RPC worker device may hold (default: its free memory minus --margin)",
    )
    group.add_argument(
        "--split-mode",
        choices=("layer", "row", "none"),
        default="layer",
        help="how layers spread over several GPUs/workers: by layer (default), by row "
        "(CUDA only), or none (all on --main-gpu)",
    )
    group.add_argument(
        "--main-gpu",
        type=int,
        default=0,
        metavar="N",
        help="with --split-mode none: the offload device to use, from 0 (RPC workers first)",
    )
    add_vision_flags(parser)


def add_vision_flags(parser: argparse.ArgumentParser) -> None:
    """The vision projector (mmproj) loaded with the model, and what an image may cost."""
    group = parser.add_argument_group("vision (images)")
    which = group.add_mutually_exclusive_group()
    which.add_argument(
        "--mmproj",
        metavar="PATH",
        help="the vision projector GGUF (default: an mmproj-*.gguf beside the model)",
    )
    which.add_argument(
        "--no-mmproj", action="store_true", help="no projector, even one beside the model"
    )
    group.add_argument(
        "--mmproj-cpu",
        action="store_true",
        help="keep the projector on the CPU (default: the GPU when it fits there)",
    )
    group.add_argument(
        "--image-max-tokens",
        type=int,
        metavar="N",
        help="most tokens one image may take (default: the projector's maximum, at most half "
        "a slot's context)",
    )


def rpc_endpoints(args: argparse.Namespace) -> tuple[str, ...]:
    """``--rpc a:1,b:2`` as normalised endpoints (empty without the flag)."""
    text = getattr(args, "rpc", None)
    if not text:
        return ()
    from homelab.llamacpp.rpc import parse_endpoint

    return tuple(dict.fromkeys(parse_endpoint(part) for part in text.split(",") if part.strip()))


def plan_request(args: argparse.Namespace) -> PlanRequest:
    from homelab.planner.rules import parse_kv
    from homelab.planner.search import PlanRequest

    request = PlanRequest(
        goal=args.goal,
        ctx=parse_tokens(args.ctx) if args.ctx else None,
        parallel=positive(args.parallel, "--parallel"),
        kv=parse_kv(args.kv) if args.kv else None,
        quant=args.quant,
        n_gpu_layers=args.n_gpu_layers,
        n_cpu_moe=args.n_cpu_moe,
        flash_attn=False if args.no_flash_attn else True if args.flash_attn else None,
        n_ubatch=positive(args.n_ubatch, "--n-ubatch"),
        split_mode=args.split_mode,
        main_gpu=args.main_gpu,
        mmproj_path=getattr(args, "mmproj", None),
        no_mmproj=bool(getattr(args, "no_mmproj", False)),
        mmproj_offload=False if getattr(args, "mmproj_cpu", False) else None,
        image_max_tokens=positive(getattr(args, "image_max_tokens", None), "--image-max-tokens")
        or 0,
    )
    return with_draft(request, args)


def hardware(args: argparse.Namespace) -> Hardware:
    """The machine to plan for: this one, or the ``--gpu`` / ``--vram`` target where the verb
    has those flags; ``--ram``, ``--margin`` and ``--overhead`` adjust it."""
    from homelab.planner.budget import DEFAULT_MARGIN_BYTES, resolve_hardware, with_workers

    margin = size(getattr(args, "margin", None))
    local = resolve_hardware(
        gpu=getattr(args, "gpu", None),
        vram_bytes=size(getattr(args, "vram", None)),
        ram_bytes=size(getattr(args, "ram", None)),
        margin_bytes=margin,
        gpu_overhead_bytes=size(getattr(args, "overhead", None)),
    )
    budget = size(getattr(args, "rpc_budget", None))
    margin = DEFAULT_MARGIN_BYTES if margin is None else margin
    return with_workers(local, rpc_endpoints(args), budget, margin)


def parse_tokens(text: str | int) -> int:
    """``8192``, ``32k`` (32768) or ``128K``."""
    from homelab.errors import PlanError

    cleaned = str(text).strip().lower()
    multiplier = 1024 if cleaned.endswith("k") else 1
    digits = cleaned.removesuffix("k")
    if not digits.isdigit() or int(digits) <= 0:
        raise PlanError(
            f"--ctx {text!r} is not a number of tokens.", hint="Write it like 8192 or 32k."
        )
    return int(digits) * multiplier


def size(text: str | None) -> int | None:
    if text is None:
        return None
    from homelab.units import parse_size

    return parse_size(text)


def positive(value: int | None, flag: str) -> int | None:
    if value is not None and value <= 0:
        from homelab.errors import PlanError

        raise PlanError(f"{flag} must be a positive number.")
    return value


# --- the engine ------------------------------------------------------------------------------


def add_engine_flags(parser: argparse.ArgumentParser, *, no_plan: bool = False) -> None:
    """Knobs the plan leaves open (threads, n_batch), and ``--no-plan`` where it makes sense."""
    group = parser.add_argument_group("engine")
    if no_plan:
        group.add_argument(
            "--no-plan",
            action="store_true",
            help="skip the planner: load the plan flags as given (unset: llama.cpp defaults)",
        )
    group.add_argument(
        "--threads", type=int, metavar="N", help="CPU threads (default: llama.cpp's own)"
    )
    group.add_argument("--batch", type=int, metavar="N", help="n_batch (default: the plan's)")


def overrides(args: argparse.Namespace) -> Overrides:
    from homelab.models.launch import Overrides

    return Overrides(
        n_threads=positive(args.threads, "--threads"),
        n_batch=positive(args.batch, "--batch"),
        speculation=speculation(args),
    )


# --- speculative decoding --------------------------------------------------------------------


def add_speculation_flags(parser: argparse.ArgumentParser) -> None:
    """``--spec ngram`` / ``--draft MODEL`` (see :mod:`homelab.engine.speculation`)."""
    group = parser.add_argument_group("speculative decoding")
    exclusive = group.add_mutually_exclusive_group()
    exclusive.add_argument(
        "--spec",
        choices=("ngram",),
        help="prompt lookup: draft the tokens that followed the last n-gram earlier in the text",
    )
    exclusive.add_argument(
        "--draft",
        metavar="MODEL",
        help="draft with this smaller model of the same vocabulary (any MODEL form, on disk)",
    )
    group.add_argument(
        "--draft-max", type=int, default=8, metavar="N", help="most tokens drafted per step (8)"
    )
    group.add_argument(
        "--draft-fixed",
        action="store_true",
        help="draft --draft-max tokens every step instead of adapting to what pays",
    )


def add_draft_flag(parser: argparse.ArgumentParser) -> None:
    """``homelab plan --draft MODEL``: plan the draft's memory beside the model."""
    parser.add_argument(
        "--draft",
        metavar="MODEL",
        help="plan with this speculative draft model loaded beside (any MODEL form, on disk)",
    )


def with_draft(request: PlanRequest, args: argparse.Namespace) -> PlanRequest:
    """``request`` with the ``--draft`` model's header, so the plan counts its memory."""
    draft = getattr(args, "draft", None)
    if not draft:
        return request
    from dataclasses import replace

    from homelab.gguf.reader import read_model

    return replace(request, draft=read_model(model_ref(draft).local_path()))


def draft_candidates() -> list[tuple[str, ModelInfo]]:
    """The local library's models (name, header) a plan may suggest as a draft."""
    from homelab.hub.library import list_local_models

    return [(m.name, m.info) for m in list_local_models() if m.info is not None]


def speculation(args: argparse.Namespace) -> SpeculationConfig | None:
    """The flags as a SpeculationConfig; None without ``--spec`` or ``--draft``."""
    spec, draft = getattr(args, "spec", None), getattr(args, "draft", None)
    if not spec and not draft:
        return None
    from homelab.engine.speculation.config import SpeculationConfig

    most = positive(getattr(args, "draft_max", None), "--draft-max") or 8
    adaptive = not getattr(args, "draft_fixed", False)
    if draft:
        path = model_ref(draft).local_path()
        return SpeculationConfig(
            "draft", draft_path=path, max_draft_tokens=most, adaptive=adaptive
        ).checked()
    return SpeculationConfig("ngram", max_draft_tokens=most, adaptive=adaptive).checked()


def unplanned_settings(args: argparse.Namespace) -> Settings:
    """``--no-plan``: the plan flags as llama.cpp settings, unset ones at plain defaults."""
    from homelab.planner.rules import parse_kv
    from homelab.settings import Settings

    type_k, type_v = parse_kv(args.kv) if args.kv else ("f16", "f16")
    ctx = parse_tokens(args.ctx) if args.ctx else UNPLANNED_CTX
    parallel = positive(args.parallel, "--parallel") or 1
    quantized_v = type_v not in UNQUANTIZED_KV_TYPES  # a quantized V cache needs flash attention
    return Settings(
        n_ctx=ctx * parallel,
        n_ctx_per_slot=ctx,
        n_parallel=parallel,
        type_k=type_k,
        type_v=type_v,
        flash_attn=not args.no_flash_attn or quantized_v,
        n_gpu_layers=args.n_gpu_layers or 0,
        n_cpu_moe=args.n_cpu_moe or 0,
        n_batch=args.batch or Settings.n_batch,
        n_ubatch=positive(args.n_ubatch, "--n-ubatch") or Settings.n_ubatch,
        n_threads=args.threads,
        rpc_servers=rpc_endpoints(args),
        split_mode=args.split_mode,
        main_gpu=args.main_gpu,
        mmproj_path=getattr(args, "mmproj", None) or "",  # --no-plan: only the one given
        mmproj_offload=not getattr(args, "mmproj_cpu", False),
        image_max_tokens=getattr(args, "image_max_tokens", None) or 0,
    )


# --- sampling --------------------------------------------------------------------------------


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling")
    group.add_argument("--max-tokens", type=int, default=256, help="tokens to generate (256)")
    group.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (0.8)")
    group.add_argument("--top-k", type=int, default=40)
    group.add_argument("--top-p", type=float, default=0.95)
    group.add_argument("--min-p", type=float, default=0.05)
    group.add_argument("--repeat-penalty", type=float, default=1.0)
    group.add_argument("--presence-penalty", type=float, default=0.0)
    group.add_argument("--frequency-penalty", type=float, default=0.0)
    group.add_argument("--seed", type=int, default=None, help="default: random")
    group.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    group.add_argument("--ignore-eos", action="store_true", help="keep going past end-of-text")


def sampling(args: argparse.Namespace) -> SamplingParams:
    from homelab.engine.api import SamplingParams

    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        seed=args.seed,
        max_tokens=args.max_tokens,
        stop=tuple(args.stop),
        ignore_eos=args.ignore_eos,
    )
