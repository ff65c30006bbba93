"""Training-drift statistics: the pure arithmetic on hand-made rows, `pool.stats` against a
brute-force computation from every sample's metadata (on SQLite and PostgreSQL), its cache,
and the ``stats`` CLI verb with its table, JSON and plot."""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import die_before_publish, tiny_rollout
from hypothesis import example, given, settings
from hypothesis import strategies as st

from archive_manager import ArchiveManager
from archive_manager.cli import cli
from archive_manager.cli._plot import plot_stats
from archive_manager.errors import InvalidInputError, MissingDependencyError
from archive_manager.lens.stats import (
    RolloutStats,
    SampleSummary,
    archive_summary,
    build_stats,
    check_rollout_range,
    nearest_rank,
    summarize_samples,
)

# --------------------------------------------------------------------------- pure functions


def test_nearest_rank_is_a_value_that_occurs() -> None:
    assert nearest_rank([], 0.5) is None
    assert nearest_rank([7.0], 0.9) == 7.0
    values = [float(v) for v in range(1, 11)]
    assert nearest_rank(values, 0.5) == 5.0  # at least half the values are <= 5
    assert nearest_rank(values, 0.9) == 9.0
    assert nearest_rank(values, 0.91) == 10.0
    assert nearest_rank([0.0, 1.0], 0.5) == 0.0


def test_summarize_samples_adds_statuses_and_ignores_missing_values() -> None:
    status_rows = [
        ("completed", 3, 2, 1.5, 3, 30),
        ("truncated", 2, 2, 0.0, 2, 40),
        (None, 1, 0, None, 0, None),
        ("completed", 1, 1, 1.0, 1, 10),  # a second archive of the same group
    ]
    value_rows = [(1.0, 10), (0.5, 10), (None, 10), (0.0, 20), (0.0, 20), (None, None), (1.0, 10)]
    summary = summarize_samples(status_rows, value_rows)
    assert summary.status == (("completed", 4), ("truncated", 2), ("none", 1))
    assert summary.samples == 7
    assert summary.rewarded == 5
    assert summary.reward_mean == pytest.approx(2.5 / 5)
    assert summary.reward_p50 == 0.5 and summary.reward_p90 == 1.0
    assert summary.length_mean == pytest.approx(80 / 6)
    assert summary.length_p90 == 20.0


def test_summarize_samples_of_nothing() -> None:
    summary = summarize_samples([], [])
    assert summary == SampleSummary((), 0, None, None, None, None, None)


def test_build_stats_groups_orders_and_marks_released_archives() -> None:
    archive_rows = [
        (1, "m1", 5, False, "published", 100),
        (2, "m2", 5, False, "released", 50),
        (3, "m3", 5, True, "published", 10),
        (4, "m4", None, False, "published", 7),
        (5, "m5", 2, False, "published", 1),
    ]
    status_rows = [
        (1, "completed", 2, 2, 2.0, 2, 20),
        (2, "truncated", 1, 1, 0.0, 1, 64),
        (3, "completed", 1, 1, 1.0, 1, 5),
        (4, "completed", 1, 0, None, 1, 3),
        (5, "failed", 1, 0, None, 0, None),
        (99, "completed", 50, 50, 50.0, 50, 50),  # no such archive: ignored
    ]
    value_rows = [(1, 1.0, 10), (1, 1.0, 10), (2, 0.0, 64), (3, 1.0, 5), (4, None, 3)]
    rows = build_stats(archive_rows, status_rows, value_rows)
    assert [(r.rollout_id, r.evaluation) for r in rows] == [
        (2, False),
        (5, False),
        (5, True),
        (None, False),
    ]
    five = rows[1]
    assert (five.archives, five.released, five.samples, five.bytes) == (2, 1, 3, 150)
    assert five.truncated_share == pytest.approx(1 / 3)
    assert five.status_shares == pytest.approx({"completed": 2 / 3, "truncated": 1 / 3})
    assert five.reward_mean == pytest.approx(2 / 3)
    assert five.length_p90 == 64.0
    assert rows[0].reward_mean is None and rows[0].length_mean is None
    assert rows[3].rewarded == 0 and rows[3].reward_p50 is None
    as_dict = five.as_dict()
    assert json.loads(json.dumps(as_dict)) == as_dict
    assert as_dict["status"] == {"completed": 2, "truncated": 1}


