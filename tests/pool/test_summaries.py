"""Per-archive summaries (archive_manager/pool/summary.py): stored at save, by the upgrade and by a
catalog rebuild, and equal to the sample-level computation they replace."""

from __future__ import annotations

import contextlib
import json
import math
import random
import sqlite3
import tarfile
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect, select, text

from archive_manager import ArchiveManager, Sample
from archive_manager.catalog import (
    archive_summaries_table,
    archives_table,
    current_revision,
    head_revision,
)
from archive_manager.catalog.dialects.base import compact_json
from archive_manager.lens.stats import (
    COUNTED_STATES,
    RolloutStats,
    archive_filters,
    archive_summary,
    build_stats,
    sample_rows,
    summarize_samples,
)
from archive_manager.pool.summary import (
    SKETCH_POINTS,
    merge_quantile,
    nearest_rank,
    quantile_rank_error,
    read_summaries,
    sketch_of,
    summarize_archive,
)

DATA = Path(__file__).resolve().parents[1] / "data"


# --------------------------------------------------------------------------- pure functions


def test_sketch_of_few_values_is_every_value_and_merges_exactly() -> None:
    rng = random.Random(3)
    parts = [sorted(rng.random() for _ in range(rng.randint(1, SKETCH_POINTS))) for _ in range(5)]
    merged = sorted(v for part in parts for v in part)
    sketches = [(sketch_of(p), len(p)) for p in parts]
    for q in (0.0, 0.1, 0.5, 0.9, 1.0):
        assert merge_quantile(sketches, q) == nearest_rank(merged, q)
    assert merge_quantile([], 0.5) is None


def _rank_range(ordered: list[float], value: float) -> tuple[int, int]:
    """The 1-based ranks ``value`` occupies in ``ordered``."""
    below = sum(1 for v in ordered if v < value)
    return below + 1, below + ordered.count(value)


@pytest.mark.parametrize("seed", range(6))
def test_merged_quantiles_stay_within_the_rank_bound(seed: int) -> None:
    rng = random.Random(seed)
    parts = []
    for _ in range(rng.randint(2, 6)):
        n = rng.randint(1, 1500)
        shift = rng.random() * 3
        # Ties too: rewards are often 0 or 1.
        parts.append(sorted(rng.choice([0.0, 1.0, shift + rng.random()]) for _ in range(n)))
    merged = sorted(v for part in parts for v in part)
    sketches = [(sketch_of(p), len(p)) for p in parts]
    bound = quantile_rank_error(len(p) for p in parts)
    for q in (0.5, 0.9, 0.01, 0.99):
        value = merge_quantile(sketches, q)
        assert value in merged
        target = min(len(merged), max(1, math.ceil(q * len(merged))))
        low, high = _rank_range(merged, value)  # type: ignore[arg-type]
        assert low - bound <= target <= high + bound, (q, low, high, target, bound)


def test_summarize_archive_counts_statuses_groups_and_figures() -> None:
    rows = [
        ("completed", 1.0, 10, "a"),
        ("completed", 0.0, 30, "a"),
        ("truncated", 1.0, 20, "b"),
        ("truncated", 1.0, None, "b"),
        (None, None, 5, None),
    ]
    s = summarize_archive(rows)
    assert (s.samples, s.rewarded, s.measured) == (5, 4, 4)
    assert s.status == (("completed", 2), ("truncated", 2), ("none", 1))
    assert (s.reward_mean, s.reward_p50, s.reward_p90) == (0.75, 1.0, 1.0)
    assert (s.length_min, s.length_max, s.length_mean, s.length_p50) == (5.0, 30.0, 16.25, 10.0)
    # Group "a" has rewards 1 and 0, group "b" two equal rewards.
    assert (s.groups, s.zero_variance_groups, s.group_stds) == (2, 1, 2)
    assert s.group_std_mean == pytest.approx(math.sqrt(0.5) / 2)


# --------------------------------------------------------------------------- against a pool


