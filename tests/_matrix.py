"""Helpers of the crash-matrix tests (split over several files so that the suite's workers
share the matrix's minutes: pytest-xdist hands out whole files)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import crash_matrix

__all__ = ["LOST", "SUPERSEDE", "assert_all_hold"]

#: The scenarios of a save that supersedes a released archive of its name (their own test).
SUPERSEDE = [name for name in crash_matrix.SCENARIOS if name.startswith("supersede")]
#: The scenarios that lose the catalog after the kill and rebuild it.
LOST = [name for name in crash_matrix.SCENARIOS if name.endswith("_lost") and name not in SUPERSEDE]


def assert_all_hold(rows: list[crash_matrix.Row], *, every_point: bool = True) -> None:
    failed = [r for r in rows if not r.ok]
    assert not failed, crash_matrix.table(failed) + "\n" + "\n".join(r.detail for r in failed)
    if every_point:
        assert crash_matrix.uncovered(rows) == []
