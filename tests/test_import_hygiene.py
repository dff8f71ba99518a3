"""Only homelab.tui may import Textual: every core module must import without it; and no
module takes a name private to another.

Each module is imported in a fresh interpreter (imports are cached per process, so one
interpreter would let an earlier import hide a later one's dependency).
"""

from __future__ import annotations

import ast
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


# --- no private names across modules ---------------------------------------------------------


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _is_submodule(dotted: str) -> bool:
    relative = Path(*dotted.split(".")[1:])
    base = PACKAGE_ROOT / relative
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def private_imports(path: Path, text: str | None = None) -> list[str]:
    """Each ``from M import _name`` in ``path`` (or in ``text``, as if it were ``path``) that
    takes a name private to another module. A private submodule (``from homelab.llamacpp
    import _lib``) may be imported inside its own package, and by nobody outside it."""
    module = _module_name(path)
    package = _package_of(module, path)
    found = []
    source_text = path.read_text() if text is None else text
    for node in ast.walk(ast.parse(source_text, str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        source = _absolute(node, package)
        if source is None or not source.startswith("homelab"):
            continue
        for alias in node.names:
            if not _is_private(alias.name):
                continue
            dotted = f"{source}.{alias.name}"
            if _is_submodule(dotted) and (package + ".").startswith(source + "."):
                continue
            found.append(f"{module}:{node.lineno} imports {alias.name} from {source}")
    return found


def _absolute(node: ast.ImportFrom, package: str) -> str | None:
    if node.level == 0:
        return node.module
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def test_no_module_imports_a_private_name_from_another() -> None:
    found = [line for path in sorted(PACKAGE_ROOT.rglob("*.py")) for line in private_imports(path)]
    assert found == []


def test_the_private_import_check_can_fail() -> None:
    """The check notices a private name taken from another module, relative imports included,
    and lets a package use its own private submodule."""
    offender = PACKAGE_ROOT / "server" / "_hygiene_probe.py"  # read as text, never written
    text = (
        "from homelab.server.protocol import _part\n"
        "from .serving import _hidden\n"
        "from homelab.server import tools\n"
        "from homelab.llamacpp import _lib\n"
    )
    own_package = "from homelab.llamacpp import _lib\nfrom . import _lib\n"
    assert private_imports(PACKAGE_ROOT / "llamacpp" / "mtmd.py", own_package) == []
    assert private_imports(offender, text) == [
        "homelab.server._hygiene_probe:1 imports _part from homelab.server.protocol",
        "homelab.server._hygiene_probe:2 imports _hidden from homelab.server.serving",
        "homelab.server._hygiene_probe:4 imports _lib from homelab.llamacpp",
    ]
