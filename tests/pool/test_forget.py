"""Retention policies and releases of many archives (issue 18, item 2): `ArchiveManager.forget`
and `ArchiveManager.release` on both backends, then the ``forget``, ``release`` and
``import-pt`` verbs through click's runner and, once each, a real subprocess."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result
from helpers import FakeClock, tiny_rollout

from archive_manager import ArchiveManager, Sample
from archive_manager.cli import cli
from archive_manager.errors import ArchiveNotFoundError, InvalidInputError, ReadOnlyPoolError

HOUR = 3600.0


def _fill(pool: ArchiveManager, clock: FakeClock, ids: range = range(8)) -> None:
    """``rollout-<i>`` for each id, an hour apart; rollout 5 is an evaluation."""
    for i in ids:
        pool.save(
            f"rollout-{i}",
            tiny_rollout(2, seed=i, r3_layers=0),
            rollout_id=i,
            evaluation=i == 5,
        )
        clock.advance(HOUR)


def _kept(plan: object) -> dict[str, list[str]]:
    return {i.name: i.kept_by for i in plan.keep}  # type: ignore[attr-defined]


def _released(plan: object) -> list[str]:
    return [i.name for i in plan.release]  # type: ignore[attr-defined]


def test_forget_rules_scope_and_plan(
    open_pool: Callable[..., ArchiveManager], clock: FakeClock
) -> None:
    pool = open_pool(clock=clock)
    _fill(pool, clock)
    pool.retain("checkpoint:step-2", "rollout-2")

    plan = pool.forget(keep_last=2, keep_every=3, evaluation=False, dry_run=True)
    assert _kept(plan) == {
        "rollout-7": ["keep-last"],
        "rollout-6": ["keep-last", "keep-every"],
        "rollout-3": ["keep-every"],
        "rollout-0": ["keep-every"],
    }
    assert _released(plan) == ["rollout-4", "rollout-2", "rollout-1"]  # newest first
    assert plan.still_retained == {"rollout-2": ["checkpoint:step-2"]}
    # rollout-5 (an evaluation) is out of scope: neither kept nor released.
    assert "rollout-5" not in _kept(plan) and "rollout-5" not in _released(plan)
    assert plan.freed_blobs > 0 and plan.dry_run and plan.released == []
    assert all(i.state == "published" for i in pool.find())  # a dry run changes nothing

    # keep-within counts back from the newest archive in scope, not from now.
    clock.advance(100 * HOUR)
    within = pool.forget(keep_within="1h30m", rollout_ids=(None, 4), dry_run=True)
    assert sorted(_kept(within)) == ["rollout-3", "rollout-4"]
    assert _released(within) == ["rollout-2", "rollout-1", "rollout-0"]
    assert within.policy["keep_within"] == 1.5 * HOUR
    assert pool.forget(keep_within=timedelta(hours=1.5), rollout_ids=range(0, 5), dry_run=True)
    # Scoped by a range: archives outside it are not looked at.
    assert set(_kept(pool.forget(keep_last=1, rollout_ids=(6, None), dry_run=True))) == {
        "rollout-7"
    }

    done = pool.forget(keep_last=2, keep_every=3, evaluation=False)
    assert done.released == ["rollout-4", "rollout-2", "rollout-1"] and not done.dry_run
    states = {i.name: i.state for i in pool.find(state=None)}
    assert [n for n, s in sorted(states.items()) if s == "released"] == _released(done)[::-1]
    # The checkpoint still holds rollout-2's payload: only rollouts 1 and 4 are reclaimable.
    assert pool.payload_reclaimed(["rollout-1", "rollout-2"]) == set()
    assert pool.gc(grace=0).blobs == done.freed_blobs
    assert pool.payload_reclaimed(["rollout-1", "rollout-2", "rollout-4"]) == {
        "rollout-1",
        "rollout-4",
    }
    assert len(pool.open_archive("rollout-2").load_samples()) == 2
    # Applied again, the policy finds nothing more to release.
    again = pool.forget(keep_last=2, keep_every=3, evaluation=False)
    assert again.release == [] and again.released == []


def test_forget_refuses_bad_policies(
    open_pool: Callable[..., ArchiveManager], clock: FakeClock
) -> None:
    pool = open_pool(clock=clock)
    _fill(pool, clock, range(2))
    for bad in (
        {},
        {"keep_last": 0},
        {"keep_last": True},
        {"keep_every": -1},
        {"keep_within": "soon"},
        {"keep_within": -5},
        {"keep_last": 1, "rollout_ids": (3, 1)},
        {"keep_last": 1, "evaluation": "no"},
    ):
        with pytest.raises(InvalidInputError):
            pool.forget(**bad)  # type: ignore[arg-type]
    assert [i.state for i in pool.find(state=None)] == ["published", "published"]


def test_release_many_is_one_transaction(
    open_pool: Callable[..., ArchiveManager], clock: FakeClock
) -> None:
    pool = open_pool(clock=clock)
    _fill(pool, clock, range(3))
    with pytest.raises(ArchiveNotFoundError, match=r"did you mean 'rollout-1'\?"):
        pool.release(["rollout-0", "rollout-01"])
    assert all(i.state == "published" for i in pool.find(state=None))  # nothing released
    with pytest.raises(KeyError, match=r"sample keys look like 'sample:1'"):
        pool.open_archive("rollout-0").load_samples(sample_key="1")
    pool.open_archive("rollout-0").release()
    plan = pool.release(["rollout-0", "rollout-1", "rollout-2", "rollout-1"])
    assert plan.already_released == ["rollout-0"]
    assert plan.released == ["rollout-1", "rollout-2"]
    with pytest.raises(InvalidInputError):
        pool.release("rollout-1")  # type: ignore[arg-type]


def test_query_takes_status_members_and_ranges(
    open_pool: Callable[..., ArchiveManager], clock: FakeClock
) -> None:
    pool = open_pool(clock=clock)
    _fill(pool, clock, range(3))
    by_text = pool.query(status="truncated")
    assert by_text and pool.query(status=Sample.Status.TRUNCATED) == by_text
    both = pool.query(status=[Sample.Status.TRUNCATED, "completed"])
    assert len(both) == len(by_text) + len(pool.query(status="completed"))
    assert {r.rollout_id for r in pool.query(rollout_ids=(1, None))} == {1, 2}
    assert {r.rollout_id for r in pool.query(rollout_ids=range(0, 2), min_rollout_id=1)} == {1}
    assert [i.name for i in pool.find(rollout_id=(None, 1))] == ["rollout-0", "rollout-1"]


def test_gc_reports_what_the_grace_holds_back(
    open_pool: Callable[..., ArchiveManager], clock: FakeClock
) -> None:
    pool = open_pool(clock=clock)
    _fill(pool, clock, range(2))
    pool.open_archive("rollout-1").release()
    plan = pool.gc(grace="1d", dry_run=True)  # the CLI's duration text
    assert plan.blobs == 0 and plan.grace_blobs > 0 and plan.grace_bytes > 0
    assert plan.grace_first is not None and plan.grace_first > clock.now
    calls: list[tuple[int, int]] = []
    done = pool.gc(grace="0", progress=lambda d, t: calls.append((d, t)))
    assert done.blobs == plan.grace_blobs and calls[-1] == (done.bytes, done.bytes)
    calls.clear()
    checked = pool.verify(read_data=True, progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (checked.bytes_read, checked.bytes_read) and checked.bytes_read > 0
    with pytest.raises(InvalidInputError, match="grace"):
        pool.gc(grace="an hour")
    summary = pool.info()
    assert summary.dedup_ratio >= 1.0 and summary.unique_bytes > 0


def test_read_only_pool_refuses_forget(tmp_path: Path, clock: FakeClock) -> None:
    with ArchiveManager.open(tmp_path / "pool", clock=clock) as pool:
        _fill(pool, clock, range(2))
    with ArchiveManager.open(tmp_path / "pool", read_only=True) as reader:
        assert _released(reader.forget(keep_last=1, dry_run=True)) == ["rollout-0"]
        with pytest.raises(ReadOnlyPoolError):
            reader.forget(keep_last=1)


# --------------------------------------------------------------------------- the CLI


@pytest.fixture
def root(tmp_path: Path) -> Path:
    clock = FakeClock()
    path = tmp_path / "pool"
    with ArchiveManager.open(path, clock=clock) as pool:
        _fill(pool, clock, range(6))
        pool.retain("checkpoint:step-2", "rollout-2")
    return path


def _run(root: Path, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, ["--root", str(root), *args], input=input)


def _states(root: Path) -> dict[str, str]:
    with ArchiveManager.open(root, read_only=True) as pool:
        return {i.name: i.state for i in pool.find(state=None)}


def test_cli_forget(root: Path) -> None:
    dry = _run(root, "forget", "--keep-last", "2", "--no-evaluation", "--dry-run")
    assert dry.exit_code == 0, dry.output
    lines = dry.stdout.splitlines()
    assert lines[0] == "keep 2 archive(s), would release 3"
    assert any("rollout-2" in x and "still retained by checkpoint:step-2" in x for x in lines)
    assert "the next gc may reclaim" in dry.stdout
    plan = json.loads(
        _run(root, "forget", "--keep-every", "2", "--rollout-id", "..3", "-n", "--json").stdout
    )
    assert [i["name"] for i in plan["keep"]] == ["rollout-2", "rollout-0"]
    assert [i["name"] for i in plan["release"]] == ["rollout-3", "rollout-1"]
    assert plan["dry_run"] is True and plan["released"] == []

    assert _run(root, "forget", "--no-evaluation").exit_code == 2  # no rule
    assert _run(root, "forget", "--keep-last", "0").exit_code == 2
    assert _run(root, "forget", "--keep-within", "soon").exit_code == 2

    declined = _run(root, "forget", "--keep-last", "2", input="n\n")
    assert declined.exit_code == 1 and "Aborted" in declined.output
    assert "will release 4" in declined.stderr
    # No terminal and no answer: a one-line error that names --yes.
    silent = _run(root, "forget", "--keep-last", "2")
    assert silent.exit_code == 1 and "pass --yes" in silent.stderr
    assert set(_states(root).values()) == {"published"}

    confirmed = _run(root, "forget", "--keep-last", "2", "--no-evaluation", input="y\n")
    assert confirmed.exit_code == 0 and "released 3 archive(s)" in confirmed.stdout
    states = _states(root)
    assert [n for n, s in sorted(states.items()) if s == "released"] == [
        "rollout-0",
        "rollout-1",
        "rollout-2",
    ]
    listing = _run(root, "ls", "--state", "released", "--rollout-id", "2..").stdout
    assert "released, payload kept" in listing and "rollout-1" not in listing


def test_cli_release_many(root: Path) -> None:
    typo = _run(root, "release", "rollout-1", "rollout-04", "--yes")
    assert typo.exit_code == 1
    assert typo.stderr == "error: archive 'rollout-04' not found; did you mean 'rollout-4'?\n"
    assert set(_states(root).values()) == {"published"}
    assert _run(root, "release").exit_code == 2
    dry = json.loads(
        _run(root, "release", "rollout-0", "--rollout-id", "3..", "-n", "--json").stdout
    )
    assert [i["name"] for i in dry["release"]] == [
        "rollout-0",
        "rollout-3",
        "rollout-4",
        "rollout-5",
    ]
    done = _run(root, "release", "rollout-0", "--rollout-id", "3..4", "--yes")
    assert done.exit_code == 0 and "released 3 archive(s)" in done.stdout
    assert [n for n, s in sorted(_states(root).items()) if s == "released"] == [
        "rollout-0",
        "rollout-3",
        "rollout-4",
    ]
    # A retry of a finished range release is no error; a range with no archive is.
    again = _run(root, "release", "--rollout-id", "3..4", "--yes")
    assert again.exit_code == 0 and "already released; nothing changed" in again.stdout
    assert (
        json.loads(_run(root, "release", "--rollout-id", "3..4", "--json").stdout)["release"] == []
    )
    empty = _run(root, "release", "--rollout-id", "40..", "--yes")
    assert empty.exit_code == 1 and "no archive has a rollout id in that range" in empty.stderr
    assert _run(root, "gc", "--grace", "0", "--yes").exit_code == 0
    shown = _run(root, "show", "rollout-0").stdout
    assert "released, reclaimed" in shown
    assert re.search(r"created +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [A-Z+-]", shown)


def test_cli_query_status_is_validated(root: Path) -> None:
    upper = _run(root, "query", "--status", "TRUNCATED", "--json")
    assert upper.exit_code == 0 and {r["status"] for r in json.loads(upper.stdout)} == {"truncated"}
    typo = _run(root, "query", "--status", "truncted")
    assert typo.exit_code == 2 and "'truncted' is not one of" in typo.output


def test_cli_gc_dry_run_explains_the_grace(tmp_path: Path) -> None:
    root = tmp_path / "now"
    with ArchiveManager.open(root) as pool:  # the real clock: saved just now
        _fill(pool, FakeClock(), range(2))
    assert _run(root, "release", "rollout-1", "--yes").exit_code == 0
    out = _run(root, "gc", "--dry-run").stdout  # default grace 1h
    assert "would reclaim 0 blob(s)" in out
    assert "the grace period holds back" in out and "reclaimable after" in out


def _dump(pool_root: Path, name: str, out: Path) -> None:
    with ArchiveManager.open(pool_root) as pool:
        pool.open_archive(name).export_pt(out)


def test_cli_import_pt_many(root: Path, tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    for i in (0, 1):
        _dump(root, f"rollout-{i}", dumps / f"dump-{i}.pt")
    target = tmp_path / "other"
    ArchiveManager.open(target).close()
    result = _run(target, "import-pt", str(dumps / "*.pt"), "--json")
    assert result.exit_code == 0, result.output
    # An export names its archive; each file's own name comes back.
    assert [r["name"] for r in json.loads(result.stdout)] == ["rollout-0", "rollout-1"]
    # A plain slime dump (no archive_manager block) is named after its file's stem. A second
    # run stops at the first name taken and says what it imported before it.
    plain = torch.load(dumps / "dump-0.pt", weights_only=True)
    torch.save({"rollout_id": plain["rollout_id"], "samples": plain["samples"]}, dumps / "d-2.pt")
    again = _run(target, "import-pt", str(dumps / "d-2.pt"), str(dumps / "dump-0.pt"))
    assert again.exit_code == 1
    assert "already exists" in again.stderr and "imported before it: d-2" in again.stderr
    assert _run(target, "import-pt", str(dumps / "nothing-*.pt")).exit_code == 2
    twice = _run(
        target, "import-pt", str(dumps / "dump-0.pt"), str(dumps / "dump-1.pt"), "--name", "x"
    )
    assert twice.exit_code == 2


def test_forget_and_release_in_a_subprocess(root: Path) -> None:
    """The verbs as a user runs them: a fresh process, stdin not a terminal."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def cli_run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "archive_manager.cli", "--root", str(root), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    refused = cli_run("forget", "--keep-last", "3")
    assert refused.returncode == 1 and "pass --yes" in refused.stderr
    done = cli_run("forget", "--keep-last", "3", "--no-evaluation", "--yes", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["released"] == ["rollout-1", "rollout-0"]
    many = cli_run("release", "rollout-2", "rollout-3", "--yes")
    assert many.returncode == 0 and "released 2 archive(s)" in many.stdout


# --------------------------------------------------------------------------- consistency


def test_cli_listing_formats(root: Path) -> None:
    lines = _run(root, "ls", "--rollout-id", "4..", "--format", "ndjson").stdout.splitlines()
    assert [json.loads(x)["name"] for x in lines] == ["rollout-4", "rollout-5"]
    table = list(
        csv.DictReader(io.StringIO(_run(root, "keys", "rollout-1", "--format", "CSV").stdout))
    )
    assert [r["sample_key"] for r in table] == ["sample:0", "sample:1"]
    rows = [json.loads(x) for x in _run(root, "query", "--format", "ndjson").stdout.splitlines()]
    assert len(rows) == 12
    # Counts are named apart from the payload fields they count.
    meta = rows[0]["metadata"]
    assert isinstance(meta["tokens_length"], int) and "tokens" not in meta
    assert _run(root, "ls", "--json", "--format", "csv").exit_code == 2
    assert _run(root, "ls", "--format", "xml").exit_code == 2


def test_cli_verbose_logs_and_info(root: Path) -> None:
    assert _run(root, "release", "rollout-0", "--yes").exit_code == 0
    quiet = _run(root, "gc", "--grace", "0", "--yes")
    assert "INFO" not in quiet.stderr
    logged = _run(root, "-v", "gc", "--grace", "0", "--yes")
    assert logged.exit_code == 0 and "INFO: gc: deleted 0 blob(s)" in logged.stderr
    assert _run(root, "-v", "-q", "ls").exit_code == 2
    # A released archive's blobs awaiting GC, and no sharing: the ratio still reads 1.
    assert _run(root, "release", "rollout-1", "--yes").exit_code == 0
    info = json.loads(_run(root, "info", "--json").stdout)
    assert info["dedup_ratio"] >= 1.0 and info["stored_bytes"] > info["unique_bytes"]


def test_times_carry_their_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import datetime, timezone

    from archive_manager._util.humanize import local_time

    when = datetime(2026, 12, 2, 9, 5, tzinfo=timezone.utc)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        assert local_time(when) == "2026-12-02 09:05:00 UTC"
        monkeypatch.setenv("TZ", "<+0530>-5:30")
        time.tzset()
        assert local_time(when) == "2026-12-02 14:35:00 +0530"
    finally:
        monkeypatch.undo()
        time.tzset()
