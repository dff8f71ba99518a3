"""``homelab yield [--wait]`` and ``homelab resume``: the running server (the one holding the
server lock, or ``--url``) gives its GPU back — every conversation's state kept in its prompt
cache — or takes it again, re-planned for the VRAM free now. Like ``homelab ps``, they talk
to the server's admin routes (``/admin/yield``, ``/admin/resume``): open to local clients of
a loopback server, other servers want an admin key (``--api-key`` or ``HOMELAB_API_KEY``).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from homelab.cli.ps import server_url

TIMEOUT_S = 600.0  # a --wait yield drains the grace period; a resume loads every model


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="the server (default: the one running on this machine)")
    parser.add_argument("--api-key", help="an admin key (default: $HOMELAB_API_KEY)")
    if "yield" in parser.prog.split():
        parser.add_argument(
            "--wait", action="store_true", help="return once the memory is freed (not at once)"
        )


def run(args: argparse.Namespace) -> int:
    url, key = server_url(args.url), args.api_key or os.environ.get("HOMELAB_API_KEY")
    if args.verb == "yield":
        report = post(url, "/admin/yield", {"wait": bool(args.wait)}, key)
    else:
        report = post(url, "/admin/resume", None, key)
    print(json.dumps(report, indent=2) if args.json else format_status(report))
    return 0 if report.get("state") != "yielded" or args.verb == "yield" else 1


def post(url: str, path: str, body: dict[str, Any] | None, api_key: str | None) -> dict[str, Any]:
    import httpx

    from homelab.errors import ConfigError

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.post(f"{url}{path}", json=body, headers=headers, timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot reach the server at {url} ({exc}).") from None
    if response.status_code in (401, 403):
        raise ConfigError(
            f"the server at {url} wants an admin key.", hint="Pass --api-key or HOMELAB_API_KEY."
        )
    if response.status_code == 404:
        raise ConfigError(
            f"the server at {url} cannot yield its GPU (an older homelab?).",
            hint="Restart it with this version of homelab serve.",
        )
    if response.status_code != 200:
        raise ConfigError(f"the server at {url} answered {response.status_code}: {response.text}")
    return dict(response.json())


def format_status(report: dict[str, Any]) -> str:
    """A few lines: the state, why, and the last yield's figures."""
    from homelab.units import format_size

    state, last = report.get("state", "?"), report.get("last") or {}
    lines = [f"state: {state}" + (f" ({report['reason']})" if report.get("reason") else "")]
    if state != "serving" and report.get("resumes"):
        lines.append(f"resumes {report['resumes']}")
    if last.get("models") and state in ("yielded", "serving"):
        vram = last.get("vram_freed_bytes")
        lines.append(
            f"last yield ({last['cause']}): {', '.join(last['models'])} unloaded in "
            f"{last['yield_s']:.2f} s; planned {format_size(last['planned_bytes'])} freed, VRAM "
            f"{'n/a' if vram is None else format_size(vram)} (NVML), RSS "
            f"{format_size(last['rss_freed_bytes'])}; {last['saved_states']} slot states saved"
        )
    lines += _cpu_lines(report, last)
    if state == "serving" and last.get("resume_s") is not None:
        lines.append(f"resumed in {last['resume_s']:.2f} s after {last['yielded_s']:.1f} s")
        lines += [f"  {r['model']}: {_plan_line(r)}" for r in last.get("resumed", ())]
    if last.get("resume_error") and state == "yielded":
        lines.append(f"resume failed: {last['resume_error']}")
    return "\n".join(lines)


def _cpu_lines(report: dict[str, Any], last: dict[str, Any]) -> list[str]:
    """``--yield-to-cpu``: what serves meanwhile, or why nothing does."""
    if report.get("serving_from_cpu"):
        return ["serving from the CPU meanwhile:"] + [
            f"  {r['model']}: {_plan_line(r)}" for r in last.get("cpu_plans", ())
        ]
    if report.get("state") == "yielded" and last.get("cpu_error"):
        return [f"cannot serve from the CPU meanwhile: {last['cpu_error']}"]
    return []


def _plan_line(resumed: dict[str, Any]) -> str:
    return (
        f"{resumed['n_gpu_layers']} GPU layers, {resumed['n_ctx_per_slot']} tokens x "
        f"{resumed['n_parallel']} slots, K/V {resumed['type_k']}/{resumed['type_v']}"
    )
