"""The prompt cache from the command line: the ``homelab prompt-cache`` verb, and the
``--prompt-cache-*`` flags of ``serve`` and ``plan``.

    homelab prompt-cache                          # every saved state: model, tenant, tokens, size
    homelab prompt-cache size --json              # totals per model and tenant
    homelab prompt-cache clear --tenant alice     # delete alice's states (of every model)
    homelab prompt-cache clear --model m.gguf     # delete one model's states (a GGUF path or id)

With a server running (the one holding the server lock, or ``--url``), the verb asks it: the
server owns the folder then, and its RAM holds states the folder does not. ``list`` and
``size`` read ``GET /admin/prompt-cache``; ``clear`` sends ``DELETE /admin/prompt-cache``,
which also empties the slots holding the tenant's cells, so that the server never writes the
states back (not when the slot is next taken, not when it stops). Like ``homelab ps``, it
needs an admin key unless the server listens on loopback only (``--api-key`` or
``HOMELAB_API_KEY``). Without a server it reads the data folder and deletes nothing but what
``clear`` names: never a temporary file (a write in progress), never a file it cannot read.

``serve`` keeps a tenant's prompt states beyond their slot (``homelab.engine.prompt_cache``):
in host RAM up to ``--prompt-cache-ram-mib`` (default: a share of the host's plan budget, see
``planner.budget.default_prompt_cache_bytes``), which the planner sets aside before planning
the model, then on disk under the data folder up to ``--prompt-cache-disk-mib``. Each tenant
has ``--prompt-cache-tenant-share`` of both (0.25): beyond it, its own least recently used
states go first when room is needed. A state unused for ``--prompt-cache-ttl`` (7d) is deleted.
``--no-prompt-cache`` keeps nothing. ``plan`` takes the same flags to show the plan ``serve``
would make (it reserves nothing unless given ``--prompt-cache-ram-mib``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from homelab.units import GIB, MIB, format_size

if TYPE_CHECKING:
    from homelab.engine.prompt_cache.store import EntryInfo, PromptCache
    from homelab.planner.budget import Hardware

DISK_CAP_MAX_BYTES = 16 * GIB
DISK_CAP_FREE_SHARE = 0.2  # of the free space under the data folder, at most
WHAT = "the prompt cache"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


ACTIONS = ("list", "size", "clear")

# --- the verb ------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=ACTIONS, default="list")
    parser.add_argument("--tenant", help="only this tenant's states (every generation of it)")
    parser.add_argument("--model", help="only this model's states: a GGUF path or a model id")
    parser.add_argument(
        "--url", help="the server (default: the one running here; none: the data folder)"
    )
    parser.add_argument("--api-key", help="an admin key (default: $HOMELAB_API_KEY)")


def run(args: argparse.Namespace) -> int:
    model_id = model_filter(args.model)
    server = _serving(args)
    if args.action == "clear":
        removed = _clear(server, args.tenant, model_id)
        print(json.dumps({"removed": removed}) if args.json else f"removed {removed} states")
        return 0
    entries = [e for e in _entries(server) if _wanted(e, args.tenant, model_id)]
    if args.action == "size":
        totals = sizes(entries)
        print(json.dumps(totals, indent=2) if args.json else format_sizes(totals))
        return 0
    if args.json:
        print(json.dumps([asdict(entry) for entry in entries], indent=2))
    else:
        print(format_entries(entries))
    return 0


class _Server:
    """A running server with a prompt cache, and the admin key to ask it with."""

    def __init__(self, url: str, api_key: str | None) -> None:
        self.url, self.api_key = url, api_key

    def request(self, method: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        import httpx

        from homelab.errors import ConfigError

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            response = httpx.request(
                method, f"{self.url}/admin/prompt-cache", params=params, headers=headers, timeout=60
            )
        except httpx.HTTPError as exc:
            raise ConfigError(f"cannot reach the server at {self.url} ({exc}).") from None
        if response.status_code in (401, 403):
            raise ConfigError(
                f"the server at {self.url} wants an admin key.",
                hint="Pass --api-key or HOMELAB_API_KEY.",
            )
        if response.status_code != 200:
            raise ConfigError(
                f"the server at {self.url} answered {response.status_code}: {response.text}"
            )
        return dict(response.json())


def _serving(args: argparse.Namespace) -> _Server | None:
    """The server to ask (None: no server, or one without a prompt cache: the folder is
    nobody's but ours)."""
    from homelab.cli.ps import server_url
    from homelab.lock import running_server

    url = args.url
    if not url:
        running = running_server()
        url = running.url if running is not None else ""
    if not url:
        return None
    server = _Server(server_url(url), args.api_key or os.environ.get("HOMELAB_API_KEY"))
    return server if server.request("GET").get("enabled") else None


def _entries(server: _Server | None) -> list[EntryInfo]:
    from homelab.engine.prompt_cache.store import EntryInfo, folder_entries

    if server is None:
        return folder_entries(cache_folder())
    names = [field.name for field in fields(EntryInfo)]
    return [EntryInfo(**{n: e[n] for n in names}) for e in server.request("GET")["entries"]]


def _clear(server: _Server | None, tenant: str | None, model_id: str | None) -> int:
    from homelab.engine.prompt_cache.store import delete_folder_states

    if server is None:
        return delete_folder_states(cache_folder(), tenant, model_id)
    params = {k: v for k, v in (("tenant", tenant), ("model", model_id)) if v is not None}
    return int(server.request("DELETE", params)["removed"])


def _wanted(entry: EntryInfo, tenant: str | None, model_id: str | None) -> bool:
    from homelab.engine.prompt_cache.key import tenant_matches

    return tenant_matches(entry.identity, tenant) and entry.model_id.startswith(model_id or "")


def model_filter(text: str | None) -> str | None:
    if text is None:
        return None
    path = Path(text).expanduser()
    if path.is_file():
        from homelab.gguf.identity import model_identity

        return model_identity(path)
    return text


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
        "--prompt-cache-tenant-share",
        type=float,
        metavar="FRACTION",
        help="each tenant's share of the RAM and the disk: beyond it, its own states go first "
        "when room is needed (0.25)",
    )
    group.add_argument(
        "--prompt-cache-ttl",
        metavar="DURATION",
        default="7d",
        help="delete a saved state unused this long (7d; s, m, h or d)",
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
    from homelab.engine.prompt_cache.store import DEFAULT_TENANT_SHARE, CacheConfig, PromptCache

    folder = cache_folder()
    disk_mib = getattr(args, "prompt_cache_disk_mib", None)
    disk_bytes = default_disk_bytes(folder) if disk_mib is None else max(0, disk_mib) * MIB
    share = getattr(args, "prompt_cache_tenant_share", None)
    config = CacheConfig(
        ram_budget_bytes,
        disk_bytes,
        folder if disk_bytes else None,
        tenant_share=DEFAULT_TENANT_SHARE if share is None else tenant_share(share),
        ttl_s=duration_s(getattr(args, "prompt_cache_ttl", "7d"), "--prompt-cache-ttl"),
    )
    return PromptCache(config)


def tenant_share(value: float, flag: str = "--prompt-cache-tenant-share") -> float:
    """A tenant's share, checked: above 0, at most 1."""
    from homelab.errors import ConfigError

    if not 0 < value <= 1:
        raise ConfigError(
            f"{flag} must be above 0 and at most 1 (got {value}).",
            hint="Give a fraction of the whole, such as 0.25 (a quarter).",
        )
    return value


def duration_s(text: str, flag: str) -> float:
    """``7d``, ``12h``, ``30m``, ``90s`` or a number of seconds, as seconds (above 0)."""
    from homelab.errors import ConfigError

    match = _DURATION.match(str(text))
    seconds = float(match[1]) * _UNIT_S[match[2]] if match else 0.0
    if seconds <= 0:
        raise ConfigError(
            f"{flag} {text!r} is not a duration above 0.", hint="Write it like 7d, 12h or 30m."
        )
    return seconds


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
        f"({stats.disk_entries} states there now); {config.tenant_share:.0%} of each per "
        f"tenant before its own states go first, states unused for "
        f"{config.ttl_s / 86400:.3g} days deleted."
    )
