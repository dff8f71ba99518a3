"""The demo models by name: generated on first use, quantized, cached; or shipped (trained).

Random-weight models are written in F16 by :mod:`homelab.gguf.generator`, then quantized with
llama.cpp's own quantizer for the other variants, into a cache directory (never committed).

Names: ``demo`` alone (or ``demo:Q4_K_M``) is the shipped model trained on Python's
documentation, the one that writes words. A random-weight model is named by its ARCH or SIZE:
``demo:ARCH[:SIZE][:QUANT]`` or ``demo:SIZE[:QUANT]`` (the llama), with ARCH one of
:data:`~homelab.gguf.generator.ARCHS` (causal models that chat) or of :data:`EXTRAS`, the
special-purpose models built by :mod:`homelab.gguf.demo_extra`:

- ``demo:bert`` — an embedding model (arch ``bert``, WordPiece vocabulary, mean pooling);
- ``demo:reasoning`` — a qwen3 model whose chat template opens ``<think>`` (Qwen3-style
  ``enable_thinking`` switch) and whose vocabulary has ``<think>``/``</think>`` as tokens;
- ``demo:spec`` / ``demo:spec-draft`` — a speculative-decoding target (12 layers) and its
  draft (the target's first 2 layers, same vocabulary and head), which agree on most greedy
  tokens. They default to the bench width; ``demo:spec:tiny`` is the fast pair for tests;
- ``demo:vision-gemma3`` / ``demo:vision-qwen2vl`` — a text model with its vision projector
  (``mmproj-*.gguf``) beside it, in a folder of their own (see :mod:`demo_vision`; F16 only).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from homelab.errors import HomelabError
from homelab.gguf import demo_extra, demo_vision
from homelab.gguf.generator import ARCHS, GENERATOR_VERSION, SIZES, spec_for, write_f16_model
from homelab.locations import demo_models_dir

QUANTS = ("F16", "Q8_0", "Q4_0", "Q4_K_M")
# Special-purpose models, named like an ARCH (demo:bert, demo:spec:tiny); see demo_extra.
EXTRAS = ("bert", "reasoning", "spec", "spec-draft")
# A text model and its vision projector (demo:vision-gemma3); see demo_vision.
VISION = tuple(f"vision-{kind}" for kind in demo_vision.VISION_KINDS)
TRAINED = "trained"  # demo[:F16|:Q4_K_M] (or demo:trained…) — shipped weights, tools/train_demo.py
TRAINED_QUANTS = ("F16", "Q4_K_M")
TRAINED_DIR = Path(__file__).parent / "trained"
TRAINED_STEM = "homelab-trained-llama"
EXTRA_DEFAULT_SIZES = {"spec": "bench", "spec-draft": "bench"}  # sized to measure speed-ups


def demo_model_path(
    arch: str = "llama", size: str = "tiny", quant: str = "F16", directory: Path | None = None
) -> Path:
    """Path of the demo model, generating (and quantizing) it on first use.

    ``arch`` is one of :data:`ARCHS` or of the special-purpose :data:`EXTRAS`.
    """
    quant = _checked_quant(quant)
    if arch == TRAINED:
        return trained_model_path(quant)
    if arch in VISION:
        return _vision_model_path(arch, quant, directory)
    folder = directory or demo_models_dir()
    if arch in EXTRAS:
        stem, write = demo_extra.recipe(arch, size)
    else:
        spec_for(arch, size)  # validates arch and size
        stem = f"homelab-demo-{arch}-{size}-v{GENERATOR_VERSION}"

        def write(path: Path) -> Path:
            return write_f16_model(path, arch, size)

    return _cached(folder, stem, quant, write)


def _vision_model_path(name: str, quant: str, directory: Path | None) -> Path:
    if quant != "F16":
        raise HomelabError(
            f"the demo vision model {name} comes in F16 only", hint=f"Use demo:{name}."
        )
    return demo_vision.text_model_path(name.removeprefix("vision-"), directory)


def trained_model_path(quant: str = "F16") -> Path:
    """The shipped model trained on Python's documentation (F16 or Q4_K_M)."""
    path = TRAINED_DIR / f"{TRAINED_STEM}-{quant.upper()}.gguf"
    if not path.is_file():
        raise HomelabError(
            f"the trained demo model has no {quant} file",
            hint="Use demo or demo:Q4_K_M; re-create with tools/train_demo.py.",
        )
    return path