def _samples(rng: random.Random, n: int, tag: str) -> list[Sample]:
    statuses = list(Sample.Status)
    out = []
    for i in range(n):
        reward = rng.choice([None, 0.0, 1.0, round(rng.uniform(-2, 2), 3)])
        # Any: response_length may be None, as a framework's sample may hold it.
        length: Any = rng.choice([None, rng.randint(0, 5000)])
        sample = Sample(
            index=i,
            response="r",
            response_length=length,
            reward=reward,
            status=rng.choice(statuses),
        )
        sample.task_key = f"{tag}-{i // 4}"  # type: ignore[attr-defined]
        out.append(sample)
    return out


def _random_pool(pool: ArchiveManager, seed: int) -> None:
    """Rollouts of one archive and of several (one past `SKETCH_POINTS` samples), an
    evaluation archive, a reference save, a released archive and one without a rollout id."""
    rng = random.Random(seed)
    for rollout_id in range(3):
        for k in range(rng.randint(1, 3)):
            n = rng.choice([5, 40, SKETCH_POINTS + 70])
            pool.save(
                f"r{rollout_id}-{k}", _samples(rng, n, f"{rollout_id}{k}"), rollout_id=rollout_id
            )
    pool.save("eval", _samples(rng, 30, "e"), rollout_id=0, evaluation=True)
    pool.save("ref", None, rollout_id=1, reference="r1-0")
    pool.save("gone", _samples(rng, 25, "g"), rollout_id=2)
    pool.open_archive("gone").release()
    pool.save("loose", _samples(rng, 12, "l"), rollout_id=None)


def _reference_stats(pool: ArchiveManager) -> list[RolloutStats]:
    """The sample-level computation the summaries replace (every sample's row read)."""
    a = archives_table
    query = select(
        a.c.id, a.c.manifest_digest, a.c.rollout_id, a.c.evaluation, a.c.state, a.c.bytes
    ).where(*archive_filters(None, None))
    with pool.catalog.read() as conn:
        archives = conn.execute(query).all()
        rows = sample_rows(conn, [r[0] for r in archives])
    return build_stats(archives, *rows)


_EXACT = ("rollout_id", "evaluation", "archives", "released", "samples", "bytes", "rewarded")


def _assert_matches(stored: list[RolloutStats], reference: list[RolloutStats], pool: Any) -> None:
    assert len(stored) == len(reference)
    for got, want in zip(stored, reference, strict=True):
        for name in _EXACT:
            assert getattr(got, name) == getattr(want, name), name
        assert sorted(got.status) == sorted(want.status)
        assert (got.groups, got.zero_variance_groups) == (want.groups, want.zero_variance_groups)
        for name in ("reward_mean", "length_mean", "group_std_mean"):
            assert getattr(got, name) == pytest.approx(getattr(want, name), rel=1e-9), name
        if got.archives == 1:
            for name in ("reward_p50", "reward_p90", "length_p90"):
                assert getattr(got, name) == getattr(want, name), name
            continue
        # Several archives: the merged sketches' quantile, within the documented rank bound.
        a = archives_table
        same_rollout = (
            a.c.rollout_id.is_(None) if got.rollout_id is None else a.c.rollout_id == got.rollout_id
        )
        with pool.catalog.read() as conn:
            ids = list(
                conn.execute(
                    select(a.c.id).where(
                        same_rollout,
                        a.c.evaluation == got.evaluation,
                        a.c.state.in_(COUNTED_STATES),
                    )
                ).scalars()
            )
            _, values, _ = sample_rows(conn, ids)
        for column, field, count in ((1, "reward", got.rewarded), (2, "length", None)):
            ordered = sorted(float(v[column]) for v in values if v[column] is not None)
            per_archive: dict[int, int] = {}
            for v in values:
                if v[column] is not None:
                    per_archive[v[0]] = per_archive.get(v[0], 0) + 1
            assert count is None or count == len(ordered)
            bound = quantile_rank_error(per_archive.values())
            for q, name in ((0.5, f"{field}_p50"), (0.9, f"{field}_p90")):
                if not hasattr(got, name):
                    continue
                value = getattr(got, name)
                assert value in ordered
                target = max(1, math.ceil(q * len(ordered)))
                low, high = _rank_range(ordered, value)
                assert low - bound <= target <= high + bound


