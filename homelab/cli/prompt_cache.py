"""The prompt cache from the command line: the ``homelab prompt-cache`` verb, and the
``--prompt-cache-*`` flags of ``serve`` and ``plan``.

    homelab prompt-cache                          # every saved state: model, tenant, tokens, size
    homelab prompt-cache size --json              # totals per model and tenant
    homelab prompt-cache clear --tenant alice     # delete alice's states (of every model)
    homelab prompt-cache clear --model m.gguf     # delete one model's states (a GGUF path or id)

The verb reads the data folder (``serve`` writes what it holds in RAM there when it stops); a
running server forgets a state whose file is gone when it next looks for it.

``serve`` keeps a tenant's prompt states beyond their slot (``homelab.engine.prompt_cache``):
in host RAM up to ``--prompt-cache-ram-mib`` (default: a share of the host's plan budget, see
``planner.budget.default_prompt_cache_bytes``), which the planner sets aside before planning
the model, then on disk under the data folder up to ``--prompt-cache-disk-mib``;
``--no-prompt-cache`` keeps nothing. ``plan`` takes the same flags to show the plan ``serve``
would make (it reserves nothing unless given ``--prompt-cache-ram-mib``).
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from homelab.units import GIB, MIB, format_size

if TYPE_CHECKING:
    from homelab.engine.prompt_cache.store import EntryInfo, PromptCache
    from homelab.planner.budget import Hardware

DISK_CAP_MAX_BYTES = 16 * GIB
DISK_CAP_FREE_SHARE = 0.2  # of the free space under the data folder, at most
WHAT = "the prompt cache"


ACTIONS = ("list", "size", "clear")

# --- the verb ------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=ACTIONS, default="list")
    parser.add_argument("--tenant", help="only this tenant's states")
    parser.add_argument("--model", help="only this model's states: a GGUF path or a model id")


def run(args: argparse.Namespace) -> int:
    cache = open_disk_cache()
    model_id = model_filter(args.model)
    entries = [
        entry
        for entry in cache.entries()
        if (args.tenant is None or entry.tenant == args.tenant)
        and (model_id is None or entry.model_id.startswith(model_id))
    ]
    if args.action == "clear":
        removed = sum(cache.clear(tenant=args.tenant, model_id=m) for m in _ids(entries))
        print(json.dumps({"removed": removed}) if args.json else f"removed {removed} states")
        return 0
    if args.action == "size":
        totals = sizes(entries)
        print(json.dumps(totals, indent=2) if args.json else format_sizes(totals))
        return 0
    if args.json:
        print(json.dumps([asdict(entry) for entry in entries], indent=2))
    else:
        print(format_entries(entries))
    return 0


def open_disk_cache() -> PromptCache:
    from homelab.engine.prompt_cache.store import CacheConfig, PromptCache

    return PromptCache(CacheConfig(0, 0, cache_folder()))


def model_filter(text: str | None) -> str | None:
    if text is None:
        return None
    path = Path(text).expanduser()
    if path.is_file():
        from homelab.gguf.identity import model_identity

        return model_identity(path)
    return text


def _ids(entries: list[EntryInfo]) -> set[str]:
    return {entry.model_id for entry in entries}


def sizes(entries: list[EntryInfo]) -> dict[str, object]:
    per: dict[str, dict[str, int]] = {}
    for entry in entries:
        key = f"{entry.model_id[:12]} {entry.tenant}"
        total = per.setdefault(key, {"states": 0, "bytes": 0, "tokens": 0})
        total["states"] += 1
        total["bytes"] += entry.n_bytes
        total["tokens"] += entry.n_tokens
    return {"total_bytes": sum(e.n_bytes for e in entries), "by_model_and_tenant": per}


def format_sizes(totals: dict[str, object]) -> str:
    per = totals["by_model_and_tenant"]
    assert isinstance(per, dict)
    lines = [f"{key}: {v['states']} states, {format_size(v['bytes'])}" for key, v in per.items()]
    total = totals["total_bytes"]
    assert isinstance(total, int)
    return "\n".join([*lines, f"total: {format_size(total)}"])


def format_entries(entries: list[EntryInfo]) -> str:
    if not entries:
        return "no saved prompt states"
    header = f"{'model':<12}  {'tenant':<16}  {'tokens':>7}  {'size':>10}  layout"
    rows = [
        f"{e.model_id[:12]:<12}  {e.tenant[:16]:<16}  {e.n_tokens:>7}  "
        f"{format_size(e.n_bytes):>10}  {e.layout}"
        for e in entries
    ]
    return "\n".join([header, *rows])


# --- serve's and plan's flags ---------------------------------------------------------------


def add_flags(parser: argparse.ArgumentParser, *, serving: bool = True) -> None:
    group = parser.add_argument_group("prompt cache (states kept beyond their slot)")
    default = "a share of the RAM budget" if serving else "none: what serve would keep"
    group.add_argument(
        "--prompt-cache-ram-mib",
        type=int,
        metavar="MIB",
        help=f"host RAM for saved states ({default})",
    )
    group.add_argument(
        "--prompt-cache-disk-mib",
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
    given = getattr(args, "prompt_cache_ram_mib", None)
    if given is None:
        return default_prompt_cache_bytes(hardware) if serving else 0
    if given < 0:
        raise ConfigError(f"--prompt-cache-ram-mib must be 0 or more (got {given}).")
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
    from homelab.engine.prompt_cache.store import CacheConfig, PromptCache

    folder = cache_folder()
    disk_mib = getattr(args, "prompt_cache_disk_mib", None)
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