def held_out_text(path: Path) -> Path | None:
    """The text a model of the shipped trained demo was not trained on (``homelab quality``
    reads it for that model); None for any other file."""
    held_out = TRAINED_DIR / "heldout.txt"
    return held_out if path.parent == TRAINED_DIR and held_out.is_file() else None


def _checked_quant(quant: str) -> str:
    if quant.upper() not in QUANTS:
        raise HomelabError(
            f"unknown demo quant {quant!r}", hint=f"Choose one of {', '.join(QUANTS)}."
        )
    return quant.upper()


def _cached(folder: Path, stem: str, quant: str, write_f16: Callable[[Path], Path]) -> Path:
    f16_path = folder / f"{stem}-F16.gguf"
    if not f16_path.exists():
        write_f16(f16_path)
    if quant == "F16":
        return f16_path
    target = folder / f"{stem}-{quant}.gguf"
    if not target.exists():
        from homelab.gguf.quantize import quantize_file

        quantize_file(f16_path, target, quant)
    return target


def is_demo_ref(spec: str) -> bool:
    """True for ``demo`` and ``demo:...`` — the names of the demo models."""
    return spec.lower() == "demo" or spec.lower().startswith("demo:")


def parse_demo_ref(spec: str) -> tuple[str, str, str]:
    """(arch, size, quant) of a ``demo[:ARCH][:SIZE][:QUANT]`` name, checked; nothing is
    generated.

    ``demo`` (and ``demo:Q4_K_M``, ``demo:trained``) is the shipped trained model, the one
    that writes words; a random-weight model is named by its ARCH or SIZE: ``demo:llama``
    (the tiny llama), ``demo:bench``, ``demo:bench:Q8_0``, ``demo:moe``,
    ``demo:gemma3:tiny:Q4_0``. ARCH may also be one of :data:`EXTRAS`
    (``demo:bert``, ``demo:reasoning``, ``demo:spec``, ``demo:spec-draft:tiny``...).
    """
    parts = [p for p in spec.split(":")[1:] if p]
    if parts and parts[0].lower() == TRAINED:
        parts.pop(0)
    elif parts and parts[0].upper() not in QUANTS:
        return _parse_random_ref(spec, parts)
    if len(parts) > 1:
        raise HomelabError(
            f"cannot read the demo model name {spec!r}",
            hint="The trained demo is demo or demo:QUANT (demo:Q4_K_M); name a random-weight "
            "one by its ARCH or SIZE: demo:llama:bench:Q8_0.",
        )
    return TRAINED, "tiny", _trained_quant(parts[0] if parts else "F16")


def _trained_quant(quant: str) -> str:
    if quant.upper() not in TRAINED_QUANTS:
        raise HomelabError(
            f"the trained demo model comes in {' and '.join(TRAINED_QUANTS)}, not {quant}",
            hint=f"Use demo or demo:Q4_K_M; for a random-weight {quant} model name it by its "
            f"ARCH: demo:llama:{quant.upper()}.",
        )
    return quant.upper()


def _parse_random_ref(spec: str, parts: list[str]) -> tuple[str, str, str]:
    named = ARCHS + EXTRAS + VISION
    arch = parts.pop(0).lower() if parts and parts[0].lower() in named else "llama"
    default_size = EXTRA_DEFAULT_SIZES.get(arch, "tiny")
    size = parts.pop(0).lower() if parts and parts[0].lower() in SIZES else default_size
    quant = parts.pop(0).upper() if parts else "F16"
    if parts or quant not in QUANTS:
        raise HomelabError(
            f"cannot read the demo model name {spec!r}",
            hint="Use demo[:ARCH][:SIZE][:QUANT], e.g. demo:llama:bench:Q8_0 "
            f"(ARCH: {', '.join(named)}; SIZE: {' or '.join(SIZES)}; "
            f"QUANT: {', '.join(QUANTS)}).",
        )
    if arch not in EXTRAS + VISION:
        spec_for(arch, size)  # validates arch and size
    return arch, size, quant


def demo_ref_path(spec: str) -> Path:
    """The model a ``demo[:ARCH][:SIZE][:QUANT]`` name stands for (the shipped trained one, or
    a random-weight one generated on first use)."""
    return demo_model_path(*parse_demo_ref(spec))
