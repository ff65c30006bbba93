"""The layering of docs/architecture/index.md ("Layers") holds: no module imports upward.

The table in that section is the one place the ranks are kept; this test parses it, then every
module of the package with `ast`, and follows every import: at module level, inside
``if TYPE_CHECKING:`` blocks and inside functions alike (an import for typing still ties the
lower module to the upper one's names).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "archive_manager"
DOC = REPO / "docs" / "architecture" / "index.md"
# A row of the table starts with its modules: `gc.py`, `catalog/`, several joined by ", ".
_MODULE_TOKEN = re.compile(r"^[\w.]+(?:\.py|/),?$")


@dataclass(frozen=True)
class Import:
    """One import statement of the package, resolved to the table's unit it names."""

    source: str  # the importing unit (`gc`, `catalog`, `__init__`)
    target: str  # the imported unit
    where: str  # file:line, for the failure message


def layer_ranks(doc: str) -> dict[str, int]:
    """Each unit of the "Layers" table and its rank (0 for the bottom line)."""
    section = doc.split("## Layers", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    rows: list[list[str]] = []
    for line in block.splitlines():
        if not line or line[0].isspace():
            continue  # a continuation line of the row above
        units = []
        for token in line.split():
            if not _MODULE_TOKEN.match(token):
                break
            units.append(_unit_name(token.rstrip(",")))
        assert units, f"a row of the Layers table names no module: {line!r}"
        rows.append(units)
    ranks: dict[str, int] = {}
    for rank, units in enumerate(reversed(rows)):
        for unit in units:
            assert unit not in ranks, f"{unit} is in the Layers table twice"
            ranks[unit] = rank
    return ranks


def _unit_name(entry: str) -> str:
    """`codec.py` and `codec/` are one unit: a module may become a package."""
    return entry.removesuffix("/").removesuffix(".py")


def _unit_of(module: str) -> str:
    """The table's unit of a dotted module name inside the package (`archive_manager.catalog.
    engine` -> `catalog`; the package itself -> `__init__`)."""
    parts = module.split(".")[1:]
    return parts[0] if parts else "__init__"


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(node: ast.ImportFrom, module: str, is_package: bool, package: Path) -> list[str]:
    """The package's modules ``node`` imports (dotted names): `from x import y` imports
    module ``x.y`` when there is one, else a name of ``x``."""
    if node.level == 0:
        base = node.module or ""
    else:
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([node.module] if node.module else []))
    if base != "archive_manager" and not base.startswith("archive_manager."):
        return []
    folder = package.parent.joinpath(*base.split("."))
    return [
        f"{base}.{alias.name}"
        if (folder / f"{alias.name}.py").is_file() or (folder / alias.name).is_dir()
        else base
        for alias in node.names
    ]


def package_imports(package: Path = PACKAGE) -> list[Import]:
    """Every import between units of the package, wherever it stands in its module."""
    found = []
    for path in sorted(package.rglob("*.py")):
        module = _module_name(path, package)
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        # ast.walk reaches every node: TYPE_CHECKING blocks, functions, try/except imports.
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                targets = _resolve(node, module, is_package, package)
            elif isinstance(node, ast.Import):
                targets = [
                    a.name
                    for a in node.names
                    if a.name == "archive_manager" or a.name.startswith("archive_manager.")
                ]
            else:
                continue
            where = f"{path.relative_to(package.parent)}:{node.lineno}"
            for target in targets:
                found.append(Import(_unit_of(module), _unit_of(target), where))
    return found


def upward_imports(imports: list[Import], ranks: dict[str, int]) -> list[str]:
    """The imports the table forbids, as messages (empty when the layering holds)."""
    bad = []
    for imp in imports:
        if imp.source == imp.target:
            continue  # inside one module or one package
        for unit in (imp.source, imp.target):
            if unit not in ranks:
                bad.append(
                    f"{imp.where}: {unit} is not in docs/architecture/index.md's Layers table"
                )
        if imp.source not in ranks or imp.target not in ranks:
            continue
        if imp.target == "testing":
            bad.append(f"{imp.where}: {imp.source} imports testing/, which only tests import")
        elif ranks[imp.target] >= ranks[imp.source]:
            bad.append(
                f"{imp.where}: {imp.source} (rank {ranks[imp.source]}) imports {imp.target} "
                f"(rank {ranks[imp.target]}), which is not below it"
            )
    return sorted(set(bad))


@pytest.fixture(scope="module")
def ranks() -> dict[str, int]:
    return layer_ranks(DOC.read_text(encoding="utf-8"))


def test_no_module_imports_upward(ranks: dict[str, int]) -> None:
    assert upward_imports(package_imports(), ranks) == []


def test_every_module_is_in_the_table(ranks: dict[str, int]) -> None:
    units = {_unit_of(_module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert sorted(units - ranks.keys()) == []


def test_the_components_stack_as_the_architecture_says(ranks: dict[str, int]) -> None:
    # The facade builds the PoolContext and sits above every component that takes it; the
    # lens and the interop read through the pool's protocols, never the other way round
    # (docs/architecture/index.md, "Layers").
    assert ranks["pool"] < ranks["lens"] < ranks["interop"] < ranks["manager"]
    for ground in ("blobs", "catalog", "codec", "samples", "_util", "errors"):
        assert ranks[ground] < ranks["pool"]


#: The modules that stand at the top of the package rather than in a component folder: the
#: public paths users import (and the entry points); everything else lives in a folder.
TOP_LEVEL_MODULES = {
    "__init__",
    "__main__",
    "compat",
    "data",
    "errors",
    "manager",
    "metadata",
    "samples",
}


def test_folders_are_components() -> None:
    """A new module goes into the component it belongs to (docs/architecture/index.md, "Layers"),
    not flat beside the public modules."""
    flat = {p.stem for p in PACKAGE.glob("*.py")}
    assert sorted(flat - TOP_LEVEL_MODULES) == []


def test_a_typing_only_upward_import_fails(tmp_path: Path, ranks: dict[str, int]) -> None:
    """The checker itself: an upward import hidden under TYPE_CHECKING, or inside a function,
    is found; downward ones pass."""
    package = tmp_path / "archive_manager"
    (package / "pool").mkdir(parents=True)
    (package / "lens").mkdir()
    for name in ("__init__", "manager", "errors"):
        (package / f"{name}.py").write_text("")
    for name in ("__init__", "writer"):
        (package / "pool" / f"{name}.py").write_text("")
    (package / "lens" / "__init__.py").write_text("")
    (package / "lens" / "stats.py").write_text("")
    (package / "pool" / "gc.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from ..manager import ArchiveManager\n"
        "def f() -> None:\n"
        "    from archive_manager.lens import stats\n"
        "    from . import writer\n"
        "    from .. import errors\n"
    )
    assert upward_imports(package_imports(package), ranks) == [
        f"archive_manager/pool/gc.py:3: pool (rank {ranks['pool']}) imports manager "
        f"(rank {ranks['manager']}), which is not below it",
        f"archive_manager/pool/gc.py:5: pool (rank {ranks['pool']}) imports lens "
        f"(rank {ranks['lens']}), which is not below it",
    ]


def test_a_module_missing_from_the_table_fails(tmp_path: Path, ranks: dict[str, int]) -> None:
    package = tmp_path / "archive_manager"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "newthing.py").write_text("from .errors import ArchiveError\n")
    assert upward_imports(package_imports(package), ranks) == [
        "archive_manager/newthing.py:1: newthing is not in docs/architecture/index.md's Layers table"
    ]
