"""Failpoints and the crash matrix (``tools/crash_matrix.py``).

The matrix kills a forked child at every failpoint of every durable operation and checks the
pool's invariants; these tests run it (on both catalogs), check that every point is reached by
some operation, that the points in the code and the registry agree, and that the checker does
fail when the library breaks an invariant (so a green matrix means something).
"""

from __future__ import annotations

import ast
import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from helpers import tiny_rollout

from archive_manager import ArchiveManager
from archive_manager._util import failpoints as _failpoints
from archive_manager.errors import ArchiveNotFoundError, InvalidInputError

TOOLS = Path(__file__).resolve().parents[2] / "tools"
PACKAGE = Path(__file__).resolve().parents[2] / "archive_manager"
sys.path.insert(0, str(TOOLS))
import crash_matrix  # noqa: E402  (a script in tools/, imported as a module)
from _matrix import LOST, SUPERSEDE, assert_all_hold  # noqa: E402


def _on_a_catalog(func: ast.expr) -> bool:
    """Whether ``func`` is a catalog's ``write`` (``catalog.write``, ``self._pool.catalog.write``,
    ``context_of(pool).catalog.write``): an `ObjectRoot`'s ``root.write("name", data)`` writes
    an object, and names no failpoint."""
    if not isinstance(func, ast.Attribute):
        return False
    owner = func.value
    name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
    return name.endswith("catalog")


def _points_in_code() -> set[str]:
    """Every point the package marks: ``failpoint("x")`` and ``catalog.write("step")``."""
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        if path.name == "failpoints.py" and path.parent.name == "_util":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            arg = node.args[0]
            if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name == "failpoint":
                found.add(arg.value)
            elif name == "write" and _on_a_catalog(func):
                found |= {f"{arg.value}.before_commit", f"{arg.value}.after_commit"}
    return found


def test_registry_matches_the_code() -> None:
    assert _points_in_code() == set(_failpoints.POINTS)


@pytest.mark.parametrize(
    "spec",
    [
        "save.nope=kill",
        "save.lease.before_commit",
        "save.lease.before_commit=explode",
        "save.lease.before_commit=kill@0",
        "save.lease.before_commit=kill@x",
        "save.lease.before_commit=sleep:-1",
        "save.lease.before_commit=sleep:soon",
    ],
)
def test_bad_specs_are_refused(spec: str) -> None:
    with pytest.raises(InvalidInputError, match=_failpoints.ENV):
        _failpoints.configure(spec)
    assert _failpoints.hits("save.lease.before_commit") == 0


def test_raise_fires_at_the_nth_hit_once(tmp_path: Path) -> None:
    _failpoints.configure("save.blobs.before_commit=raise@2")
    with ArchiveManager.open(tmp_path / "pool", chunk_size=2) as pool:
        with pytest.raises(_failpoints.FailpointError, match=r"save\.blobs\.before_commit"):
            pool.save("a", tiny_rollout(40), rollout_id=1)
        assert _failpoints.hits("save.blobs.before_commit") >= 2  # later chunks may race on
        with pytest.raises(ArchiveNotFoundError):
            pool.open_archive("a")
        # Fired once: the same save now goes through.
        pool.save("a", tiny_rollout(40), rollout_id=1)
        assert len(pool.open_archive("a").load_samples()) == 40


def test_the_environment_variable_kills_a_real_process(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    script = textwrap.dedent(
        f"""
        from archive_manager import ArchiveManager
        from archive_manager.interop.synthetic import make_rollout
        with ArchiveManager.open({str(root)!r}) as pool:
            pool.save("a", make_rollout(4, prompt_len=8, response_min=4, response_max=8),
                      rollout_id=1)
        print("not killed")
        """
    )
    env = {**os.environ, _failpoints.ENV: "save.ownership.after_commit=kill"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -9, done.stderr
    assert "not killed" not in done.stdout
    with ArchiveManager.open(root) as pool:
        # Ownership committed, not yet published: invisible.
        assert pool.find() == []
        assert [a.name for a in pool.find(state=None)] == ["a"]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_crash_matrix_kill_sqlite(tmp_path: Path) -> None:
    only = [name for name in crash_matrix.SCENARIOS if name not in LOST + SUPERSEDE]
    rows = crash_matrix.matrix(tmp_path, crash_matrix.Databases(None), only=only)
    assert_all_hold(rows)
    assert all(r.outcome == "killed" for r in rows)
    # Both the first and the last hit of the points a save reaches many times.
    assert {
        (r.hit, r.of) for r in rows if r.point == "blob.after_rename" and r.scenario == "save"
    } == {
        (1, 11),
        (11, 11),
    }


def test_the_checker_catches_gc_reclaiming_owned_blobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sabotage: a GC that counts no owner at all. The matrix must report the loss."""
    from sqlalchemy import false

    from archive_manager.pool import gc

    monkeypatch.setattr(gc, "_retained", lambda now: false())
    monkeypatch.setattr(gc, "_check_invariant", lambda conn, digests: None)
    rows = crash_matrix.matrix(
        tmp_path, crash_matrix.Databases(None), only=["retain"], first_only=True
    )
    assert rows
    # The recovery gc reclaims owned blobs: the checks after it (or the checker, when a load
    # raises) must say so.
    assert all(not r.ok for r in rows), crash_matrix.table(rows)
    assert all(r.checks.get("owned") is False or r.checks.get("checker") is False for r in rows)


def test_the_checker_catches_a_visible_archive_without_owner(tmp_path: Path) -> None:
    """Sabotage (in the child only): a save that publishes before its ownership commits."""
    from sqlalchemy import delete, update

    from archive_manager.catalog import archives_table, retention_table
    from archive_manager.pool.writer import ArchiveWriter

    commit_ownership = ArchiveWriter._commit_ownership

    def publish_first(self: ArchiveWriter) -> tuple[int, Any]:
        archive_id, manifest = commit_ownership(self)
        with self._pool.catalog.write() as conn:
            conn.execute(
                update(archives_table)
                .where(archives_table.c.id == archive_id)
                .values(state="published")
            )
            conn.execute(delete(retention_table).where(retention_table.c.archive_id == archive_id))
        os.kill(os.getpid(), signal.SIGKILL)  # the crash: visible, not owned
        return archive_id, manifest

    def sabotaged_save(world: crash_matrix.World) -> None:
        ArchiveWriter._commit_ownership = publish_first  # type: ignore[method-assign]
        crash_matrix.SCENARIOS["save"].run(world)

    scenario = dataclasses.replace(crash_matrix.SCENARIOS["save"], run=sabotaged_save)
    stage = crash_matrix.Stage(scenario, tmp_path, crash_matrix.Databases(None))
    row = crash_matrix.run_row(stage, "save.publish.after_commit", 1, 1, "kill")
    stage.close()
    assert row.outcome == "killed"
    assert not row.ok, crash_matrix.table([row])
