"""Reviewer's breaks of the claims on the viewer's /stats keyset paging and ls's SQLite
listing: each test states what the claim promises; what is not fixed yet is a strict xfail."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import small_rollout

from archive_manager import ArchiveManager
from archive_manager.web.app import create_app


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[ArchiveManager]:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as made:
        for i, (rollout_id, evaluation) in enumerate([(1, False), (1, True), (10, False)]):
            made.save(
                f"r-{i}", small_rollout(2, seed=i), rollout_id=rollout_id, evaluation=evaluation
            )
    opened = ArchiveManager.open(root)
    yield opened
    opened.close()


# Fixed: the viewer reads numbers as ASCII digits with an optional minus (`web.app._whole`).
@pytest.mark.parametrize(
    "query",
    [
        "after=1_0:training",  # silently the key (10, training): a page starts elsewhere
        "after=%D9%A1:training",  # U+0661 ARABIC-INDIC DIGIT ONE, read as 1
        "per_page=1_0",
        "rollout_id=1_0",
    ],
)
def test_stats_numbers_in_python_literal_spellings_are_not_400(
    pool: ArchiveManager, query: str
) -> None:
    response = create_app(pool).test_client().get(f"/stats?{query}")
    assert response.status_code == 400


# Fixed: a parameter given twice is a 400 (`web.app._raw`); ``page`` (an offset on the other
# pages, meaningless on /stats, which pages by ``after``) is a 400 naming ``after=``.
@pytest.mark.parametrize(
    "query",
    [
        "after=1:training&after=zzz",
        "after=1:training&after=10:training",
        "page=abc",
        "page=2",
    ],
)
def test_stats_drops_parameters_it_does_not_use_without_400(
    pool: ArchiveManager, query: str
) -> None:
    response = create_app(pool).test_client().get(f"/stats?{query}")
    assert response.status_code == 400
    if query.startswith("page="):
        assert b"after=" in response.data