def test_rollout_stats_of_no_sample_has_no_shares() -> None:
    row = RolloutStats(1, False, 1, 0, 0, 0, 0, None, None, None, None, None, ())
    assert row.truncated_share is None and row.status_shares == {}


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, None),
        (3, (3, 3)),
        (range(2, 5), (2, 4)),
        ((None, 7), (None, 7)),
        ((1, None), (1, None)),
        ((4, 4), (4, 4)),
    ],
)
def test_check_rollout_range_accepts(given: object, expected: object) -> None:
    assert check_rollout_range(given) == expected


@pytest.mark.parametrize(
    "given",
    [
        *(True, range(5, 5), range(0, 10, 2), (5, 1), (1.5, 2), "1..2", [1, 2], (1, 2, 3)),
        *(2**63, -(2**63) - 1, (0, 2**70), (-(2**70), None), range(2**63, 2**63 + 1)),
    ],
)
def test_check_rollout_range_refuses(given: object) -> None:
    with pytest.raises(InvalidInputError):
        check_rollout_range(given)


# --------------------------------------------------------------------------- on a pool


def _expected(pool: ArchiveManager, names: list[str]) -> dict[tuple[Any, bool], dict[str, Any]]:
    """The statistics computed the slow way: every sample's catalog metadata."""
    groups: dict[tuple[Any, bool], dict[str, Any]] = {}
    for name in names:
        arc = pool.open_archive(name)
        info = arc.info()
        g = groups.setdefault(
            (info.rollout_id, info.evaluation),
            {"archives": 0, "released": 0, "bytes": 0, "meta": []},
        )
        g["archives"] += 1
        g["released"] += info.state == "released"
        g["bytes"] += info.bytes
        g["meta"] += arc.sample_metadata()
    return groups


def _check(row: RolloutStats, expected: dict[str, Any]) -> None:
    meta = expected["meta"]
    rewards = sorted(float(d["reward"]) for d in meta if d.get("reward") is not None)
    lengths = sorted(float(d["response_length"]) for d in meta)
    statuses = Counter(d["status"] for d in meta)
    assert row.archives == expected["archives"]
    assert row.released == expected["released"]
    assert row.bytes == expected["bytes"]
    assert row.samples == len(meta)
    assert dict(row.status) == dict(statuses)
    assert row.rewarded == len(rewards)
    if rewards:
        assert row.reward_mean == pytest.approx(statistics.fmean(rewards))
        assert row.reward_p50 == rewards[math.ceil(0.5 * len(rewards)) - 1]
        assert row.reward_p90 == rewards[math.ceil(0.9 * len(rewards)) - 1]
    else:
        assert row.reward_mean is None and row.reward_p50 is None
    assert row.length_mean == pytest.approx(statistics.fmean(lengths))
    assert row.length_p90 == lengths[math.ceil(0.9 * len(lengths)) - 1]
    assert row.truncated_share == pytest.approx(statuses["truncated"] / len(meta))


