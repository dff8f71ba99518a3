"""What ``homelab models`` does and prints."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from homelab.hub.fit import Fit, fits_on_this_machine
from homelab.hub.library import LocalModel, library_dirs, list_local_models
from homelab.hub.render import human_bytes, table
from homelab.hub.settings import hf_cache_dir


def run_models(extra_dirs: list[Path], *, with_fit: bool, as_json: bool) -> int:
    models = list_local_models(extra_dirs)
    fits: list[Fit | None] = (
        fits_on_this_machine([m.info for m in models]) if with_fit else [None] * len(models)
    )
    if as_json:
        document = {
            "folders": [str(d) for d in library_dirs(extra_dirs)],
            "hf_cache": str(hf_cache_dir()),
            "models": [_document(m, f) for m, f in zip(models, fits, strict=True)],
        }
        print(json.dumps(document, indent=2))
        return 0
    _print(models, fits, extra_dirs)
    return 0


def _document(model: LocalModel, fit: Fit | None) -> dict[str, Any]:
    info = model.info
    return {
        "path": str(model.path),
        "ref": model.ref,
        "origin": model.origin,
        "repo": model.repo_id,
        "quant": model.quant,
        "size_bytes": model.size_bytes,
        "problem": model.problem,
        "architecture": info.architecture if info else None,
        "params": info.n_params if info else None,
        "context_length": info.context_length if info else None,
        "n_files": info.n_files if info else None,
        "provenance": asdict(model.provenance) if model.provenance else None,
        "fit": asdict(fit) if fit else None,
    }


def _print(models: list[LocalModel], fits: list[Fit | None], extra_dirs: list[Path]) -> None:
    if not models:
        folders = ", ".join(str(d) for d in library_dirs(extra_dirs))
        print(f"No GGUF models found in {folders} or {hf_cache_dir()}.")
        print("Download one: homelab pull ORG/NAME:QUANT (find them with `homelab search WORDS`)")
        return
    rows = [_row(m, f) for m, f in zip(models, fits, strict=True)]
    print(table(["MODEL", "QUANT", ">SIZE", "ARCH", ">PARAMS", ">CTX", "FIT HERE", "WHERE"], rows))


def _row(model: LocalModel, fit: Fit | None) -> list[str]:
    info = model.info
    if info is None:
        return [
            model.name,
            model.quant,
            human_bytes(model.size_bytes),
            "-",
            "-",
            "-",
            f"unreadable: {model.problem}",
            model.origin,
        ]
    made = f" (from {model.provenance.source_file_type})" if model.provenance else ""
    return [
        model.name,
        model.quant + made,
        human_bytes(model.size_bytes),
        info.architecture,
        _params(info.n_params),
        f"{info.context_length:,}",
        fit.summary if fit else "-",
        model.origin,
    ]


def _params(n_params: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n_params >= scale:
            return f"{n_params / scale:.1f}{unit}"
    return str(n_params)
