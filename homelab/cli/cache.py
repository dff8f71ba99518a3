"""``homelab cache [list|size|clear]``: the prompt states ``serve`` keeps on disk.

    homelab cache                          # every saved state: model, tenant, tokens, size
    homelab cache size --json              # totals per model and tenant
    homelab cache clear --tenant alice     # delete alice's states (of every model)
    homelab cache clear --model m.gguf     # delete one model's states (a GGUF path or an id)

It reads the data folder (``serve`` writes what it holds in RAM there when it stops); a
running server forgets a state whose file is gone when it next looks for it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from homelab.units import format_size

if TYPE_CHECKING:
    from homelab.engine.state_cache.store import EntryInfo, PromptCache

ACTIONS = ("list", "size", "clear")


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
    from homelab.cli.prompt_cache_flags import cache_folder
    from homelab.engine.state_cache.store import CacheConfig, PromptCache

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
