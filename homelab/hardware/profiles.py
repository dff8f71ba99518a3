"""GPU profiles from ``profiles/gpus.toml``: what the planner assumes for ``--gpu rtx-4090``.

A profile is looked up by id ("rtx-4090"), by product name ("RTX 4090") or by the name NVML
reports ("NVIDIA GeForce RTX 4090"). Names that cover several cards ("RTX 3080" is sold with
10 and 12 GB) are told apart by ``vram_bytes``.
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from homelab.errors import ConfigError
from homelab.locations import profiles_dir
from homelab.units import GIB

# NVML reports a little less than the marketed capacity (memory the driver reserves).
VRAM_MATCH_TOLERANCE_BYTES = 3 * GIB // 2
_VENDOR_WORDS = re.compile(r"\b(nvidia|geforce|tesla)\b")
_NOT_ALPHANUMERIC = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True)
class GpuProfile:
    id: str
    name: str
    nvml_names: tuple[str, ...]
    vram_bytes: int
    bandwidth_gb_s: float
    compute_capability: str
    fp16_tflops: float  # dense tensor-core FP16, FP16 accumulate (see gpus.toml)
    overhead_bytes: int  # CUDA context + cuBLAS workspace + pool
    source: str
    overhead_note: str | None = None  # how overhead_bytes was measured, when it was


def gpu_profiles_path() -> Path:
    return profiles_dir() / "gpus.toml"


def load_gpu_profiles(path: Path | None = None) -> dict[str, GpuProfile]:
    """Every profile, keyed by id; raises ConfigError naming the file if it is invalid."""
    path = path or gpu_profiles_path()
    try:
        modified_ns = path.stat().st_mtime_ns
    except OSError as error:
        raise ConfigError(f"{path}: cannot read GPU profiles ({error}).") from error
    return dict(_load(path, modified_ns))


@functools.lru_cache(maxsize=8)
def _load(path: Path, modified_ns: int) -> tuple[tuple[str, GpuProfile], ...]:
    """Parsed once per file version (``modified_ns`` is part of the cache key)."""
    try:
        with path.open("rb") as file:
            document = tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{path}: cannot read GPU profiles ({error}).") from error
    return tuple((key, _profile(path, key, table)) for key, table in document.items())


def _profile(path: Path, key: str, table: object) -> GpuProfile:
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [{key}] must be a table describing one GPU.")
    try:
        return GpuProfile(
            id=key,
            name=str(table["name"]),
            nvml_names=tuple(str(name) for name in table.get("nvml_names", ())),
            vram_bytes=_positive_int(table["vram_bytes"]),
            bandwidth_gb_s=_positive_float(table["bandwidth_gb_s"]),
            compute_capability=str(table["compute_capability"]),
            fp16_tflops=_positive_float(table["fp16_tflops"]),
            overhead_bytes=_positive_int(table["overhead_bytes"]),
            source=str(table["source"]),
            overhead_note=table.get("overhead_note"),
        )
    except KeyError as error:
        raise ConfigError(f"{path}: [{key}] lacks the field {error.args[0]!r}.") from error
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{path}: [{key}] has an invalid value: {error}.") from error


def _positive_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{value!r} must be a whole number")
    return int(_positive_number(value))


def _positive_float(value: object) -> float:
    return float(_positive_number(value))


def _positive_number(value: object) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{value!r} is not a number")
    if value <= 0:
        raise ValueError(f"{value!r} must be positive")
    return value


def normalize_gpu_name(name: str) -> str:
    """ "NVIDIA GeForce RTX 4090", "RTX 4090" and "rtx-4090" all become "rtx4090"."""
    return _NOT_ALPHANUMERIC.sub("", _VENDOR_WORDS.sub("", name.lower()))


def find_gpu_profile(
    name_or_id: str, *, vram_bytes: int | None = None, path: Path | None = None
) -> GpuProfile:
    """The profile for an id or a GPU name; ConfigError listing the known ids if none fits."""
    profiles = load_gpu_profiles(path)
    if name_or_id in profiles:
        return profiles[name_or_id]
    candidates = _name_matches(profiles.values(), normalize_gpu_name(name_or_id))
    if vram_bytes is not None:
        candidates = _closest_in_vram(candidates, vram_bytes)
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        raise ConfigError(
            f"'{name_or_id}' matches several GPU profiles: "
            f"{', '.join(profile.id for profile in candidates)}. Pass one of these ids."
        )
    raise ConfigError(_unknown_message(name_or_id, vram_bytes, profiles, path))


def _name_matches(profiles: Iterable[GpuProfile], key: str) -> list[GpuProfile]:
    return [profile for profile in profiles if key in _match_keys(profile)]


def _match_keys(profile: GpuProfile) -> set[str]:
    names = (profile.id, profile.name, *profile.nvml_names)
    return {normalize_gpu_name(name) for name in names}


def _closest_in_vram(candidates: list[GpuProfile], vram_bytes: int) -> list[GpuProfile]:
    near = [
        profile
        for profile in candidates
        if abs(profile.vram_bytes - vram_bytes) <= VRAM_MATCH_TOLERANCE_BYTES
    ]
    return sorted(near, key=lambda profile: abs(profile.vram_bytes - vram_bytes))[:1]


def _unknown_message(
    name_or_id: str, vram_bytes: int | None, profiles: dict[str, GpuProfile], path: Path | None
) -> str:
    with_vram = f" with {vram_bytes / GIB:.1f} GiB" if vram_bytes is not None else ""
    return (
        f"{path or gpu_profiles_path()}: no GPU profile for '{name_or_id}'{with_vram}. "
        f"Known ids: {', '.join(profiles)}."
    )
