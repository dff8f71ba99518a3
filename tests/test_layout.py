"""README's Layout names every module of the package, and only modules that exist; tests/
mirrors the package.

The Layout is an indented tree: a line whose first word ends with ``/`` opens a folder (its
parent is the nearest less-indented folder); the ``*.py`` words a line starts with are modules
of the folder it is indented under. ``__init__.py`` files are not listed.

tests/ (the rule README's Layout states): a folder of tests/ that holds Python files is named
for what it tests, ``tests/X/Y/`` for the package ``homelab/X/Y/`` or the module
``homelab/X/Y.py`` (``tests/llamacpp/rpc/``); tests that cross packages, shared helpers and
fixture plugins sit at the top of tests/. A verb's own test (``test_<verb>_cli.py``) sits in
``tests/cli/``.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def layout_block(readme: str) -> list[str]:
    after = readme.split("\n## Layout\n", 1)[1]
    block = after.split("```", 2)[1]
    return block.splitlines()[1:]  # the line after the opening fence onward


def named_modules(lines: list[str]) -> set[str]:
    """Module paths (``homelab/server/tools/stream.py``) the Layout names."""
    folders: list[tuple[int, str]] = []  # (indent, path) of the open folders
    named: set[str] = set()
    for line in lines:
        words = line.split()
        if not words:
            continue
        indent = len(line) - len(line.lstrip())
        if words[0].endswith("/"):
            while folders and folders[-1][0] >= indent:
                folders.pop()
            parent = folders[-1][1] if folders else ""
            folders.append((indent, parent + words[0]))
            continue
        while folders and folders[-1][0] >= indent:
            folders.pop()
        for word in words:
            if not word.endswith(".py"):
                break
            if folders:
                named.add(folders[-1][1] + word)
    return {path for path in named if path.startswith("homelab/")}


def package_modules() -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "homelab").rglob("*.py")
        if path.name != "__init__.py"
    }


def test_the_layout_names_every_module_and_no_other() -> None:
    named = named_modules(layout_block((ROOT / "README.md").read_text(encoding="utf-8")))
    actual = package_modules()
    assert not actual - named, f"modules the README's Layout does not name: {actual - named}"
    assert not named - actual, f"the Layout names modules that do not exist: {named - actual}"


def misplaced_tests(test_files: list[Path], package: Path) -> list[str]:
    """The files (paths relative to tests/) that break the rule above."""
    wrong = []
    for path in test_files:
        folder = path.parent
        if folder == Path("."):
            continue
        target = package / folder
        if not (target.is_dir() or target.with_suffix(".py").is_file()):
            wrong.append(f"{path}: no homelab/{folder}/ or homelab/{folder}.py to mirror")
        elif path.name.endswith("_cli.py") and folder != Path("cli"):
            wrong.append(f"{path}: a verb's test belongs in tests/cli/")
    return wrong


def test_tests_mirror_the_package() -> None:
    tests = ROOT / "tests"
    files = [path.relative_to(tests) for path in tests.rglob("*.py")]
    assert not misplaced_tests(files, ROOT / "homelab")


def test_a_test_outside_the_mirror_is_found() -> None:
    files = [
        Path("test_layout.py"),  # cross-cutting, at the top
        Path("server/tools/test_detect.py"),  # homelab/server/tools/
        Path("llamacpp/rpc/test_split.py"),  # homelab/llamacpp/rpc.py
        Path("cli/test_plan_cli.py"),
        Path("rpc/test_split.py"),  # no homelab/rpc
        Path("server/test_serve_cli.py"),  # a verb's test outside tests/cli
    ]
    assert misplaced_tests(files, ROOT / "homelab") == [
        "rpc/test_split.py: no homelab/rpc/ or homelab/rpc.py to mirror",
        "server/test_serve_cli.py: a verb's test belongs in tests/cli/",
    ]


def test_the_parser_reads_folders_by_indentation() -> None:
    lines = [
        "homelab/",
        "  a.py b.py        two modules",
        "  sub/             a folder",
        "    c.py           in sub",
        "  d.py             back at the top",
        "other/",
        "  e.py",
    ]
    assert named_modules(lines) == {
        "homelab/a.py",
        "homelab/b.py",
        "homelab/sub/c.py",
        "homelab/d.py",
    }


ARCHITECTURE_MAX_LINES = 110


def test_architecture_fits_on_one_page() -> None:
    lines = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= ARCHITECTURE_MAX_LINES, (
        f"ARCHITECTURE.md has {len(lines)} lines; keep the map on one page "
        f"(≤ {ARCHITECTURE_MAX_LINES}): figures go to benchmarks/RESULTS.md or module docstrings"
    )


def named_paths(text: str) -> set[str]:
    """Every `folder/module.py` or `folder/` path named in backquotes (relative to homelab/,
    or to the repository for tools/, benchmarks/ and tests/)."""
    import re

    found = set()
    prose = re.sub(r"```.*?```", "", text, flags=re.S)  # the layer diagram names packages
    for quoted in re.findall(r"`([^`]+)`", prose):
        for word in re.findall(r"[\w./]+", quoted):
            if word.endswith(".py") and "/" in word:
                found.add(word)
    return found


def test_every_module_architecture_names_exists() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    paths = named_paths(text)
    assert len(paths) > 30  # the map names the places, not just the layers
    top = ("tools/", "benchmarks/", "tests/")
    missing = [
        path
        for path in sorted(paths)
        if not (ROOT / path if path.startswith(top) else ROOT / "homelab" / path).exists()
    ]
    assert not missing, f"ARCHITECTURE.md names modules that do not exist: {missing}"
