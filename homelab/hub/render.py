"""Text and JSON views of what the hub's verbs return (search, pull, models, quantize); the
TUI renders the same objects itself."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from homelab.hub.progress import ProgressSink
from homelab.units import format_size

if TYPE_CHECKING:
    from homelab.gguf.quantize import Provenance
    from homelab.hub.client import RepoListing, RepoSummary
    from homelab.hub.fit import Fit
    from homelab.hub.library import LocalModel
    from homelab.hub.pull import PulledModel
    from homelab.hub.quants import GgufEntry


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain left-aligned table (numbers right-aligned when the header starts with '>')."""
    right = [h.startswith(">") for h in headers]
    names = [h.lstrip(">") for h in headers]
    widths = [max(len(str(c)) for c in column) for column in zip(names, *rows, strict=False)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            str(c).rjust(w) if r else str(c).ljust(w)
            for c, w, r in zip(cells, widths, right, strict=False)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(names), *(line(row) for row in rows)])


class TqdmProgress(ProgressSink):
    """A tqdm bar on stderr per phase (download, verification); ``bars=False``: the notes
    only (``--json`` runs)."""

    def __init__(self, *, bars: bool = True) -> None:
        self._bar: Any = None
        self._bars = bars

    def start(self, label: str, total_bytes: int, done_bytes: int) -> None:
        from tqdm import tqdm

        self.finish()
        if not self._bars:
            return
        self._bar = tqdm(
            total=total_bytes,
            initial=done_bytes,
            desc=label[-40:],
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            file=sys.stderr,
            leave=False,
            dynamic_ncols=True,
        )

    def advance(self, n_bytes: int) -> None:
        if self._bar is not None:
            self._bar.update(n_bytes)

    def note(self, message: str) -> None:
        from tqdm import tqdm

        tqdm.write(f"homelab: {message}", file=sys.stderr)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


# --- rendering -------------------------------------------------------------------------------


def search_document(query: str, hits: list[RepoSummary]) -> dict[str, Any]:
    return {"query": query, "repos": [asdict(hit) for hit in hits]}


def format_search(query: str, hits: list[RepoSummary]) -> str:
    if not hits:
        return f"No GGUF repos match {query!r}."
    rows = [[h.repo_id, _count(h.downloads), _count(h.likes), h.updated or "?"] for h in hits]
    header = table(["REPO", ">DOWNLOADS", ">LIKES", "UPDATED"], rows)
    return f"{header}\n\nList a repo's files: homelab search {hits[0].repo_id}"


def _count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def listing_document(listing: RepoListing) -> dict[str, Any]:
    return {
        "repo": listing.repo_id,
        "commit": listing.commit,
        "entries": [entry_document(e) for e in listing.entries],
        "projectors": [asdict(f) for f in listing.projectors],
    }


def entry_document(entry: GgufEntry) -> dict[str, Any]:
    return {
        "quant": entry.quant,
        "label": entry.label,
        "stem": entry.stem,
        "size_bytes": entry.total_bytes,
        "split": entry.is_split,
        "missing_parts": list(entry.missing_parts),
        "files": [asdict(f) for f in entry.files],
    }


def format_listing(listing: RepoListing) -> str:
    head = f"{listing.repo_id} at {listing.commit[:12]}: {len(listing.entries)} GGUF model file(s)"
    if not listing.entries:
        return head
    rows = [
        [e.label, format_size(e.total_bytes), str(len(e.files)), _file_note(e)]
        for e in listing.entries
    ]
    lines = [head, table(["QUANT", ">SIZE", ">FILES", "FILE"], rows)]
    if listing.projectors:
        lines.append("Vision projectors: " + ", ".join(f.path for f in listing.projectors))
    lines.append(
        f"\nWhat fits here: homelab search {listing.repo_id} --plan   "
        f"Download: homelab pull {listing.repo_id}:{listing.entries[-1].label}"
    )
    return "\n".join(lines)


def _file_note(entry: GgufEntry) -> str:
    if entry.missing_parts:
        return f"{entry.first_path} (split set, INCOMPLETE: {len(entry.missing_parts)} missing)"
    return f"{entry.first_path} (split set)" if entry.is_split else entry.first_path


# --- homelab pull --------------------------------------------------------------------------


def pulled_document(pulled: PulledModel) -> dict[str, Any]:
    return {
        "repo": pulled.repo_id,
        "commit": pulled.commit,
        "quant": pulled.quant,
        "paths": [str(p) for p in pulled.paths],
        "size_bytes": pulled.total_bytes,
        "downloaded_bytes": pulled.downloaded_bytes,
        "from_cache_only": pulled.from_cache_only,
        "notes": list(pulled.notes),
        "mmproj": str(pulled.mmproj) if pulled.mmproj else None,
    }


def format_pulled(pulled: PulledModel) -> str:
    fetched = (
        f"downloaded {format_size(pulled.downloaded_bytes)}, verified"
        if pulled.downloaded_bytes
        else "already downloaded"
    )
    name = f"{pulled.repo_id}:{pulled.quant}"
    return (
        f"{name} ({format_size(pulled.total_bytes)}, {fetched})\n{pulled.path}\n\n"
        f"Next: homelab plan {name}   Run: homelab run {name} --chat"
    )


# --- homelab models ------------------------------------------------------------------------


def models_document(
    models: Sequence[LocalModel], fits: Sequence[Fit | None], folders: Sequence[Path], hf: Path
) -> dict[str, Any]:
    return {
        "folders": [str(d) for d in folders],
        "hf_cache": str(hf),
        "models": [_model_document(m, f) for m, f in zip(models, fits, strict=True)],
    }


def _model_document(model: LocalModel, fit: Fit | None) -> dict[str, Any]:
    info = model.info
    return {
        "name": model.name,
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
        "mmproj": str(model.mmproj) if model.mmproj else None,
    }


def format_models(
    models: Sequence[LocalModel], fits: Sequence[Fit | None], folders: Sequence[Path], hf: Path
) -> str:
    if not models:
        return (
            f"No GGUF models found in {', '.join(str(d) for d in folders)} or {hf}.\n"
            "Download one: homelab pull ORG/NAME:QUANT (find them with `homelab search WORDS`)"
        )
    rows = [_model_row(m, f) for m, f in zip(models, fits, strict=True)]
    headers = ["NAME", "QUANT", ">SIZE", "ARCH", ">PARAMS", "FITS NOW", "WHERE"]
    example = next((m.name for m in models if m.info is not None), models[0].name)
    return (
        f"{table(headers, rows)}\n\n"
        "FITS NOW: the planner's choice for the memory free now (placement · context per "
        "slot · KV cache · decode speed). +vision: an mmproj beside it (images).\n"
        f'Every verb takes a NAME as MODEL, e.g. homelab run {example} --prompt "hi"'
    )


def _model_row(model: LocalModel, fit: Fit | None) -> list[str]:
    info = model.info
    size = format_size(model.size_bytes)
    if info is None:
        unreadable = f"unreadable: {model.problem}"
        return [model.name, model.quant, size, "-", "-", unreadable, model.origin]
    made = f" (from {model.provenance.source_file_type})" if model.provenance else ""
    return [
        model.name,
        model.quant + made,
        size,
        info.architecture + (" +vision" if model.mmproj else ""),
        _params(info.n_params),
        fit.summary if fit else "-",
        model.origin,
    ]


def _params(n_params: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n_params >= scale:
            return f"{n_params / scale:.1f}{unit}"
    return str(n_params)


# --- homelab quantize ----------------------------------------------------------------------


def format_quantized(record: Provenance) -> str:
    return (
        f"{record.source_file_type} {format_size(record.source_bytes)} -> "
        f"{record.quant} {format_size(record.target_bytes)}\n{record.target}\n\n"
        f"Compare quality: homelab quality {record.target}   Plan: homelab plan {record.target}"
    )
