"""``homelab run MODEL``: load a model, stream an answer, end with prompt/decode tok/s and TTFT.

MODEL is any form ``homelab plan`` takes. One that is not on this machine yet (a hub ref, a
catalogue name) is downloaded first: its plan from the remote header is shown, then (with
``--yes``, or after asking) the verified download with a progress bar, then the run — see
:mod:`homelab.models.fetch`. ``--prompt TEXT`` sends one completion; ``--chat`` reads user
turns from stdin (one per line) and answers through the model's chat template. ``--image
PATH`` (repeatable) puts images before the prompt, or in the first chat turn: the model needs
its vision projector (mmproj) loaded, and each image is decoded and checked like the
server's (``homelab.images.decode``). The model is
planned like ``homelab plan`` with the same flags (each one given is fixed); ``--no-plan``
loads the flags as given.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any, TextIO

from homelab.cli import flags

if TYPE_CHECKING:
    from homelab.engine.api import FinishEvent, GenerationRequest, SamplingParams
    from homelab.engine.engine import Engine
    from homelab.images.decoded import DecodedImage


def configure(parser: argparse.ArgumentParser) -> None:
    flags.add_model(parser)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--prompt", help="complete this text and exit")
    mode.add_argument("--chat", action="store_true", help="chat: one user turn per stdin line")
    parser.add_argument("--system", help="system message for --chat")
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="PATH",
        help="an image for a vision model (repeatable): before --prompt, or in the first "
        "--chat turn",
    )
    flags.add_sampling_flags(parser)
    flags.add_plan_flags(parser)  # the same knobs as `homelab plan` and `homelab serve`
    flags.add_engine_flags(parser, no_plan=True)
    flags.add_speculation_flags(parser)
    flags.add_download_flags(parser)


def run(args: argparse.Namespace) -> int:
    images = _read_images(args.image)
    with open_for_run(args) as engine:
        args.images = _checked_images(engine, images)
        if engine.load_report.stepped_down:
            print(f"homelab: {engine.load_report.summary()}", file=sys.stderr)
        if args.chat:
            return _chat(engine, args)
        return _complete(engine, args)


def open_for_run(args: argparse.Namespace) -> Engine:
    """MODEL (downloaded first when it is not here), planned for this machine with the flags
    as fixed knobs, loaded; ``--no-plan``: the flags as given."""
    from homelab.models.launch import load_unplanned, open_engine

    if args.no_plan:
        settings = flags.unplanned_settings(args)
        return load_unplanned(
            flags.local_model(args), settings, speculation=flags.speculation(args)
        )
    request, hardware = flags.plan_request(args), flags.hardware(args)
    ref = flags.local_model(args, request, hardware)
    engine, _ = open_engine(ref, request, hardware, flags.overrides(args))
    return engine


def _complete(engine: Engine, args: argparse.Namespace) -> int:

    request = _request(engine, args.prompt, args.images, flags.sampling(args), add_bos=True)
    text, finish = _stream(engine, request, None if args.json else sys.stdout)
    if args.json:
        print(json.dumps(_document(engine, text, finish), indent=2))
    else:
        print(file=sys.stdout)
        print(format_stats(finish), file=sys.stderr)
    return 0 if finish.reason != "error" else 1


def _chat(engine: Engine, args: argparse.Namespace) -> int:

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
        first_turn = not any(m["role"] == "user" for m in messages)
        images = args.images if first_turn else []
        marked = "".join(engine.image_marker or "" for _ in images)
        messages.append({"role": "user", "content": marked + line.rstrip("\n")})
        prompt = engine.render_chat(messages)
        request = _request(engine, prompt, images, flags.sampling(args), add_bos=True)
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


def _read_images(paths: list[str]) -> list[DecodedImage]:
    """Each ``--image`` file decoded and checked (before the model loads)."""
    from pathlib import Path

    from homelab.errors import HomelabError
    from homelab.images.decode import decode_image

    images = []
    for path in paths:
        try:
            data = Path(path).expanduser().read_bytes()
        except OSError as exc:
            raise HomelabError(f"cannot read the image {path}: {exc.strerror or exc}") from exc
        images.append(decode_image(data))
    return images


def _checked_images(engine: Engine, images: list[DecodedImage]) -> list[DecodedImage]:
    if images and engine.image_marker is None:
        from homelab.errors import HomelabError

        raise HomelabError(
            f"{engine.model_info.name} takes no images: no vision projector (mmproj) is loaded",
            hint="Use a vision model whose mmproj file is next to it (or given with --mmproj).",
        )
    return images


def _request(
    engine: Engine,
    text: str,
    images: list[DecodedImage],
    sampling: SamplingParams,
    *,
    add_bos: bool,
) -> GenerationRequest:
    """A completion of ``text``; with images, they come first (one marker each)."""
    from homelab.engine.api import GenerationRequest

    if not images:
        return GenerationRequest("cli", text, sampling, add_bos=add_bos)
    marker = engine.image_marker or ""
    marked = text if marker in text else "".join(marker for _ in images) + "\n" + text
    prompt = engine.tokenize_images(marked, images, add_bos=add_bos)
    return GenerationRequest("cli", prompt.tokens, sampling, images=prompt)


def _stream(
    engine: Engine, request: GenerationRequest, out: TextIO | None
) -> tuple[str, FinishEvent]:
    from homelab.engine.api import FinishEvent

    pieces: list[str] = []
    for events in engine.submit(request).chunks():  # not woken per token (RequestHandle.chunks)
        shown = len(pieces)
        for event in events:
            if isinstance(event, FinishEvent):
                _show(out, pieces[shown:])
                if event.error:
                    print(f"homelab: generation failed: {event.error}", file=sys.stderr)
                return "".join(pieces), event
            pieces.append(event.text)
        _show(out, pieces[shown:])
    raise AssertionError("a request stream always ends with a FinishEvent")


def _show(out: TextIO | None, pieces: list[str]) -> None:
    text = "".join(pieces)
    if out is not None and text:
        out.write(text)
        out.flush()


def format_stats(finish: FinishEvent) -> str:
    s = finish.stats
    drafts = f" · drafts kept {s.accepted_draft_tokens}/{s.draft_tokens}" if s.draft_tokens else ""
    return (
        f"[{finish.reason}] prompt {s.prompt_tokens} tok (cached {s.cached_tokens}) "
        f"{s.prefill_tok_s:.1f} tok/s · decode {s.completion_tokens} tok "
        f"{s.decode_tok_s:.1f} tok/s · TTFT {s.ttft_s * 1000:.0f} ms{drafts}"
    )


def _document(engine: Engine, text: str, finish: FinishEvent) -> dict[str, Any]:
    from dataclasses import asdict

    return {
        "text": text,
        "finish_reason": finish.reason,
        "error": finish.error,
        "stats": asdict(finish.stats),
        "load": {
            "path": engine.load_report.model_path,
            "summary": engine.load_report.summary(),
            "settings": engine.settings.to_dict(),
            "n_ctx_per_slot": engine.n_ctx_per_slot,
            "prefix_reuse": engine.load_report.prefix_reuse_note,
        },
    }
