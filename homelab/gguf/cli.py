"""``homelab demo-model``: generate a small GGUF with RANDOM WEIGHTS that llama.cpp runs.

Demo models exist so everything (planning, the engine, the server, the TUI) can be tried
and tested without downloading gigabytes. They are cached; with a PATH the cached file is
copied there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ARCH_CHOICES = ("llama", "qwen3", "gemma3", "moe", "deepseek2", "mamba")
SIZE_CHOICES = ("tiny", "bench")
QUANT_CHOICES = ("F16", "Q8_0", "Q4_0", "Q4_K_M")
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
    parser.add_argument("--force", action="store_true", help="overwrite PATH if it exists")
    parser.add_argument(
        "path",
        nargs="?",
        metavar="PATH",
        help="where to write the .gguf (a file or a folder); default: just print the cache path",
    )


def run(args: argparse.Namespace) -> int:
    from homelab.gguf.demo import demo_model_path
    from homelab.gguf.reader import read_model

    cached = demo_model_path(args.arch, args.size, args.quant)
    path = _copy_to(cached, args.path, args.force) if args.path else cached
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
    print(f"{path}")
    print(
        f"  {args.arch} {args.size} {args.quant}: {info.n_params:,} parameters, "
        f"{info.file_bytes / (1 << 20):.1f} MiB"
    )
    print(WARNING)
    return 0


def _copy_to(cached: Path, destination: str, force: bool) -> Path:
    """Copy the cached model to ``destination`` (a file, or a folder when it ends in /)."""
    import os
    import shutil
    import tempfile

    from homelab.errors import HomelabError

    target = Path(destination).expanduser()
    if target.is_dir() or destination.endswith(("/", os.sep)):
        target = target / cached.name
    if target.exists() and not force:
        raise HomelabError(f"{target} already exists.", hint="Pass --force to overwrite it.")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".partial", delete=False) as tmp:
            partial = Path(tmp.name)
        try:
            shutil.copyfile(cached, partial)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    except OSError as exc:
        raise HomelabError(
            f"cannot write {target}: {exc.strerror or exc}.", hint="Choose a writable location."
        ) from exc
    return target
