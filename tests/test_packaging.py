"""What a wheel ships: every package of the source tree, its data files and py.typed.

pyproject.toml lists the packages by hand (the migrations live outside the package and are
mapped in), so a new subpackage that is not listed would be missing from every non-editable
install while the editable installs of the suite still import it from the tree.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
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
    # Data folders (the viewer's templates and static files) are listed so that setuptools ships
    # them, and hold no Python.
    data_only = {p for p in listed - on_disk if p in _config()["package-data"]}
    assert listed - on_disk - data_only == set(), "listed packages without an __init__.py"
    for package in data_only:
        assert not list(_source_dir(package).glob("*.py")), package
    for package in listed - data_only:
        assert (_source_dir(package) / "__init__.py").is_file(), package


def test_package_data_exists() -> None:
    data = _config()["package-data"]
    assert (ROOT / "archive_manager" / "py.typed").is_file()
    for package, patterns in data.items():
        base = _source_dir(package)
        for pattern in patterns:
            assert list(base.glob(pattern)), f"{package}: nothing matches {pattern}"


def _copy_source(dest: Path) -> Path:
    """The files a build reads, without build output the tree may hold (a built .so); the
    suite's top-level files too, which setuptools would ship by default (tests/test*.py)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "*.egg-info", "build")
    dest.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("archive_manager", "migrations"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    (dest / "tests").mkdir()
    for test in (ROOT / "tests").glob("*.py"):
        shutil.copy2(test, dest / "tests" / test.name)
    return dest


def _build(tmp_path: Path, kind: str, *, timeout: int) -> Path:
    """Build an sdist or a wheel of a clean copy of the source with setuptools' backend."""
    src = _copy_source(tmp_path / "src")
    out = tmp_path / kind
    build = f"from setuptools import build_meta; print(build_meta.build_{kind}({str(out)!r}))"
    done = subprocess.run(
        [sys.executable, "-c", build], cwd=src, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr
    return out / done.stdout.split()[-1]


def test_the_sdist_carries_the_extensions_source(tmp_path: Path) -> None:
    with tarfile.open(_build(tmp_path, "sdist", timeout=120)) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {
        "setup.py",
        "archive_manager/codec/_native.c",
        "archive_manager/codec/_native.pyi",
    } <= names
    # The suite runs from a checkout (conftest, helpers, docs, tools): setuptools' default
    # of shipping tests/test*.py alone gave five files that could not run (MANIFEST.in).
    assert sorted(n for n in names if n.startswith("tests/")) == []


@pytest.mark.skipif(
    shutil.which("gcc") is None and shutil.which("cc") is None, reason="no C compiler"
)
def test_the_wheel_builds_the_extension(tmp_path: Path) -> None:
    with zipfile.ZipFile(_build(tmp_path, "wheel", timeout=240)) as wheel:
        names = wheel.namelist()
    assert any(n.startswith("archive_manager/codec/_native.") and n.endswith(".so") for n in names)


def test_install_hints_never_send_users_to_an_unpublished_name() -> None:
    """`rollout-archive-manager` is not on PyPI: a bare `pip install 'rollout-archive-manager[X]'`
    fails on a fresh machine and would install whoever registers the name.  Every hint goes
    through `errors.extra_hint`, which names the checkout's install first."""
    from archive_manager.errors import extra_hint

    bare = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "archive_manager").rglob("*.py"))
        if path.name != "errors.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"rollout-archive-manager\[|install (-U )?'?rollout-archive-manager", line)
    ]
    assert bare == []
    hint = extra_hint("torch")
    assert hint.startswith("install the 'torch' extra: pip install -e '.[torch]' in a checkout")
    assert "\n" not in hint
