"""``homelab run MODEL``: load a model, stream an answer, end with prompt/decode tok/s and TTFT.

MODEL is a GGUF path or ``demo:ARCH[:SIZE[:QUANT]]`` (a generated demo model, e.g.
``demo:llama:bench:Q8_0``). ``--prompt TEXT`` sends one completion; ``--chat`` reads user
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
    from homelab.planner.settings import Settings

KV_CHOICES = ("f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "f32")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="GGUF path, or demo:ARCH[:SIZE[:QUANT]]")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--prompt", help="complete this text and exit")
    mode.add_argument("--chat", action="store_true", help="chat: one user turn per stdin line")
    parser.add_argument("--system", help="system message for --chat")
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens to generate (256)")
    _sampling_flags(parser.add_argument_group("sampling"))
    _plan_flags(parser.add_argument_group("plan (llama.cpp settings)"))


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
    group.add_argument("--ctx", type=int, default=4096, help="context per slot (4096)")
    group.add_argument("--parallel", type=int, default=1, help="slots (1)")
    group.add_argument("--kv-type", choices=KV_CHOICES, default="f16", help="K and V cache type")
    group.add_argument("--flash-attn", action="store_true", help="enable flash attention")
    group.add_argument("--gpu-layers", type=int, default=0, help="layers on the GPU (-1 = all)")
    group.add_argument("--n-cpu-moe", type=int, default=0, help="keep experts of N layers on CPU")
    group.add_argument("--threads", type=int, default=None)
    group.add_argument("--batch", type=int, default=2048, help="n_batch (2048)")
    group.add_argument("--ubatch", type=int, default=512, help="n_ubatch (512)")
    group.add_argument("--swa-full", action="store_true", help="full-size sliding-window cache")


def resolve_model(spec: str) -> str:
    """A path, or ``demo:ARCH[:SIZE[:QUANT]]`` turned into the generated demo model's path."""
    if not spec.startswith("demo:"):
        return spec
    from homelab.gguf.demo import demo_model_path

    parts = spec.split(":")[1:]
    arch = parts[0] if parts and parts[0] else "llama"
    size = parts[1] if len(parts) > 1 else "tiny"
    quant = parts[2] if len(parts) > 2 else "F16"
    return str(demo_model_path(arch, size, quant))


def settings_from(args: argparse.Namespace) -> Settings:
    from homelab.planner.settings import Settings

    quantized = args.kv_type not in ("f16", "bf16", "f32")
    return Settings(
        n_ctx=args.ctx * args.parallel,
        n_ctx_per_slot=args.ctx,
        n_parallel=args.parallel,
        type_k=args.kv_type,
        type_v=args.kv_type,
        flash_attn=args.flash_attn or quantized,  # a quantized V cache needs flash attention
        n_gpu_layers=args.gpu_layers,
        n_cpu_moe=args.n_cpu_moe,
        n_batch=args.batch,
        n_ubatch=args.ubatch,
        swa_full=args.swa_full,
        n_threads=args.threads,
    )


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
    from homelab.engine.engine import Engine

    path = resolve_model(args.model)
    with Engine.load(path, settings_from(args)) as engine:
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
