"""Only homelab.tui may import Textual: every core module must import without it.

Each module is imported in a fresh interpreter (imports are cached per process, so one
interpreter would let an earlier import hide a later one's dependency).
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import homelab

PACKAGE_ROOT = Path(homelab.__file__).parent
UI_PACKAGE = "homelab.tui"
PARALLEL_INTERPRETERS = 4
# Textual-free helpers inside the TUI package: `homelab tui --json` must not pay for Textual
# (homelab.cli.tui itself is a core module, checked with the others).
TEXTUAL_FREE_TUI_MODULES = (
    "homelab.tui.services",
    "homelab.tui.knobs",
    "homelab.tui.handoff",
    "homelab.tui.format",
    "homelab.tui.hardware_source",
    "homelab.tui.status",
    "homelab.tui.protocols",
)


def core_modules() -> list[str]:
    names = ["homelab"]
    for info in pkgutil.walk_packages([str(PACKAGE_ROOT)], prefix="homelab."):
        if info.name == UI_PACKAGE or info.name.startswith(UI_PACKAGE + "."):
            continue
        names.append(info.name)
    return sorted(names)


CHECK = """
import importlib, sys
failed = []
for name in sys.argv[1:]:
    importlib.import_module(name)
    if "textual" in sys.modules:
        failed.append(name)
        break
print("\\n".join(failed))
"""


def pulls_textual(name: str) -> bool:
    """Import ``name`` in a fresh interpreter; True if Textual got loaded."""
    result = subprocess.run(
        [sys.executable, "-c", CHECK, name], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"importing {name} failed:\n{result.stderr[-2000:]}"
    return bool(result.stdout.strip())


def modules_pulling_textual(names: list[str]) -> list[str]:
    """The modules among ``names`` that load Textual, each checked in its own interpreter
    (a few at a time: the interpreters mostly wait on imports)."""
    with ThreadPoolExecutor(max_workers=PARALLEL_INTERPRETERS) as pool:
        verdicts = list(pool.map(pulls_textual, names))
    return [name for name, pulled in zip(names, verdicts, strict=True) if pulled]


def test_the_core_packages_are_found() -> None:
    names = core_modules()
    for package in ("homelab.hardware", "homelab.gguf", "homelab.planner", "homelab.engine"):
        assert package in names
    assert not any(name.startswith(UI_PACKAGE) for name in names)


def test_no_core_module_imports_textual() -> None:
    assert modules_pulling_textual(core_modules()) == []


@pytest.mark.parametrize("name", TEXTUAL_FREE_TUI_MODULES)
def test_tui_helpers_stay_textual_free(name: str) -> None:
    assert modules_pulling_textual([name]) == []


def test_the_check_notices_textual() -> None:
    """The check itself can fail: the app module does import Textual."""
    assert modules_pulling_textual(["homelab.tui.app"]) == ["homelab.tui.app"]
