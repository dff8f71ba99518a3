"""The one command-line entry point: ``homelab [VERB] ...``.

Every verb is a module of this package with the same shape:

* ``configure(parser)`` declares its arguments (the shared groups live in :mod:`.flags`);
* ``run(args) -> int`` parses them into the domain's objects, calls one domain function that
  returns data, and renders it — as text through the domain's render module, or as ``--json``.

Only the verb being run is imported and configured, so ``homelab hw`` never pays for the
planner, FastAPI or Textual. Every verb accepts ``--json``; a :class:`HomelabError` is printed
to stderr (as JSON with ``--json``) with exit code 1.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence

from homelab.errors import HomelabError

# verb -> (module in this package, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "tui": ("tui", "open the dashboard (the default when no verb is given)"),
    "hw": ("hw", "report GPUs, CPU, RAM and the llama.cpp build"),
    "demo-model": ("demo_model", "generate a small GGUF model with random weights"),
    "inspect": ("inspect", "show a GGUF file's metadata"),
    "template": ("template", "show what the server makes of a chat template (tools, reasoning)"),
    "plan": ("plan", "choose quant, KV types, context, slots and offload"),
    "run": ("run", "run a model and stream the answer with tok/s"),
    "serve": ("serve", "serve an OpenAI-compatible endpoint"),
    "worker": ("worker", "offer this machine's devices to another homelab (llama.cpp RPC)"),
    "ps": ("ps", "show the models a running server has loaded"),
    "prompt-cache": ("prompt_cache", "list, size or clear the prompt states serve keeps on disk"),
    "launch": ("launch", "set up Claude Code, Codex, OpenCode or Open WebUI for homelab; start it"),
    "yield": ("yield_resume", "make the running server give its GPU back (states kept)"),
    "resume": ("yield_resume", "make the running server take its GPU back"),
    "bench": ("bench", "measure tok/s per setting and concurrency x KV type"),
    "quality": ("quality", "measure the quality cost of the plan (KLD, ppl)"),
    "search": ("search", "find GGUF repos and files on the Hugging Face hub"),
    "pull": ("pull", "download a GGUF (verified, resumable)"),
    "models": ("models", "list local GGUF models and how they fit"),
    "quantize": ("quantize", "quantize a model locally with llama.cpp"),
}
PASSTHROUGH_VERBS = frozenset({"launch"})  # `homelab launch claude -- ARGS`: ARGS to the client


def verb_module(verb: str) -> object:
    return importlib.import_module(f"{__name__}.{VERBS[verb][0]}")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every verb (``only``: configure just that verb's arguments)."""
    parser = argparse.ArgumentParser(
        prog="homelab",
        description="Run large language models that shouldn't fit on one consumer GPU. "
        "Without a verb, opens the dashboard.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb, (_, help_text) in VERBS.items():
        verb_parser = sub.add_parser(verb, help=help_text, description=help_text)
        verb_parser.add_argument("--json", action="store_true", help="machine-readable output")
        if only is None or only == verb:
            verb_module(verb).configure(verb_parser)  # type: ignore[attr-defined]
    return parser


def report_error(error: HomelabError, as_json: bool) -> None:
    if as_json:
        payload = {"error": {"type": type(error).__name__, "message": str(error)}}
        print(json.dumps(payload), file=sys.stderr)
    else:
        print(f"homelab: {error.title}: {error}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or (
        args_list[0].startswith("-") and args_list[0] not in ("-h", "--help", "--version")
    ):
        args_list = ["tui", *args_list]
    verb = args_list[0] if args_list[0] in VERBS else None
    passthrough: list[str] = []
    if verb in PASSTHROUGH_VERBS and "--" in args_list:  # the rest goes to the started program
        cut = args_list.index("--")
        args_list, passthrough = args_list[:cut], args_list[cut + 1 :]
    args = build_parser(only=verb or "").parse_args(args_list)
    args.passthrough = passthrough
    if args.version:
        from homelab import __version__

        print(__version__)
        return 0
    try:
        return int(verb_module(args.verb).run(args))  # type: ignore[attr-defined]
    except HomelabError as error:
        report_error(error, getattr(args, "json", False))
        return 1
    except KeyboardInterrupt:
        print("homelab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `homelab hw --json | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
