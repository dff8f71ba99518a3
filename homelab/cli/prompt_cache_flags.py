"""``--cache-ram-mib``, ``--cache-disk-mib``, ``--no-prompt-cache``: the prompt cache's bounds.

``serve`` keeps a tenant's prompt states beyond their slot (``homelab.engine.state_cache``):
in host RAM up to ``--cache-ram-mib`` (default: a share of the host's plan budget, see
``planner.budget.default_prompt_cache_bytes``), which the planner sets aside before planning
the model, then on disk under the data folder up to ``--cache-disk-mib``. ``plan`` takes the
same flags to show the plan ``serve`` would make (it reserves nothing unless given
``--cache-ram-mib``).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from homelab.units import GIB, MIB

if TYPE_CHECKING:
    from homelab.engine.state_cache.store import PromptCache
    from homelab.planner.budget import Hardware

DISK_CAP_MAX_BYTES = 16 * GIB
DISK_CAP_FREE_SHARE = 0.2  # of the free space under the data folder, at most
WHAT = "the prompt cache"


def add_flags(parser: argparse.ArgumentParser, *, serving: bool = True) -> None:
    group = parser.add_argument_group("prompt cache (states kept beyond their slot)")
    default = "a share of the RAM budget" if serving else "none: what serve would keep"
    group.add_argument(
        "--cache-ram-mib", type=int, metavar="MIB", help=f"host RAM for saved states ({default})"
    )
    group.add_argument(
        "--cache-disk-mib",
        type=int,
        metavar="MIB",
        help="disk for saved states under the data folder (16 GiB or 20%% of the free space)",
    )
    group.add_argument(
        "--no-prompt-cache", action="store_true", help="keep no state beyond its slot"
    )


def ram_bytes(args: argparse.Namespace, hardware: Hardware, *, serving: bool = True) -> int:
    """The RAM to set aside (0: no cache)."""
    from homelab.errors import ConfigError
    from homelab.planner.budget import default_prompt_cache_bytes

    if getattr(args, "no_prompt_cache", False):
        return 0
    given = getattr(args, "cache_ram_mib", None)
    if given is None:
        return default_prompt_cache_bytes(hardware) if serving else 0
    if given < 0:
        raise ConfigError(f"--cache-ram-mib must be 0 or more (got {given}).")
    return int(given) * MIB


def reserve(
    args: argparse.Namespace, hardware: Hardware, *, serving: bool = True
) -> tuple[Hardware, int]:
    """``hardware`` less the prompt cache's RAM, and that RAM in bytes."""
    n_bytes = ram_bytes(args, hardware, serving=serving)
    return reserve_bytes(hardware, n_bytes), n_bytes


def reserve_bytes(hardware: Hardware, n_bytes: int) -> Hardware:
    from homelab.planner.budget import reserve_host

    return reserve_host(hardware, n_bytes, WHAT)


def open_cache(args: argparse.Namespace, ram_budget_bytes: int) -> PromptCache | None:
    """The process's prompt cache (None with ``--no-prompt-cache``)."""
    if getattr(args, "no_prompt_cache", False):
        return None
    from homelab.engine.state_cache.store import CacheConfig, PromptCache

    folder = cache_folder()
    disk_mib = getattr(args, "cache_disk_mib", None)
    disk_bytes = default_disk_bytes(folder) if disk_mib is None else max(0, disk_mib) * MIB
    return PromptCache(CacheConfig(ram_budget_bytes, disk_bytes, folder if disk_bytes else None))


def cache_folder() -> Path:
    from homelab.locations import data_dir

    return data_dir() / "prompt-cache"


def default_disk_bytes(folder: Path) -> int:
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        free = shutil.disk_usage(existing).free
    except OSError:
        return 0
    return min(DISK_CAP_MAX_BYTES, int(free * DISK_CAP_FREE_SHARE))


def describe(cache: PromptCache | None) -> str:
    """One line for serve's start-up message."""
    from homelab.units import format_size

    if cache is None:
        return "Prompt cache: off (--no-prompt-cache)."
    config = cache.config
    disk = (
        f"then up to {format_size(config.disk_cap_bytes)} in {config.directory}"
        if config.directory is not None
        else "no disk tier"
    )
    stats = cache.stats()
    return (
        f"Prompt cache: {format_size(config.ram_budget_bytes)} of RAM set aside, {disk} "
        f"({stats.disk_entries} states there now)."
    )
