"""Copying a model file somewhere else, atomically (``homelab demo-model PATH``)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from homelab.errors import HomelabError


def copy_model(source: Path, destination: str, *, force: bool = False) -> Path:
    """Copy ``source`` to ``destination`` (a file, or a folder when it is one or ends in /);
    the target appears whole or not at all. Refuses to overwrite unless ``force``."""
    target = Path(destination).expanduser()
    if target.is_dir() or destination.endswith(("/", os.sep)):
        target = target / source.name
    if target.exists() and not force:
        raise HomelabError(f"{target} already exists.", hint="Pass --force to overwrite it.")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".partial", delete=False) as tmp:
            partial = Path(tmp.name)
        try:
            shutil.copyfile(source, partial)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    except OSError as exc:
        raise HomelabError(
            f"cannot write {target}: {exc.strerror or exc}.", hint="Choose a writable location."
        ) from exc
    return target
