"""The one command-line entry point: ``homelab [VERB] ...``.

Each verb lives in its own package's ``cli`` module, which provides
``configure(parser: argparse.ArgumentParser) -> None`` and ``run(args) -> int``.
Modules are imported lazily so ``homelab hw`` never pays for FastAPI or Textual.
Every verb accepts ``--json``; errors go to stderr with a non-zero exit code.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence

from homelab.errors import HomelabError

# verb -> (module, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "tui": ("homelab.tui.cli", "open the dashboard (the default when no verb is given)"),
    "hw": ("homelab.hardware.cli", "report GPUs, CPU, RAM and the llama.cpp build"),
    "demo-model": ("homelab.gguf.cli", "generate a small GGUF model with random weights"),
    "inspect": ("homelab.gguf.inspect_cli", "show a GGUF file's metadata"),
    "plan": ("homelab.planner.cli", "choose quant, KV types, context, slots and offload"),
    "run": ("homelab.engine.cli", "run a model and stream the answer with tok/s"),
    "serve": ("homelab.server.cli", "serve an OpenAI-compatible endpoint"),
    "bench": ("homelab.bench.cli", "measure tok/s per setting and concurrency x KV type"),
    "quality": ("homelab.bench.quality_cli", "measure the quality cost of the plan (KLD, ppl)"),
    "search": ("homelab.hub.search_cli", "find GGUF repos and files on the Hugging Face hub"),
    "pull": ("homelab.hub.pull_cli", "download a GGUF (verified, resumable)"),
    "models": ("homelab.hub.models_cli", "list local GGUF models and how they fit"),
    "quantize": ("homelab.hub.quantize_cli", "quantize a model locally with llama.cpp"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="homelab",
        description="Run large language models that shouldn't fit on one consumer GPU. "
        "Without a verb, opens the dashboard.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb, (module_name, help_text) in VERBS.items():
        verb_parser = sub.add_parser(verb, help=help_text, description=help_text)
        verb_parser.add_argument("--json", action="store_true", help="machine-readable output")
        verb_parser.set_defaults(_module=module_name)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            verb_parser.set_defaults(_missing=True)
            continue
        module.configure(verb_parser)
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
    parser = build_parser()
    args = parser.parse_args(args_list)
    if args.version:
        from homelab import __version__

        print(__version__)
        return 0
    if getattr(args, "_missing", False):
        print(f"homelab: '{args.verb}' is not available in this build yet.", file=sys.stderr)
        return 2
    module = importlib.import_module(args._module)
    try:
        return int(module.run(args))
    except HomelabError as error:
        report_error(error, getattr(args, "json", False))
        return 1
    except KeyboardInterrupt:
        print("homelab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `homelab hw --json | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
