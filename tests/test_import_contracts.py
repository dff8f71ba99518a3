"""The layers of ARCHITECTURE.md, held by import-linter (contracts in pyproject.toml).

The first test runs the contracts on the real tree. The second proves they can fail: it copies
the package, adds one forbidden import per contract and expects each contract to break.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

# (module file, forbidden line added to it, name of the contract that must break)
VIOLATIONS = [
    ("homelab/planner/__init__.py", "import homelab.server", "homelab layers (top to bottom)"),
    ("homelab/gguf/__init__.py", "import llama_cpp", "only homelab.llamacpp imports llama_cpp"),
    (
        "homelab/engine/__init__.py",
        "import homelab.planner",
        "the engine runs what it is given: it never plans, resolves or downloads",
    ),
    ("homelab/hardware/__init__.py", "import textual", "only homelab.tui imports Textual"),
    (  # summary imports model: a cycle that no layers contract forbids
        "homelab/gguf/model.py",
        "import homelab.gguf.summary",
        "no import cycles anywhere in homelab (at any depth)",
    ),
    (  # the bottom layer of the engine reaching up
        "homelab/engine/grammar.py",
        "import homelab.engine.text",
        "homelab.engine layers (the scheduler over speculation over the parts)",
    ),
    ("homelab/server/serving.py", "import homelab.server.prompting", "homelab.server layers"),
    (
        "homelab/server/tools/stream.py",
        "import homelab.server.tools.grammar",
        "homelab.server.tools layers",
    ),
]


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}  # this copy of homelab, not the installed one
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(tree / "pyproject.toml")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def lint_available() -> None:
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} is missing: install the test extras (make install-test)")


def test_the_tree_keeps_every_contract(lint_available: None) -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_forbidden_import_breaks_its_contract(lint_available: None, tmp_path: Path) -> None:
    shutil.copytree(
        ROOT / "homelab", tmp_path / "homelab", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for module, line, _ in VIOLATIONS:
        path = tmp_path / module
        path.write_text(path.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")

    result = lint_imports(tmp_path)

    assert result.returncode != 0
    broken = [line for line in result.stdout.splitlines() if line.rstrip().endswith("BROKEN")]
    for _, _, contract in VIOLATIONS:
        assert any(line.startswith(contract) for line in broken), result.stdout
    assert f"{len(VIOLATIONS)} broken" in result.stdout
