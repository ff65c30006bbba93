"""The crash matrix with the catalog lost after the kill, and with raised faults instead of
kills (``tools/crash_matrix.py``; the kill matrix is in test_crash_matrix.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _matrix import LOST, assert_all_hold, crash_matrix

from archive_manager._util import failpoints as _failpoints


@pytest.fixture(autouse=True)
def _disarmed() -> Iterator[None]:
    _failpoints.configure(None)
    yield
    _failpoints.configure(None)


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
    only = [name for name in crash_matrix.SCENARIOS if name not in LOST]
    rows = crash_matrix.matrix(
        tmp_path,
        crash_matrix.Databases(None),
        action="raise",
        first_only=True,
        only=only,
        each_point_once=True,
    )
    assert_all_hold(rows)
