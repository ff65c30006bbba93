"""The crash matrix on a PostgreSQL catalog (``tools/crash_matrix.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _matrix import assert_all_hold, crash_matrix

from archive_manager._util import failpoints as _failpoints


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_crash_matrix_kill_postgresql(tmp_path: Path, pg_server) -> None:  # type: ignore[no-untyped-def]
    dbs = crash_matrix.Databases(pg_server.url())
    try:
        # stream, reference, failed_save and pointer differ from save above the catalog
        # (writer and blob layer), which the SQLite matrix covers; every catalog step is here.
        only = ["save", "retain", "release", "release_owner", "gc", "rebuild", "restore"]
        only += ["first_open", "rebind", "retain_lost", "release_owner_lost", "supersede"]
        rows = crash_matrix.matrix(tmp_path, dbs, only=only, first_only=True)
    finally:
        dbs.close()
    assert_all_hold(rows, every_point=False)
    # A pool whose catalog is given by URL does not follow a moved root (identity.move).
    catalog_points = {
        p for p in _failpoints.POINTS if p.endswith("_commit") and not p.startswith("identity.move")
    }
    assert {p for p in catalog_points if not p.startswith("save.rollback")} <= {
        r.point for r in rows
    }
