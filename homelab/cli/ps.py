"""``homelab ps``: what the running server (the one holding the server lock, or ``--url``)
has loaded — each model's status, memory planned vs allocated, slots busy, idle time and when
its keep-alive unloads it. It asks the server's admin route ``/admin/models``, open to local
clients of a loopback server; other servers need an admin key (``--api-key`` or
``HOMELAB_API_KEY``).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="the server (default: the one running on this machine)")
    parser.add_argument("--api-key", help="an admin key (default: $HOMELAB_API_KEY)")


def run(args: argparse.Namespace) -> int:
    url, key = server_url(args.url), args.api_key or os.environ.get("HOMELAB_API_KEY")
    models = fetch_models(url, key)
    if args.json:
        print(json.dumps(models, indent=2))
    else:
        print(format_models(models))
        yielded = fetch_yield(url, key)
        if yielded.get("state", "serving") != "serving":
            print(yield_line(yielded))
        cache = fetch_prompt_cache(url, key)
        if cache.get("enabled"):
            print(format_prompt_cache(cache))
    return 0


def fetch_prompt_cache(url: str, api_key: str | None = None) -> dict[str, Any]:
    """The server's prompt cache report (``{}`` when it has none or does not say)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{url}/admin/prompt-cache", headers=headers, timeout=10)
    except httpx.HTTPError:
        return {}
    return dict(response.json()) if response.status_code == 200 else {}


def fetch_yield(url: str, api_key: str | None = None) -> dict[str, Any]:
    """The server's yield state (``{}`` from a server without yield/resume)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{url}/admin/yield", headers=headers, timeout=10)
    except httpx.HTTPError:
        return {}
    return dict(response.json()) if response.status_code == 200 else {}


def yield_line(report: dict[str, Any]) -> str:
    """``GPU yielded (asked to); resumes on …``, saying when it serves from the CPU."""
    line = f"GPU {report['state']} ({report['reason']}); resumes {report['resumes']}"
    if report.get("serving_from_cpu"):
        line = f"GPU yielded (serving from CPU): {report['reason']}; resumes {report['resumes']}"
    return line


def format_prompt_cache(report: dict[str, Any]) -> str:
    """One line: the prompt cache's RAM (of its budget), disk (of its cap), hits."""
    from homelab.units import format_size

    return (
        f"prompt cache: RAM {format_size(report['ram_bytes'])} of "
        f"{format_size(report['ram_budget_bytes'])} ({report['ram_entries']} states), disk "
        f"{format_size(report['disk_bytes'])} of {format_size(report['disk_cap_bytes'])} "
        f"({report['disk_entries']}), hits {report['hits_ram']} RAM / {report['hits_disk']} disk"
    )


def server_url(url: str | None) -> str:
    from homelab.errors import ConfigError
    from homelab.lock import running_server

    if url:
        return url.rstrip("/").removesuffix("/v1")
    server = running_server()
    if server is None or not server.url:
        raise ConfigError(
            "no homelab server is running on this machine.",
            hint="Start one with `homelab serve`, or say where it is with --url.",
        )
    return server.url


def fetch_models(url: str, api_key: str | None = None) -> list[dict[str, Any]]:
    """The server's models as ``/admin/models`` describes them (one entry for a server that
    serves a single model)."""
    import httpx

    from homelab.errors import ConfigError

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=10) as client:
            response = client.get("/admin/models")
            if response.status_code == 404:  # `homelab serve MODEL`: one model, always loaded
                listed = client.get("/v1/models").json()["data"]
                return [{"model": m["id"], "status": m.get("status", "loaded")} for m in listed]
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot reach the server at {url} ({exc}).") from None
    if response.status_code in (401, 403):
        raise ConfigError(
            f"the server at {url} wants an admin key.", hint="Pass --api-key or HOMELAB_API_KEY."
        )
    if response.status_code != 200:
        raise ConfigError(f"the server at {url} answered {response.status_code}: {response.text}")
    return list(response.json()["data"])


def format_models(models: list[dict[str, Any]]) -> str:
    from homelab.units import format_size

    def size(value: Any) -> str:
        return format_size(value) if isinstance(value, int) else "-"

    def seconds(value: Any) -> str:
        if value is None:
            return "-"
        value = float(value)
        return f"{value:.0f}s" if value < 120 else f"{value / 60:.0f}m"

    header = ("MODEL", "STATUS", "PLANNED", "ACTUAL", "SLOTS", "IDLE", "UNLOADS IN")
    rows = [header]
    for m in models:
        loaded = m.get("status") == "loaded"
        slots = f"{m.get('slots_busy', 0)}/{m.get('slots_total', 0)}" if loaded else "-"
        expiry = m.get("expires_in_s")
        unloads = seconds(expiry) if expiry is not None else ("never" if loaded else "-")
        if loaded and m.get("requests_in_flight"):
            unloads = "busy"
        idle = seconds(m.get("idle_s")) if loaded else "-"
        name = m["model"] + ("" if m.get("on_disk", True) else " (file deleted)")
        planned, actual = size(m.get("planned_bytes")), size(m.get("actual_bytes"))
        rows.append((name, m.get("status", "?"), planned, actual, slots, idle, unloads))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )
