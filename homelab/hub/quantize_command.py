"""What ``homelab quantize`` does and prints."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from homelab.hub.local_quantize import quantize_model
from homelab.hub.render import human_bytes


class _TensorBar:
    """A tqdm bar over tensors (llama.cpp reports them one by one)."""

    def __init__(self, quant: str) -> None:
        self.quant = quant
        self._bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        from tqdm import tqdm

        if self._bar is None:
            self._bar = tqdm(
                total=total,
                desc=f"quantizing to {self.quant}",
                unit="tensor",
                file=sys.stderr,
                leave=False,
            )
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def run_quantize(
    model: str, quant: str, *, output: Path | None, n_threads: int | None, as_json: bool
) -> int:
    bar = _TensorBar(quant.upper())
    try:
        record = quantize_model(
            model, quant, output=output, n_threads=n_threads, progress=None if as_json else bar
        )
    finally:
        bar.close()
    if as_json:
        print(json.dumps(asdict(record), indent=2))
        return 0
    print(
        f"{record.source_file_type} {human_bytes(record.source_bytes)} -> "
        f"{record.quant} {human_bytes(record.target_bytes)}"
    )
    print(record.target)
    print(
        f"\nCompare quality: homelab quality {record.target}   Plan: homelab plan {record.target}"
    )
    return 0
