"""``homelab demo-model``: generate a small GGUF with RANDOM WEIGHTS that llama.cpp runs.

Demo models exist so everything (planning, the engine, the server, the TUI) can be tried
and tested without downloading gigabytes. They are cached; with a PATH the cached file is
copied there. Every verb also takes them as MODEL: ``demo:ARCH[:SIZE][:QUANT]`` (``demo``
alone is the shipped trained model, not one of these).
"""

from __future__ import annotations

import argparse
import json
import sys

# the generator's own lists (homelab.gguf.demo imports numpy: too heavy for the parser)
ARCH_CHOICES = ("llama", "qwen3", "gemma3", "moe", "deepseek2", "mamba")
SIZE_CHOICES = ("tiny", "bench")
QUANT_CHOICES = ("F16", "Q8_0", "Q4_0", "Q4_K_M")
VISION_CHOICES = ("gemma3", "qwen2vl")  # homelab.gguf.demo_vision.VISION_KINDS
WARNING = (
    "WARNING: this is a demo model with RANDOM WEIGHTS. It loads and generates, "
    "but its output is meaningless."
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", choices=ARCH_CHOICES, default="llama", help="architecture")
    parser.add_argument(
        "--size",
        choices=SIZE_CHOICES,
        default="tiny",
        help="tiny (~5 MB, for tests) or bench (~250 MB, for speed measurements)",
    )
    parser.add_argument(
        "--quant", choices=QUANT_CHOICES, default="F16", type=str.upper, help="weight type"
    )
    parser.add_argument(
        "--vision",
        choices=VISION_CHOICES,
        help="a text model with its vision projector (mmproj): gemma3 (a fixed number of "
        "tokens per image) or qwen2vl (tokens by image size, M-RoPE); --arch is ignored",
    )
    parser.add_argument("--force", action="store_true", help="overwrite PATH if it exists")
    parser.add_argument(
        "path",
        nargs="?",
        metavar="PATH",
        help="where to write the .gguf (a file or a folder); default: just print the cache path",
    )


def run(args: argparse.Namespace) -> int:
    from homelab.gguf.demo import demo_model_path
    from homelab.gguf.export import copy_model
    from homelab.gguf.reader import read_model

    if args.vision:
        return _vision(args)
    cached = demo_model_path(args.arch, args.size, args.quant)
    path = copy_model(cached, args.path, force=args.force) if args.path else cached
    info = read_model(path)
    if args.json:
        print(WARNING, file=sys.stderr)
        document = {
            "path": str(path),
            "arch": args.arch,
            "size": args.size,
            "quant": args.quant,
            "bytes": info.file_bytes,
            "n_params": info.n_params,
            "random_weights": True,
        }
        print(json.dumps(document))
        return 0
    from homelab.units import format_mib

    print(f"{path}")
    print(
        f"  {args.arch} {args.size} {args.quant}: {info.n_params:,} parameters, "
        f"{format_mib(info.file_bytes)}"
    )
    print(WARNING)
    return 0


def _vision(args: argparse.Namespace) -> int:
    """The vision pair: the text model and its projector (copied together with PATH)."""
    from homelab.gguf import demo_vision
    from homelab.gguf.export import copy_model

    paths = [demo_vision.text_model_path(args.vision), demo_vision.mmproj_path(args.vision)]
    if args.path:
        folder = args.path if args.path.endswith("/") else f"{args.path}/"  # both in it
        paths = [copy_model(path, folder, force=args.force) for path in paths]
    tokens = demo_vision.fixed_image_tokens(args.vision)
    if args.json:
        print(WARNING, file=sys.stderr)
        document = {
            "path": str(paths[0]),
            "mmproj_path": str(paths[1]),
            "vision": args.vision,
            "image_tokens": tokens,  # None: it depends on the image's size
            "random_weights": True,
        }
        print(json.dumps(document))
        return 0
    print(f"{paths[0]}\n{paths[1]}")
    rule = f"{tokens} tokens per image" if tokens else "tokens by image size (M-RoPE)"
    print(f"  demo vision model {args.vision}: text model + projector, {rule}")
    print(WARNING)
    return 0
