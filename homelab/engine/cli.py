"""``homelab run MODEL``: load a model, stream an answer, end with prompt/decode tok/s and TTFT.

MODEL is a GGUF path or ``demo[:ARCH][:SIZE][:QUANT]`` (a generated demo model, e.g.
``demo:bench:Q8_0``). ``--prompt TEXT`` sends one completion; ``--chat`` reads user
turns from stdin (one per line) and answers through the model's chat template. Plan flags
(``--ctx``, ``--parallel``, ``--kv-type``…) set the llama.cpp knobs directly.
Imports nothing heavy at module level.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from homelab.engine.api import FinishEvent, SamplingParams
    from homelab.engine.engine import Engine
    from homelab.settings import Settings

KV_CHOICES = ("f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "f32")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="GGUF path, or demo[:ARCH][:SIZE][:QUANT]")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--prompt", help="complete this text and exit")
    mode.add_argument("--chat", action="store_true", help="chat: one user turn per stdin line")
    parser.add_argument("--system", help="system message for --chat")
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens to generate (256)")
    _sampling_flags(parser.add_argument_group("sampling"))
    try:
        from homelab.planner.cli import add_plan_arguments
    except ImportError:  # no planner in this build: the llama.cpp knobs directly
        _plan_flags(parser.add_argument_group("plan (llama.cpp settings)"))
        parser.set_defaults(no_plan=True)
        return
    add_plan_arguments(parser)  # the same knobs as `homelab plan` and `homelab serve`
    engine = parser.add_argument_group("engine")
    engine.add_argument(
        "--no-plan", action="store_true", help="skip the planner: load the flags as given"
    )
    engine.add_argument("--threads", type=int, help="CPU threads (default: physical cores)")
    engine.add_argument("--batch", type=int, help="n_batch (default 2048)")


def _sampling_flags(group: argparse._ArgumentGroup) -> None:
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


def _plan_flags(group: argparse._ArgumentGroup) -> None:
    """Knobs fixed for the planner (unset ones it chooses); with --no-plan, used as given."""
    group.add_argument("--no-plan", action="store_true", help="skip the planner: flags as given")
    group.add_argument("--ctx", type=int, help="context per slot")
    group.add_argument("--parallel", type=int, help="slots (parallel requests)")
    group.add_argument("--kv-type", choices=KV_CHOICES, help="K and V cache type")
    group.add_argument("--flash-attn", action="store_true", default=None, help="flash attention")
    group.add_argument("--gpu-layers", type=int, help="layers on the GPU (-1 = all)")
    group.add_argument("--n-cpu-moe", type=int, help="keep experts of the first N layers on CPU")
    group.add_argument("--threads", type=int, help="CPU threads (default: physical cores)")
    group.add_argument("--batch", type=int, help="n_batch (2048)")
    group.add_argument("--ubatch", type=int, help="n_ubatch")
    group.add_argument("--swa-full", action="store_true", help="full-size sliding-window cache")


def resolve_model(spec: str) -> str:
    """A path, or a ``demo[:ARCH][:SIZE][:QUANT]`` name turned into the generated model's path."""
    from homelab.gguf.demo import demo_ref_path, is_demo_ref

    return str(demo_ref_path(spec)) if is_demo_ref(spec) else spec


def settings_from(args: argparse.Namespace) -> Settings:
    """Settings straight from the flags, without planning; unset flags take plain defaults.

    Reads either flag set: the planner's (``--ctx 32k``, ``--kv q8_0/f16``, ``--n-gpu-layers``,
    ``--no-flash-attn``…) or this module's fallback (``--kv-type``, ``--flash-attn``…).
    """
    from homelab.settings import Settings

    type_k, type_v = _kv_pair(args)
    ctx = _tokens(getattr(args, "ctx", None)) or 4096
    parallel = getattr(args, "parallel", None) or 1
    if hasattr(args, "no_flash_attn"):
        flash_attn = not args.no_flash_attn
    else:
        flash_attn = bool(getattr(args, "flash_attn", False))
    return Settings(
        n_ctx=ctx * parallel,
        n_ctx_per_slot=ctx,
        n_parallel=parallel,
        type_k=type_k,
        type_v=type_v,
        flash_attn=flash_attn or type_v not in ("f16", "bf16", "f32"),  # quantized V needs it
        n_gpu_layers=_first(args, "n_gpu_layers", "gpu_layers") or 0,
        n_cpu_moe=getattr(args, "n_cpu_moe", None) or 0,
        n_batch=getattr(args, "batch", None) or 2048,
        n_ubatch=_first(args, "n_ubatch", "ubatch") or 512,
        swa_full=bool(getattr(args, "swa_full", False)),
        n_threads=getattr(args, "threads", None),
    )


def _first(args: argparse.Namespace, *names: str) -> Any:
    return next((getattr(args, n) for n in names if getattr(args, n, None) is not None), None)