def _fill(pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Archives of every kind that counts, and two that must not."""
    names = []
    for rid in (1, 2, 3):
        pool.save(f"train-{rid}", tiny_rollout(9, seed=rid, rollout_id=rid), rollout_id=rid)
        names.append(f"train-{rid}")
    pool.save("eval-2", tiny_rollout(5, seed=20, rollout_id=2), rollout_id=2, evaluation=True)
    # A second archive of rollout 2 (training) joins its group.
    pool.save("train-2b", tiny_rollout(4, seed=21, rollout_id=2), rollout_id=2)
    # Rewards that are no number (a dict of named rewards) do not count as rewarded.
    named = tiny_rollout(3, seed=30, rollout_id=3, as_dict=True)
    for sample in named:
        sample["reward"] = {"accuracy": 1.0, "format": 0.5}
    pool.save("named-3", named, rollout_id=3)
    pool.save("no-rollout", tiny_rollout(2, seed=40), rollout_id=None)
    pool.save("released-1", tiny_rollout(3, seed=50, rollout_id=1), rollout_id=1)
    pool.open_archive("released-1").release()
    names += ["eval-2", "train-2b", "named-3", "no-rollout", "released-1"]
    # A pending save (killed before it published) never counts.
    die_before_publish(pool, "pending-1", tiny_rollout(7, seed=60), monkeypatch)
    return names


def test_pool_stats_match_every_sample_metadata(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = _fill(pool, monkeypatch)
    expected = _expected(pool, names)
    # The statistics come from the catalog alone: no blob may be read.
    for method in ("get", "get_view", "open"):
        monkeypatch.setattr(pool.store, method, _no_blob_reads)
    rows = pool.stats()
    assert [(r.rollout_id, r.evaluation) for r in rows] == [
        (1, False),
        (2, False),
        (2, True),
        (3, False),
        (None, False),
    ]
    for row in rows:
        _check(row, expected[row.rollout_id, row.evaluation])
    by_key = {(r.rollout_id, r.evaluation): r for r in rows}
    assert by_key[1, False].released == 1 and by_key[1, False].archives == 2
    assert by_key[2, False].archives == 2
    assert by_key[3, False].rewarded == 9  # named-3's three dict rewards are not numbers


def _no_blob_reads(*args: object, **kwargs: object) -> Any:
    raise AssertionError("statistics must not read a blob")


def test_pool_stats_filters(pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch) -> None:
    _fill(pool, monkeypatch)

    def keys(rows: list[RolloutStats]) -> list[tuple[Any, bool]]:
        return [(r.rollout_id, r.evaluation) for r in rows]

    assert keys(pool.stats(range(2, 4))) == [(2, False), (2, True), (3, False)]
    assert keys(pool.stats((None, 1))) == [(1, False)]
    assert keys(pool.stats(2, evaluation=True)) == [(2, True)]
    assert keys(pool.stats(evaluation=False)) == [(1, False), (2, False), (3, False), (None, False)]
    assert pool.stats((10, None)) == []
    with pytest.raises(InvalidInputError):
        pool.stats(evaluation="yes")  # type: ignore[arg-type]


def test_stats_cache_follows_new_and_released_archives(pool: ArchiveManager) -> None:
    pool.save("a", tiny_rollout(6, seed=1, rollout_id=1), rollout_id=1)
    first = pool.stats()
    assert pool.stats() == first  # served from the cache, same answer
    pool.save("b", tiny_rollout(4, seed=2, rollout_id=1), rollout_id=1)
    (both,) = pool.stats()
    assert both.samples == 10 and both.archives == 2
    _check(both, _expected(pool, ["a", "b"])[1, False])
    pool.open_archive("a").release()
    (after,) = pool.stats()
    assert after.released == 1 and after.samples == 10
    # A fresh pool object (no cache) agrees with the cached one.
    with ArchiveManager.open(pool.root, catalog_url=pool.catalog_url) as fresh:
        assert fresh.stats() == pool.stats()


def test_archive_summary(pool: ArchiveManager) -> None:
    samples = tiny_rollout(10, seed=3, rollout_id=4)
    pool.save("one", samples, rollout_id=4)
    summary = archive_summary(pool.context, "one")
    (row,) = pool.stats()
    assert summary.status == row.status and summary.reward_p90 == row.reward_p90
    with pytest.raises(LookupError):
        archive_summary(pool.context, "missing")


# --------------------------------------------------------------------------- plots and CLI


def test_plot_stats_writes_an_image(tmp_path: Path) -> None:
    with ArchiveManager.open(tmp_path / "pool") as pool:
        for rid in range(4):
            pool.save(f"r{rid}", tiny_rollout(6, seed=rid, rollout_id=rid), rollout_id=rid)
        pool.save("e", tiny_rollout(6, seed=9, rollout_id=2), rollout_id=2, evaluation=True)
        rows = pool.stats()
    out = plot_stats(rows, tmp_path / "figs" / "drift.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = plot_stats(rows, tmp_path / "drift.svg").read_text()
    assert "reward by rollout" in svg and "response length by rollout" in svg
    with pytest.raises(InvalidInputError, match="no rollout with a rollout id"):
        plot_stats([r for r in rows if r.rollout_id is None], tmp_path / "x.png")
    with pytest.raises(InvalidInputError, match=r"\.png"):
        plot_stats(rows, tmp_path / "drift.docx")


def _cli_pool(tmp_path: Path) -> Path:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        for rid in (1, 2, 3):
            pool.save(f"r{rid}", tiny_rollout(8, seed=rid, rollout_id=rid), rollout_id=rid)
        pool.save("e2", tiny_rollout(4, seed=7, rollout_id=2), rollout_id=2, evaluation=True)
        pool.open_archive("r1").release()
    return root


def _run(root: Path, *args: str) -> Any:
    return CliRunner().invoke(cli, ["--root", str(root), "stats", *args])


def test_cli_stats_table_and_json(tmp_path: Path) -> None:
    root = _cli_pool(tmp_path)
    result = _run(root)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[:4] == ["ROLLOUT", "EVAL", "ARCHIVES", "SAMPLES"]
    assert len(lines) == 5
    assert "1 (1 released)" in lines[1]
    with ArchiveManager.open(root) as pool:
        expected = [r.as_dict() for r in pool.stats()]
        filtered = [r.as_dict() for r in pool.stats((2, 3), evaluation=False)]
    as_json = _run(root, "--json")
    assert as_json.exit_code == 0 and json.loads(as_json.stdout) == expected
    narrow = _run(root, "--rollout-id", "2..3", "--no-evaluation", "--json")
    assert json.loads(narrow.stdout) == filtered
    assert _run(root, "--rollout-id", "7").stdout.strip() == "no archives match"
    bad = _run(root, "--rollout-id", "3..1")
    assert bad.exit_code == 2 and "empty" in bad.output


def test_cli_stats_plot(tmp_path: Path) -> None:
    root = _cli_pool(tmp_path)
    out = tmp_path / "plots" / "drift.png"
    result = _run(root, "--plot", str(out))
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.stdout
    assert out.read_bytes()[:4] == b"\x89PNG"
    # With --json, stdout stays one JSON document.
    result = _run(root, "--json", "--plot", str(tmp_path / "b.svg"))
    assert result.exit_code == 0 and isinstance(json.loads(result.stdout), list)
    wrong = _run(root, "--plot", str(tmp_path / "drift.txt"))
    assert wrong.exit_code == 1 and wrong.stdout == ""
    assert wrong.stderr.startswith("error: cannot plot to 'drift.txt'")


def test_cli_stats_plot_without_matplotlib_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _cli_pool(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import now fails
    result = _run(root, "--plot", str(tmp_path / "x.png"))
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.strip() == (
        "error: plotting needs matplotlib, which is not installed; install the 'plot' extra: "
        "pip install -e '.[plot]' in a checkout of archive_manager (or pip install "
        "'rollout-archive-manager[plot]' where that distribution is installed)"
    )
    assert not (tmp_path / "x.png").exists()
    with pytest.raises(MissingDependencyError), ArchiveManager.open(root) as pool:
        plot_stats(pool.stats(), tmp_path / "y.png")


def test_rollout_ids_beyond_64_bits_are_refused_everywhere(tmp_path: Path) -> None:
    root = _cli_pool(tmp_path)
    with ArchiveManager.open(root) as pool, pytest.raises(InvalidInputError, match="64-bit"):
        pool.stats(2**70)
    result = _run(root, "--rollout-id", str(2**70))
    assert result.exit_code != 0
    assert "Traceback" not in result.output and "64-bit" in result.output


def test_rewards_near_the_float_limit_give_a_finite_mean(pool: ArchiveManager) -> None:
    """Their SQL sum overflows (PostgreSQL refuses, SQLite says inf); the mean does not."""
    for name, reward in (("a", 1.7e308), ("b", 1.7e308), ("c", -1.0e308)):
        samples = tiny_rollout(2, rollout_id=1)
        for sample in samples:
            sample.reward = reward
        pool.save(name, samples, rollout_id=1)
    (row,) = pool.stats()
    assert row.reward_mean is not None and math.isfinite(row.reward_mean)
    assert row.reward_mean == pytest.approx(1.7e308 / 6 * 4 - 1.0e308 / 3)  # 4 + 2 samples
    json.dumps(row.as_dict(), allow_nan=False)


# Claim: stats' per-rollout zero-variance figures come from the same groups `pool.groups`
# shows (groups of an archive with at least two numeric rewards).  Fixed: the samples without
# a task key (one pseudo-group, task_key None) were flagged as a zero-variance group, so
# `groups` counted one more than `stats`.
@settings(max_examples=6, deadline=None)
@example([(0, None, 1.0), (0, None, 1.0), (0, "A", 0.0), (0, "A", 1.0)])
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),  # archive
            st.sampled_from(["A", "B", "C", None]),
            st.sampled_from([0.0, 1.0, 0.5, None]),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_stats_zero_variance_matches_the_groups(rows: list[tuple[int, Any, Any]]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, ArchiveManager.open(Path(tmp) / "pool") as pool:
        names = []
        for a in sorted({r[0] for r in rows}):
            samples = [
                {"response": "r", "reward": reward, "task_key": key}
                for archive, key, reward in rows
                if archive == a
            ]
            pool.save(f"a{a}", samples, rollout_id=a // 2)
            names.append((f"a{a}", a // 2))
        for stat in pool.stats():
            groups = [
                g
                for name, rid in names
                if rid == stat.rollout_id
                for g in pool.groups(name)
                if g.rewarded >= 2 and g.task_key is not None
            ]
            flagged = [
                g for name, rid in names if rid == stat.rollout_id for g in pool.groups(name)
            ]
            assert stat.groups == len(groups)
            assert stat.zero_variance_groups == sum(g.zero_variance for g in flagged)
            assert not any(g.zero_variance for g in flagged if g.task_key is None)
