"""What a model's file says of it before it is loaded: for ``/v1/models`` on a fleet, so a
client (the web page's model picker) sees an unloaded model's capabilities too.

A loaded model is described by its engine (``app.model_details``: the context a request
may use, which only its plan decides). An unloaded one by its GGUF header and its folder:
the trained context, whether its chat template reads ``tools`` or thinks, whether a vision
projector lies beside it. The header is read once per file version (path, size, mtime).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

from homelab.engine.chat_template import ChatTemplate
from homelab.errors import HomelabError
from homelab.gguf.reader import read_model
from homelab.models.mmproj import find_mmproj
from homelab.server.reasoning import detect_reasoning

log = logging.getLogger("homelab.server")


def file_details(path: Path) -> dict[str, Any]:
    """The card fields an unloaded model's file gives ({} when the file cannot be read)."""
    try:
        stat = path.stat()
    except OSError:
        return {}
    return _details(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _details(path_text: str, _size: int, _mtime_ns: int) -> dict[str, Any]:
    path = Path(path_text)
    try:
        info = read_model(path)
        tools, thinks = _template_facts(info.chat_template)
    except (HomelabError, OSError, ValueError) as exc:
        log.debug("cannot describe %s: %s", path, exc)
        return {}
    sees = find_mmproj(path) is not None
    capabilities = [
        "completion",
        *(["tools"] if tools else []),
        *(["thinking"] if thinks else []),
        *(["vision"] if sees else []),
    ]
    return {
        "meta": {"n_ctx_train": info.context_length, "n_params": info.n_params},
        "capabilities": capabilities,
        "supports": {"tools": tools, "reasoning": thinks, "vision": sees},
    }


def _template_facts(source: str | None) -> tuple[bool, bool]:
    """(reads ``tools``, thinks) of a chat template; a template that does not compile: no."""
    if not source:
        return False, False
    try:
        template = ChatTemplate(source)
    except HomelabError:
        return False, False
    return template.supports_tools, detect_reasoning(source) is not None
