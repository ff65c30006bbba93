"""Listings that page by keyset (find, ls, the viewer's pool page) and sample queries that walk
the archives in order (docs/architecture/summaries-and-paging.md, "Summaries and paging")."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import event, text

import archive_manager.lens.query as query_module
from archive_manager import ArchiveManager, Sample
from archive_manager.cli import cli
from archive_manager.errors import ArchiveNotFoundError, InvalidInputError
from archive_manager.web import create_app


def _fill(pool: ArchiveManager, seed: int = 0) -> None:
    """Archives of several rollouts, some without a rollout id, evaluation and released
    ones; rewards, lengths and statuses at random (a few dense, a few rare)."""
    rng = random.Random(seed)
    statuses = [Sample.Status.COMPLETED, Sample.Status.TRUNCATED, Sample.Status.ABORTED]
    for k, rollout_id in enumerate([3, 1, None, 2, 1, None, 0, 2]):
        samples = []
        for i in range(rng.randint(1, 30)):
            sample = Sample(
                index=i,
                reward=rng.choice([None, 0.0, 1.0, rng.random()]),
                response_length=rng.randint(0, 100),
                status=rng.choices(statuses, weights=[10, 10, 1])[0],
            )
            sample.task_key = f"t{i % 3}"  # type: ignore[attr-defined]
            samples.append(sample)
        pool.save(
            f"a{k}-{'X' if k % 2 else 'y'}", samples, rollout_id=rollout_id, evaluation=k == 4
        )
    pool.open_archive("a7-X").release()


def test_find_pages_by_keyset(pool: ArchiveManager) -> None:
    _fill(pool)
    for state in ("published", None):
        every = [i.name for i in pool.find(state=state)]
        # Rollout ids in order, archives without one last (both catalogs alike).
        ids = [i.rollout_id for i in pool.find(state=state)]
        assert ids == sorted(ids, key=lambda r: (r is None, r or 0))
        for size in (1, 3):
            pages: list[str] = []
            after = None
            while True:
                page = [i.name for i in pool.find(state=state, limit=size, after=after)]
                assert len(page) <= size
                if not page:
                    break
                pages += page
                after = page[-1]
            assert pages == every
    assert [i.name for i in pool.find(evaluation=True, limit=5)] == ["a4-y"]
    with pytest.raises(ArchiveNotFoundError):
        pool.find(after="nope")
    with pytest.raises(InvalidInputError):
        pool.find(limit=-1)


def test_stats_pages_by_keyset(pool: ArchiveManager) -> None:
    _fill(pool)
    # Rollout 2 holds two archives (merged), rollout 1 a training and an evaluation row,
    # two archives have no rollout id (the last row), a7-X is released.
    for filters in ({}, {"evaluation": False}, {"rollout_ids": (1, None)}, {"rollout_ids": 9}):
        every = pool.stats(**filters)
        keys = [(r.rollout_id, r.evaluation) for r in every]
        assert keys == sorted(keys, key=lambda k: (k[0] is None, k[0] or 0, k[1]))
        for size in (1, 2, 5):
            pages: list[Any] = []
            after = None
            while True:
                page = pool.stats(**filters, limit=size, after=after)
                assert len(page) <= size
                if not page:
                    break
                pages += page
                after = (page[-1].rollout_id, page[-1].evaluation)
            assert pages == every, (filters, size)
        for i, key in enumerate(keys):
            assert pool.stats(**filters, after=key) == every[i + 1 :]
    every = pool.stats()
    assert (None, False) in [(r.rollout_id, r.evaluation) for r in every]
    # A key that is no row's still starts after its place in the order.
    assert pool.stats(after=(1, True), limit=1) == [r for r in every if r.rollout_id == 2]
    assert pool.stats(after=(-5, False)) == every
    assert pool.stats(after=(None, False)) == []  # the last row (None, True) does not exist
    assert pool.stats(limit=0) == []
    for bad in ((1,), (1, "yes"), ("1", False), (True, False), (2**63, False), [1, False]):
        with pytest.raises(InvalidInputError):
            pool.stats(after=bad)  # type: ignore[arg-type]
    for limit in (-1, True, 1.5):
        with pytest.raises(InvalidInputError):
            pool.stats(limit=limit)  # type: ignore[arg-type]


def test_info_counts_each_blob_a_published_archive_needs_once(pool: ArchiveManager) -> None:
    """``unique_bytes`` (a probe of the first published archive per blob) against the rows."""
    _fill(pool)
    # Reference saves share the chunks of a0-y.
    pool.save("ref-1", None, rollout_id=9, reference=pool.open_archive("a0-y"))
    pool.save("ref-2", None, rollout_id=9, reference="a0-y")
    pool.open_archive("a3-X").release()
    with pool.catalog.read() as conn:
        published = {
            r.id for r in conn.execute(text("SELECT id FROM archives WHERE state = 'published'"))
        }
        sizes = {r.digest: r.size for r in conn.execute(text("SELECT digest, size FROM blobs"))}
        needed = {
            r.digest
            for r in conn.execute(text("SELECT archive_id, digest FROM archive_blobs"))
            if r.archive_id in published
        }
    info = pool.info()
    assert info.unique_bytes == sum(sizes[d] for d in needed) > 0
    assert info.logical_bytes > info.unique_bytes and info.dedup_ratio > 1.0


_FILTERS: list[dict[str, Any]] = [
    {},
    {"status": "truncated"},
    {"status": ["aborted"]},
    {"min_reward": 0.5},
    {"max_reward": 0.2, "status": "completed"},
    {"min_length": 90},
    {"min_rollout_id": 1, "max_rollout_id": 2},
    {"evaluation": True},
    {"task_key": "t1", "min_reward": 0.0},
    {"state": None, "status": "aborted"},
    {"min_reward": 5.0},
]


def test_query_with_a_limit_is_the_head_of_the_full_answer(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(pool, seed=1)
    # Listing pages of 2, then 4 archives: the walk crosses pages in this small pool.
    monkeypatch.setattr(query_module, "_FIRST_PAGE", 2)
    monkeypatch.setattr(query_module, "_LAST_PAGE", 4)
    for filters in _FILTERS:
        every = pool.query(**filters)
        for limit in (0, 1, 7, 100):
            assert pool.query(**filters, limit=limit) == every[:limit], (filters, limit)


def _statements(pool: ArchiveManager, call: Any) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, params: Any, *args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append((statement, params))

    event.listen(pool.catalog.engine, "before_cursor_execute", record)
    try:
        call()
    finally:
        event.remove(pool.catalog.engine, "before_cursor_execute", record)
    return seen


def test_query_plans_use_indexes_and_never_sort_the_pool(tmp_path: Path) -> None:
    """The statements a limited query and a page of find run, planned by SQLite: archives
    through the (state, rollout_id, name) index, samples by primary key, no sort of the whole
    pool (the benchmark prints the same plans at 10M entries, and PostgreSQL's)."""
    with ArchiveManager.open(tmp_path / "pool") as pool:
        _fill(pool)
        calls = [
            lambda: pool.query(status="truncated", limit=100),
            lambda: pool.query(min_reward=0.5, max_length=50, evaluation=False, limit=100),
            lambda: pool.query(min_rollout_id=1, max_rollout_id=2, limit=100),
            lambda: pool.query(task_key="t1", limit=100),
            lambda: pool.find(limit=2, after="a1-X"),
        ]
        statements = [s for call in calls for s in _statements(pool, call)]
        db = tmp_path / "pool" / "catalog.db"
    plans = []
    with sqlite3.connect(db) as con:
        for statement, params in statements:
            plan = [row[3] for row in con.execute("EXPLAIN QUERY PLAN " + statement, params)]
            plans.append(plan)
            text = " | ".join(plan)
            assert "TEMP B-TREE" not in text, (statement, text)
            for table in ("archives", "entries", "sample_metadata"):
                assert f"SCAN {table}" not in text, (statement, text)
    used = " | ".join(" | ".join(p) for p in plans)
    assert "ix_archives_state_rollout_id_name" in used
    # By primary key: since revision 0006 the table's own b-tree (WITHOUT ROWID).
    assert "SEARCH sample_metadata USING PRIMARY KEY (archive_id=? AND position=?)" in used


def test_cli_ls_and_the_viewer_page(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        _fill(pool)
        every = [i.name for i in pool.find()]
        # The viewer's pool page: the JSON names where the next page starts, the page's
        # "next" link starts after its last archive.
        client = create_app(pool).test_client()
        seen: list[str] = []
        url = "/?format=json&per_page=3&state=published"
        for _ in range(5):
            data = client.get(url).get_json()
            seen += [a["name"] for a in data["archives"]]
            if data["next_after"] is None:
                break
            url = f"/?format=json&per_page=3&state=published&after={data['next_after']}"
        assert seen == every
        page = client.get("/?per_page=3&state=published").get_data(as_text=True)
        assert f"after={every[2]}" in page
        assert client.get("/?after=nope").status_code == 404
    runner = CliRunner()
    first = runner.invoke(cli, ["--root", str(root), "ls", "--limit", "2", "--json"])
    assert first.exit_code == 0, first.output
    names = [row["name"] for row in json.loads(first.output)]
    assert names == every[:2]
    second = runner.invoke(
        cli, ["--root", str(root), "ls", "--limit", "2", "--after", names[-1], "--json"]
    )
    assert [row["name"] for row in json.loads(second.output)] == every[2:4]
    bad = runner.invoke(cli, ["--root", str(root), "ls", "--after", "nope"])
    assert bad.exit_code != 0 and "Traceback" not in bad.output
    assert "not found" in bad.output


def test_find_by_task_key_reads_the_task_key_index(tmp_path: Path) -> None:
    """``find(task_key=)`` finds the archives holding a key from the (task_key, archive_id)
    index, on SQLite's WITHOUT ROWID entries too (revision 0006): as a correlated EXISTS the
    planner probed every archive's entries by primary key instead (3 s at 10,000 archives)."""
    with ArchiveManager.open(tmp_path / "pool") as pool:
        for i in range(3):
            pool.save(f"a{i}", [{"reward": 1.0}] * 4, rollout_id=i, task_keys=[f"k{i}"] * 4)
        statements: list[tuple[str, Any]] = []

        def record(conn: Any, cursor: Any, statement: str, params: Any, *rest: Any) -> None:
            if "FROM entries" in statement:
                statements.append((statement, params))

        event.listen(pool.catalog.engine, "before_cursor_execute", record)
        try:
            assert [i.name for i in pool.find(task_key="k1")] == ["a1"]
        finally:
            event.remove(pool.catalog.engine, "before_cursor_execute", record)
    assert statements
    with sqlite3.connect(tmp_path / "pool" / "catalog.db") as db:
        for statement, params in statements:
            plan = " ".join(row[3] for row in db.execute("EXPLAIN QUERY PLAN " + statement, params))
            assert "ix_entries_task_key_archive_id (task_key=?)" in plan, plan
            assert "CORRELATED" not in plan, plan