@pytest.mark.parametrize("seed", [0])
def test_stored_summaries_equal_the_sample_level_computation(
    pool: ArchiveManager, seed: int
) -> None:
    _random_pool(pool, seed)
    _assert_matches(pool.stats(), _reference_stats(pool), pool)
    # Each archive's own figures (show, the viewer's archive page) are exact.
    for info in pool.find(state=None):
        with pool.catalog.read() as conn:
            _, values, groups = sample_rows(conn, [_id(pool, info.name)])
            status, _, _ = sample_rows(conn, [_id(pool, info.name)])
        want = summarize_samples([r[1:] for r in status], [r[1:] for r in values], groups)
        got = archive_summary(pool.context, info.name)
        assert got.overview()["status"] == want.overview()["status"]
        for name in ("reward_p50", "reward_p90", "reward_min", "reward_max", "length_p50"):
            assert getattr(got, name) == getattr(want, name), (info.name, name)
        assert got.reward_mean == pytest.approx(want.reward_mean, rel=1e-9)


def _id(pool: ArchiveManager, name: str) -> int:
    with pool.catalog.read() as conn:
        return int(
            conn.execute(
                select(archives_table.c.id).where(archives_table.c.name == name)
            ).scalar_one()
        )


def _summaries_by_name(pool: ArchiveManager) -> dict[str, Any]:
    with pool.catalog.read() as conn:
        ids = dict(conn.execute(select(archives_table.c.name, archives_table.c.id)).all())
        stored = read_summaries(conn, list(ids.values()), sketches=True)
    return {name: stored.get(archive_id) for name, archive_id in ids.items()}