def _kv_pair(args: argparse.Namespace) -> tuple[str, str]:
    if getattr(args, "kv", None):
        from homelab.planner.rules import parse_kv

        return parse_kv(args.kv)
    kv_type = getattr(args, "kv_type", None) or "f16"
    return kv_type, kv_type


def _tokens(value: object) -> int | None:
    if value is None:
        return None
    from homelab.planner.cli import parse_tokens

    return parse_tokens(str(value))


def load_engine(path: str, args: argparse.Namespace) -> Engine:
    """Plan this file for this machine (the flags given are fixed knobs) and load the plan;
    with ``--no-plan``, load the flags as given. The plan's memory estimate goes into the
    calibration record."""
    from dataclasses import replace

    from homelab.engine.engine import Engine

    if args.no_plan:
        return Engine.load(path, settings_from(args))
    from homelab.gguf.reader import read_model
    from homelab.planner.budget import resolve_hardware
    from homelab.planner.cli import request_from_args
    from homelab.planner.plan import plan_model
    from homelab.units import parse_size

    def size(name: str) -> int | None:
        value = getattr(args, name, None)
        return parse_size(value) if value else None

    hardware = resolve_hardware(
        ram_bytes=size("ram"), margin_bytes=size("margin"), gpu_overhead_bytes=size("overhead")
    )
    request = replace(request_from_args(args), quant=None)  # this file's quant, not another
    plan = plan_model(read_model(path), hardware, request)
    settings = plan.settings
    if args.threads:
        settings = replace(settings, n_threads=args.threads)
    if args.batch:
        settings = replace(settings, n_batch=args.batch)
    return Engine.load(path, settings, predicted=plan.memory.to_dict())


def sampling_from(args: argparse.Namespace) -> SamplingParams:
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


def run(args: argparse.Namespace) -> int:
    path = resolve_model(args.model)
    with load_engine(path, args) as engine:
        if engine.load_report.stepped_down:
            print(f"homelab: {engine.load_report.summary()}", file=sys.stderr)
        if args.chat:
            return _chat(engine, args)
        return _complete(engine, args)


def _complete(engine: Engine, args: argparse.Namespace) -> int:
    from homelab.engine.api import GenerationRequest

    request = GenerationRequest(tenant="cli", prompt=args.prompt, sampling=sampling_from(args))
    text, finish = _stream(engine, request, None if args.json else sys.stdout)
    if args.json:
        print(json.dumps(_document(engine, text, finish), indent=2))
    else:
        print(file=sys.stdout)
        print(format_stats(finish), file=sys.stderr)
    return 0 if finish.reason != "error" else 1


def _chat(engine: Engine, args: argparse.Namespace) -> int:
    from homelab.engine.api import GenerationRequest

    messages: list[dict[str, Any]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    turns: list[dict[str, Any]] = []
    interactive = sys.stdin.isatty() and not args.json
    while True:
        if interactive:
            print("you> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line.rstrip("\n")})
        prompt = engine.render_chat(messages)
        request = GenerationRequest("cli", prompt, sampling_from(args), add_bos=True)
        text, finish = _stream(engine, request, None if args.json else sys.stdout)
        messages.append({"role": "assistant", "content": text})
        if args.json:
            turns.append(_document(engine, text, finish))
        else:
            print(file=sys.stdout)
            print(format_stats(finish), file=sys.stderr)
        if finish.reason == "error":
            return 1
    if args.json:
        print(json.dumps({"turns": turns}, indent=2))
    return 0


def _stream(engine: Engine, request: Any, out: TextIO | None) -> tuple[str, FinishEvent]:
    from homelab.engine.api import FinishEvent

    pieces: list[str] = []
    for event in engine.submit(request):
        if isinstance(event, FinishEvent):
            if event.error:
                print(f"homelab: generation failed: {event.error}", file=sys.stderr)
            return "".join(pieces), event
        pieces.append(event.text)
        if out is not None and event.text:
            out.write(event.text)
            out.flush()
    raise AssertionError("a request stream always ends with a FinishEvent")


def format_stats(finish: FinishEvent) -> str:
    s = finish.stats
    return (
        f"[{finish.reason}] prompt {s.prompt_tokens} tok (cached {s.cached_tokens}) "
        f"{s.prefill_tok_s:.1f} tok/s · decode {s.completion_tokens} tok "
        f"{s.decode_tok_s:.1f} tok/s · TTFT {s.ttft_s * 1000:.0f} ms"
    )


def _document(engine: Engine, text: str, finish: FinishEvent) -> dict[str, Any]:
    from dataclasses import asdict

    return {
        "text": text,
        "finish_reason": finish.reason,
        "error": finish.error,
        "stats": asdict(finish.stats),
        "load": {
            "summary": engine.load_report.summary(),
            "settings": engine.settings.to_dict(),
            "n_ctx_per_slot": engine.n_ctx_per_slot,
            "prefix_reuse": engine.load_report.prefix_reuse_note,
        },
    }
