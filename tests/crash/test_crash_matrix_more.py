"""The crash matrix with the catalog lost after the kill, and with raised faults instead of
kills (``tools/crash_matrix.py``; the kill matrix is in test_crash_matrix.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from _matrix import LOST, SUPERSEDE, assert_all_hold, crash_matrix

from archive_manager._util import failpoints as _failpoints


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_crash_matrix_kill_then_lose_the_catalog_sqlite(tmp_path: Path) -> None:
    """Every durable step of save, retain, release and release_owner killed, then the catalog
    lost and rebuilt from the manifests and the retention journal: the same owners come
    back (the in-flight decision all or nothing)."""
    rows = crash_matrix.matrix(tmp_path, crash_matrix.Databases(None), only=LOST, first_only=True)
    assert_all_hold(rows, every_point=False)
    assert {"journal.before_write", "journal.after_write"} <= {r.point for r in rows}
    assert {r.scenario for r in rows} == set(LOST)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_crash_matrix_raise_sqlite(tmp_path: Path) -> None:
    # The lost-catalog scenarios differ from their plain twins only after the fault (the
    # catalog is then lost and rebuilt), which the kill matrix above covers: raised here,
    # they would repeat the plain scenarios' error paths at twice the cost. Every failpoint
    # is raised once, in the first scenario that reaches it: the kill matrix runs each
    # (scenario, failpoint) pair, and `tools/crash_matrix.py --action raise` all of them.
    only = [name for name in crash_matrix.SCENARIOS if name not in LOST + SUPERSEDE]
    rows = crash_matrix.matrix(
        tmp_path,
        crash_matrix.Databases(None),
        action="raise",
        first_only=True,
        only=only,
        each_point_once=True,
    )
    assert_all_hold(rows)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_crash_matrix_kill_a_superseding_save_sqlite(tmp_path: Path) -> None:
    """``pool.save(name, ..., supersede=True)`` killed (SIGKILL) at the first and the last hit
    of every failpoint it reaches, then with the catalog lost and rebuilt from the manifests
    and the journal: the name points at the earlier archive, intact, or at the new one,
    complete, never neither, never both (issue 35, item 1)."""
    rows = crash_matrix.matrix(tmp_path, crash_matrix.Databases(None), only=SUPERSEDE)
    assert_all_hold(rows, every_point=False)
    assert all(r.outcome == "killed" for r in rows)
    save_points = {p for p in _failpoints.POINTS if p.startswith(("save.", "blob."))}
    save_points -= {p for p in save_points if p.startswith("save.rollback")}
    reached = {r.point for r in rows if r.scenario == "supersede"}
    assert save_points | {"journal.before_write", "journal.after_write"} <= reached
    assert {r.scenario for r in rows} == set(SUPERSEDE)


def test_the_checker_catches_a_name_pointing_at_neither_archive(tmp_path: Path) -> None:
    """Sabotage (in the child only): a superseding save that marks the earlier archive
    superseded in a transaction of its own, before its publication, and is killed between
    the two.  The matrix must report the name pointing at neither."""
    import os
    import signal

    from sqlalchemy import update

    from archive_manager.catalog import archives_table
    from archive_manager.pool.writer import ArchiveWriter

    def supersede_first(self: ArchiveWriter, archive_id: int, manifest: str) -> object:
        assert self._replaces is not None
        with self._pool.catalog.write() as conn:
            conn.execute(
                update(archives_table)
                .where(archives_table.c.id == self._replaces.id)
                .values(state="superseded", superseded_by=archive_id)
            )
        os.kill(os.getpid(), signal.SIGKILL)  # the crash: the name points at neither
        raise AssertionError("unreachable")

    def sabotaged(world: crash_matrix.World) -> None:
        ArchiveWriter._publish = supersede_first  # type: ignore[assignment,method-assign]
        crash_matrix.SCENARIOS["supersede"].run(world)

    scenario = dataclasses.replace(crash_matrix.SCENARIOS["supersede"], run=sabotaged)
    stage = crash_matrix.Stage(scenario, tmp_path, crash_matrix.Databases(None))
    try:
        row = crash_matrix.run_row(stage, "save.manifest.after_write", 1, 1, "sleep:0")
    finally:
        stage.close()
    assert row.outcome == "killed"
    assert row.checks["atomic"] is False, crash_matrix.table([row])