def test_a_rebuilt_catalog_has_the_same_summaries(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        _random_pool(pool, 2)
        before = _summaries_by_name(pool)
    assert all(before.values())
    for path in root.glob("catalog.db*"):
        path.unlink()
    with ArchiveManager.open(root, recover=True) as pool:
        pool.rebuild_catalog()
        assert _summaries_by_name(pool) == before


def test_a_pool_of_revision_0004_gets_its_summaries_on_upgrade(tmp_path: Path) -> None:
    """tests/data/pool-r4.tar.gz was written by the release at revision 0004: several archives
    per rollout id, a reference save, a released archive, missing rewards."""
    with tarfile.open(DATA / "pool-r4.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / "pool-r4"
    with ArchiveManager.open(root) as pool:
        assert current_revision(pool.catalog.engine) == head_revision()
        with pool.catalog.read() as conn:
            count = conn.execute(select(archive_summaries_table.c.archive_id)).all()
        assert len(count) == len(pool.find(state=None)) == 7
        indexes = {ix["name"] for ix in inspect(pool.catalog.engine).get_indexes("archives")}
        assert "ix_archives_state_rollout_id_name" in indexes
        _assert_matches(pool.stats(), _reference_stats(pool), pool)
        upgraded = _summaries_by_name(pool)
        # The upgrade computed what a save computes now.
        pool.save("again", None, rollout_id=9, reference="r2")
        assert _summaries_by_name(pool)["again"] == upgraded["r2"]


def _sample_tables(path: Path) -> dict[str, Any]:
    """Every row of ``entries`` and ``sample_metadata``, their indexes and their DDL, read
    with the sqlite3 module (no archive_manager code, so no upgrade)."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        out: dict[str, Any] = {}
        for table in ("entries", "sample_metadata"):
            out[table] = db.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
            # The b-trees stored for the table's indexes (a WITHOUT ROWID table's primary
            # key is the table's own b-tree, not one of these).
            out[f"{table} indexes"] = sorted(
                row[0]
                for row in db.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?",
                    (table,),
                )
            )
            out[f"{table} sql"] = db.execute(
                "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
            ).fetchone()[0]
    return out


def test_a_pool_of_revision_0005_keeps_its_samples_without_rowids(tmp_path: Path) -> None:
    """tests/data/pool-r5.tar.gz was written by the release at revision 0005 (the pool of
    `_random_pool`, seed 5).  Revision 0006 copies ``entries`` and ``sample_metadata`` into
    WITHOUT ROWID tables: every row, index and figure the same, the automatic primary-key
    indexes gone."""
    with tarfile.open(DATA / "pool-r5.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / "pool-r5"
    before = _sample_tables(root / "catalog.db")
    assert "WITHOUT ROWID" not in before["entries sql"]
    assert "sqlite_autoindex_entries_1" in before["entries indexes"]
    assert len(before["entries"]) == len(before["sample_metadata"]) == 994
    # The same pool made by this library: the upgraded one must read as it does.
    with ArchiveManager.open(tmp_path / "now") as now:
        _random_pool(now, 5)
        loaded = {i.name: now.open_archive(i.name).load_samples() for i in now.find()}
        stats = now.stats()
    # rebind: the tarball is a copy of the pool it was made as.
    with ArchiveManager.open(root, rebind=True) as pool:
        assert current_revision(pool.catalog.engine) == head_revision()
        assert sorted(i.name for i in pool.find()) == sorted(loaded)
        _assert_matches(pool.stats(), _reference_stats(pool), pool)
        assert [(r.rollout_id, r.samples, r.status) for r in pool.stats()] == [
            (r.rollout_id, r.samples, r.status) for r in stats
        ]
        for name, samples in loaded.items():
            assert pool.open_archive(name).load_samples() == samples, name
        assert pool.verify().ok
        pool.save("after", _samples(random.Random(6), 9, "a"), rollout_id=7, task_keys=["t"] * 9)
        assert [r.position for r in pool.query(task_key="t", limit=100)] == list(range(9))
    after = _sample_tables(root / "catalog.db")
    for table in ("entries", "sample_metadata"):
        assert "WITHOUT ROWID" in after[f"{table} sql"]
        assert after[f"{table} indexes"] == [
            i for i in before[f"{table} indexes"] if not i.startswith("sqlite_autoindex_")
        ]
        assert after[table][: len(before[table])] == before[table]
        assert len(after[table]) == len(before[table]) + 9


def test_json_columns_are_stored_without_blanks(pool: ArchiveManager) -> None:
    """Each sample's description (and every JSON column) is stored as compact JSON text: a
    tenth of a sample's catalog row less (docs/architecture/summaries-and-paging.md, "Summaries and
    paging")."""
    # 600 samples go to PostgreSQL through COPY, 5 through one INSERT: both serialize.
    pool.save(
        "many",
        [Sample(index=i, reward=i / 600, status=Sample.Status.COMPLETED) for i in range(600)],
        rollout_id=1,
    )
    pool.save(
        "few", [Sample(index=i, reward=0.5) for i in range(5)], rollout_id=2, attrs={"a": [1, 2]}
    )
    with pool.catalog.read() as conn:
        texts = [
            str(raw)
            for query in (
                "SELECT CAST(description AS TEXT) FROM sample_metadata",
                "SELECT CAST(attrs AS TEXT) FROM archives WHERE attrs IS NOT NULL",
                "SELECT CAST(status AS TEXT) FROM archive_summaries",
            )
            for raw in conn.execute(text(query)).scalars()
        ]
    assert len(texts) >= 605 + 1 + 2  # (attrs of None may be stored as JSON null)
    for raw in texts:
        assert raw == compact_json(json.loads(raw)), raw
    assert json.loads(texts[0])["index"] == 0 and '"index":0,' in texts[0]
