"""What a wheel ships: every package of the source tree, its data files and py.typed.

pyproject.toml lists the packages by hand (the migrations live outside the package and are
mapped in), so a new subpackage that is not listed would be missing from every non-editable
install while the editable installs of the suite still import it from the tree.
"""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _config() -> dict:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def _source_dir(package: str) -> Path:
    """Where setuptools takes ``package`` from, following ``package-dir``."""
    mapped = _config().get("package-dir", {})
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        head = ".".join(parts[:cut])
        if head in mapped:
            return ROOT / mapped[head] / Path(*parts[cut:])
    return ROOT / Path(*parts)


def _packages_under(directory: Path, prefix: str) -> set[str]:
    return {
        ".".join((prefix, *init.parent.relative_to(directory).parts))
        for init in directory.rglob("__init__.py")
    }


def test_every_package_of_the_tree_is_shipped() -> None:
    listed = set(_config()["packages"])
    on_disk = _packages_under(ROOT / "archive_manager", "archive_manager")
    for package, directory in _config().get("package-dir", {}).items():
        on_disk |= _packages_under(ROOT / directory, package)
    assert on_disk - listed == set(), "subpackages missing from pyproject's packages"
    assert listed - on_disk == set(), "listed packages without an __init__.py"
    for package in listed:
        assert (_source_dir(package) / "__init__.py").is_file(), package


def test_package_data_exists() -> None:
    data = _config()["package-data"]
    assert (ROOT / "archive_manager" / "py.typed").is_file()
    for package, patterns in data.items():
        base = _source_dir(package)
        for pattern in patterns:
            assert list(base.glob(pattern)), f"{package}: nothing matches {pattern}"
