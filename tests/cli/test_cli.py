"""The ``archive-manager`` CLI: every verb through click's `CliRunner` against a small pool,
JSON outputs parsed, errors as one line with no traceback, confirmations, and real
subprocess runs of ``demo`` and ``ls --json``."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner, Result
from helpers import tiny_rollout

from archive_manager import ArchiveManager
from archive_manager.catalog import head_revision
from archive_manager.cli import cli
from archive_manager.cli._output import human_size, progress_reporter
from archive_manager.cli._params import ROLLOUT_RANGE, parse_duration
from archive_manager.interop.synthetic import make_rollout
from archive_manager.pool.identity import SPARE_FILE

SHAPE: dict[str, Any] = {"prompt_len": 8, "response_min": 4, "response_max": 16}
N = 12  # samples per archive: small, several task groups (group_size 8 -> 2 groups)


def _rollout(rollout_id: int, n: int = N) -> list:
    return make_rollout(n, seed=rollout_id, rollout_id=rollout_id, **SHAPE)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A pool with ``train-0`` (rollout 0) and ``eval-1`` (rollout 1, evaluation)."""
    path = tmp_path / "pool"
    with ArchiveManager.open(path) as pool:
        pool.save("train-0", _rollout(0), rollout_id=0)
        pool.save("eval-1", _rollout(1), rollout_id=1, evaluation=True)
    return path


@pytest.fixture
def run(root: Path) -> Iterator[Callable[..., Result]]:
    """``run(*args, input=None, root=...)``: invoke the CLI on the pool and return the result."""
    runner = CliRunner()

    def _run(*args: str, input: str | None = None, at: Path | None = None, **kw: Any) -> Result:
        return runner.invoke(cli, ["--root", str(at or root), *args], input=input, **kw)

    yield _run


@pytest.fixture
def pool_at(root: Path) -> Iterator[Callable[[], ArchiveManager]]:
    """Open the fixture pool for assertions (each opened pool is closed at teardown)."""
    opened: list[ArchiveManager] = []

    def _open() -> ArchiveManager:
        opened.append(ArchiveManager.open(root))
        return opened[-1]

    yield _open
    for pool in opened:
        pool.close()


def ok(result: Result) -> Result:
    """Assert a clean exit 0 and return the result."""
    assert result.exit_code == 0, (result.exit_code, result.output, result.exception)
    return result


def as_json(result: Result) -> Any:
    """The parsed stdout of a successful ``--json`` run."""
    return json.loads(ok(result).stdout)


def failed(result: Result, code: int = 1) -> str:
    """Assert exit ``code`` with a one-line ``error:`` message and no traceback; return it."""
    assert result.exit_code == code, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    if code == 1:
        assert len(lines) == 1, lines
        assert lines[0].startswith("error: "), lines
    return result.stderr.strip()


# --------------------------------------------------------------------------- group


def test_version_and_help() -> None:
    runner = CliRunner()
    assert "archive-manager, version" in ok(runner.invoke(cli, ["--version"])).stdout
    helped = ok(runner.invoke(cli, ["--help"])).stdout
    for verb in ("init", "db", "ls", "show", "query", "gc", "verify", "demo", "import-pt"):
        assert verb in helped


@pytest.mark.parametrize("old_too", [False, True], ids=["one", "old name too"])
def test_version_warns_when_the_old_distribution_shares_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old_too: bool
) -> None:
    """A checkout installed under the old name, then installed as rollout-archive-manager,
    leaves two distributions owning archive_manager/: uninstalling either breaks the other."""
    import importlib.metadata  # before sys.path holds only the fake site-packages

    names = (
        ["rollout_archive_manager", "archive_manager"] if old_too else ["rollout_archive_manager"]
    )
    for name in names:
        info = tmp_path / f"{name}-0.1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert importlib.metadata.version("rollout-archive-manager") == "0.1.0"
    result = ok(CliRunner().invoke(cli, ["--version"]))
    assert result.stdout.startswith("archive-manager, version")
    if not old_too:
        assert result.stderr == ""
        return
    assert result.stderr.splitlines() == [
        "warning: both rollout-archive-manager and archive_manager are installed here and own "
        "the same files: pip uninstall -y archive_manager, then pip install --force-reinstall "
        "--no-deps -e . in the checkout (or the wheel)"
    ]


def test_unknown_verb_and_bad_option_are_usage_errors(run: Callable[..., Result]) -> None:
    assert run("frobnicate").exit_code == 2
    assert run("ls", "--state", "bogus").exit_code == 2
    assert run("show").exit_code == 2  # missing NAME


def test_root_from_environment(root: Path) -> None:
    result = CliRunner().invoke(cli, ["ls", "--json"], env={"ARCHIVE_MANAGER_ROOT": str(root)})
    assert [a["name"] for a in as_json(result)] == ["train-0", "eval-1"]


def test_missing_pool_is_an_error_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    for args in (["ls"], ["info"], ["show", "x"], ["gc", "--yes"], ["db", "upgrade"]):
        message = failed(CliRunner().invoke(cli, ["--root", str(missing), *args]))
        assert "no pool at" in message
    assert not missing.exists()


# --------------------------------------------------------------------------- pool verbs


def test_init_creates_then_finds_the_pool(tmp_path: Path) -> None:
    runner = CliRunner()
    where = tmp_path / "new"
    assert "created pool at" in ok(runner.invoke(cli, ["--root", str(where), "init"])).stdout
    assert (where / "catalog.db").is_file()
    again = ok(runner.invoke(cli, ["--root", str(where), "init"])).stdout
    assert "already exists" in again
    assert as_json(runner.invoke(cli, ["--root", str(where), "ls", "--json"])) == []


def test_catalog_url_option(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    runner = CliRunner()
    base = ["--root", str(tmp_path / "blobs"), "--catalog-url", url]
    ok(runner.invoke(cli, [*base, "init"]))
    assert (tmp_path / "elsewhere.db").is_file()
    info = as_json(runner.invoke(cli, [*base, "info", "--json"]))
    assert info["catalog_url"] == url


def test_db_current_and_upgrade(run: Callable[..., Result], tmp_path: Path) -> None:
    current = as_json(run("db", "current", "--json"))
    assert current["current"] == current["head"] == head_revision()
    assert current["up_to_date"] is True
    assert "up to date" in ok(run("db", "current")).stdout
    upgraded = as_json(run("db", "upgrade", "--json"))
    assert upgraded == {"before": head_revision(), "after": head_revision(), "upgraded": False}
    assert "already at the newest revision" in ok(run("db", "upgrade")).stdout
    # No pool: reported, not created.
    empty = as_json(run("db", "current", "--json", at=tmp_path / "none"))
    assert empty["current"] is None and empty["status"] == "no catalog"
    assert empty["head"] == head_revision() and empty["up_to_date"] is False
    assert not (tmp_path / "none").exists()


def test_db_current_on_a_fresh_folder_creates_nothing(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    runner = CliRunner()
    for args in (["db", "current"], ["db", "current", "--json"]):
        ok(runner.invoke(cli, ["--root", str(fresh), *args]))
    assert list(fresh.iterdir()) == []
    shown = as_json(runner.invoke(cli, ["--root", str(fresh), "db", "current", "--json"]))
    status = ArchiveManager.catalog_status(fresh)
    assert (shown["current"], shown["head"]) == (status.current, status.head)
    # The library agrees no pool is there, and a verb that needs one refuses.
    assert not ArchiveManager.exists(fresh)
    assert "archive-manager init" in failed(runner.invoke(cli, ["--root", str(fresh), "ls"]))
    assert list(fresh.iterdir()) == []


def test_info(run: Callable[..., Result]) -> None:
    info = as_json(run("info", "--json"))
    assert info["archives"] == {"published": 2}
    assert info["samples"] == 2 * N
    assert info["stored_bytes"] > 0 and info["dedup_ratio"] == pytest.approx(1.0)
    human = ok(run("info")).stdout
    assert "2 published" in human and "dedup ratio" in human and "iB" in human


# --------------------------------------------------------------------------- listing


def test_ls_table_and_json(run: Callable[..., Result]) -> None:
    lines = ok(run("ls")).stdout.splitlines()
    assert lines[0].split()[:4] == ["NAME", "ROLLOUT", "EVAL", "STATE"]
    assert [line.split()[0] for line in lines[1:]] == ["train-0", "eval-1"]
    rows = as_json(run("ls", "--json"))
    assert {r["name"]: r["evaluation"] for r in rows} == {"train-0": False, "eval-1": True}
    assert all(r["samples"] == N and r["bytes"] > 0 for r in rows)


def test_ls_filters(run: Callable[..., Result]) -> None:
    def names(*args: str) -> list[str]:
        return [r["name"] for r in as_json(run("ls", "--json", *args))]

    assert names("--rollout-id", "1") == ["eval-1"]
    assert names("--evaluation") == ["eval-1"]
    assert names("--no-evaluation") == ["train-0"]
    assert names("--task-key", "rollout-0/group-1") == ["train-0"]
    assert names("--task-key", "no-such-task") == []
    assert names("--since", "2h") == ["train-0", "eval-1"]
    assert names("--since", "2999-01-01") == []
    assert names("--state", "released") == []
    assert names("--state", "all") == ["train-0", "eval-1"]
    assert "no archives match" in ok(run("ls", "--rollout-id", "7")).stdout
    assert run("ls", "--since", "yesterday-ish").exit_code == 2


def test_ls_since_is_find_since(
    run: Callable[..., Result],
    root: Path,
    pool_at: Callable[[], ArchiveManager],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    three_days_ago = time.time() - 3 * 86400
    with ArchiveManager.open(root, clock=lambda: three_days_ago) as pool:
        pool.save("old-2", _rollout(2), rollout_id=2)

    def names(*args: str) -> list[str]:
        return [r["name"] for r in as_json(run("ls", "--json", "--state", "all", *args))]

    assert names() == ["train-0", "eval-1", "old-2"]
    assert names("--since", "1d") == ["train-0", "eval-1"]
    assert names("--since", "4d") == ["train-0", "eval-1", "old-2"]
    two_days_ago = datetime.now(timezone.utc) - timedelta(days=2)
    assert names("--since", two_days_ago.isoformat()) == ["train-0", "eval-1"]
    # A naive date/time is local time, as the CLI prints it.
    local = two_days_ago.astimezone().replace(tzinfo=None).isoformat(" ", "seconds")
    assert names("--since", local) == ["train-0", "eval-1"]
    expected = [i.name for i in pool_at().find(state=None, since=two_days_ago)]
    assert names("--since", two_days_ago.isoformat()) == expected
    assert "no archives match" in ok(run("ls", "--since", "2999-01-01")).stdout

    # The filter is the library's: the CLI passes --since to find() (or to the SQLite
    # listing, which takes find's arguments) and keeps every row.
    from archive_manager.pool import sqlite_listing as _sqlite_listing

    seen: list[Any] = []
    real_find, real_read = ArchiveManager.find, _sqlite_listing.read_listing

    def spy(self: ArchiveManager, **kwargs: Any) -> Any:
        seen.append(kwargs.get("since"))
        return real_find(self, **kwargs)

    def spy_read(root: Path, url: str | None, **kwargs: Any) -> Any:
        seen.append(kwargs.get("since"))
        found = real_read(root, url, **kwargs)
        assert found is not None  # a plain SQLite pool: sqlite3 answers
        return found

    monkeypatch.setattr(ArchiveManager, "find", spy)
    monkeypatch.setattr(_sqlite_listing, "read_listing", spy_read)
    ok(run("ls", "--since", "1d"))
    monkeypatch.setattr(_sqlite_listing, "read_listing", lambda *args, **kwargs: None)
    ok(run("ls", "--since", "1d"))
    assert len(seen) == 2 and all(isinstance(s, datetime) and s.tzinfo is not None for s in seen)


def test_show(run: Callable[..., Result]) -> None:
    shown = as_json(run("show", "train-0", "--json"))
    assert shown["name"] == "train-0" and shown["state"] == "published"
    assert shown["owners"] == ["archive:train-0"]
    assert sum(c["samples"] for c in shown["chunks"]) == N
    assert shown["metadata"]["samples"] == N
    assert 4 <= shown["metadata"]["response_length"]["min"] <= 16
    human = ok(run("show", "train-0")).stdout
    for word in ("archive", "chunks (1)", "response length", "reward", "archive:train-0"):
        assert word in human


def test_keys(run: Callable[..., Result]) -> None:
    rows = as_json(run("keys", "train-0", "--json"))
    assert [r["sample_key"] for r in rows] == [f"sample:{i}" for i in range(N)]
    assert rows[0]["task_key"] == "rollout-0/group-0" and rows[-1]["position"] == N - 1
    assert "rollout-0/group-1" in ok(run("keys", "train-0")).stdout


def test_query(run: Callable[..., Result]) -> None:
    def query(*args: str) -> list[dict]:
        return as_json(run("query", "--json", *args))

    group = query("--task-key", "rollout-1/group-0")
    assert len(group) == 8 and {r["archive"] for r in group} == {"eval-1"}
    assert {"position", "sample_key", "task_key", "status", "reward", "metadata"} <= set(group[0])
    assert len(query("--sample-key", "sample:3")) == 2
    assert {r["rollout_id"] for r in query("--rollout-id", "1")} == {1}
    assert {r["rollout_id"] for r in query("--rollout-id", "0..1")} == {0, 1}
    assert {r["rollout_id"] for r in query("--rollout-id", "1..")} == {1}
    assert all(r["reward"] >= 1 for r in query("--min-reward", "1"))
    assert all(r["reward"] <= 0 for r in query("--max-reward", "0"))
    lengths = [r["response_length"] for r in query("--min-length", "8", "--max-length", "12")]
    assert lengths and all(8 <= n <= 12 for n in lengths)
    statuses = {r["status"] for r in query("--status", "completed", "--status", "truncated")}
    assert statuses <= {"completed", "truncated"} and statuses
    assert len(query("--limit", "3")) == 3
    assert query("--task-key", "nope") == []
    assert "sample:3" in ok(run("query", "--sample-key", "sample:3")).stdout
    assert "no samples match" in ok(run("query", "--task-key", "nope")).stdout
    for bad in ("3..1", "x", "..", "1.5"):
        assert run("query", "--rollout-id", bad).exit_code == 2
    assert run("query", "--limit", "-1").exit_code == 2


# --------------------------------------------------------------------------- export / import


def test_export_then_import(run: Callable[..., Result], tmp_path: Path) -> None:
    out = tmp_path / "out" / "train-0.pt"
    assert "exported 12 samples" in ok(run("export", "train-0", str(out))).stdout
    dump = torch.load(out, weights_only=True)
    assert dump["rollout_id"] == 0 and len(dump["samples"]) == N
    assert "--force" in failed(run("export", "train-0", str(out)))
    assert as_json(run("export", "train-0", str(out), "--force", "--json"))["samples"] == N

    imported = as_json(run("import-pt", str(out), "--name", "copy", "--json"))
    assert imported["name"] == "copy" and imported["samples"] == N and imported["rollout_id"] == 0
    assert "already exists" in failed(run("import-pt", str(out), "--name", "copy"))
    # Default name: the exported archive's (taken here), else the file's stem.
    copied = shutil.copy(out, tmp_path / "train-0-dump.pt")
    assert "'train-0' already exists" in failed(run("import-pt", str(copied)))
    dump.pop("archive_manager")
    torch.save(dump, copied)
    assert "as archive 'train-0-dump'" in ok(run("import-pt", str(copied))).stdout


def test_import_rejects_bad_files(run: Callable[..., Result], tmp_path: Path) -> None:
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file")
    failed(run("import-pt", str(junk)))
    torch.save({"no": "samples"}, tmp_path / "odd.pt")
    assert "not a rollout dump" in failed(run("import-pt", str(tmp_path / "odd.pt")))
    assert run("import-pt", str(tmp_path / "missing.pt")).exit_code == 2


# --------------------------------------------------------------------------- errors


def test_missing_archive_is_one_line(run: Callable[..., Result]) -> None:
    for args in (["show", "nope"], ["keys", "nope"], ["export", "nope", "x.pt"]):
        assert failed(run(*args)) == "error: archive 'nope' not found"
    assert failed(run("release", "nope", "--yes")) == "error: archive 'nope' not found"
    assert "not found" in failed(run("retain", "checkpoint:a", "nope"))


def test_invalid_names_are_one_line(run: Callable[..., Result]) -> None:
    assert "path separator" in failed(run("show", "a/b"))
    assert "kind:name" in failed(run("retain", "no-colon", "train-0"))
    assert "reserved prefix" in failed(run("release-owner", "archive:train-0", "--yes"))
    assert "reserved prefix" in failed(run("release-owner", "archive:train-0", "--dry-run"))


# --------------------------------------------------------------------------- retention


def test_release_declined_changes_nothing(
    run: Callable[..., Result], pool_at: Callable[[], ArchiveManager]
) -> None:
    result = run("release", "train-0", input="n\n")
    assert result.exit_code == 1 and "Aborted" in result.output
    assert "will release archive 'train-0'" in result.stderr
    assert pool_at().open_archive("train-0").state == "published"


def test_release_dry_run_then_yes(
    run: Callable[..., Result], pool_at: Callable[[], ArchiveManager]
) -> None:
    dry = as_json(run("release", "train-0", "--dry-run", "--json"))
    assert dry["dry_run"] is True and dry["released"] is False and dry["frees_bytes"] > 0
    assert "would release archive 'train-0'" in ok(run("release", "train-0", "-n")).stdout
    assert pool_at().open_archive("train-0").state == "published"
    assert "released archive 'train-0'" in ok(run("release", "train-0", "--yes")).stdout
    assert pool_at().open_archive("train-0").state == "released"
    assert "already released" in ok(run("release", "train-0", "--yes")).stdout


def test_release_dry_run_is_the_release_plan(
    run: Callable[..., Result], pool_at: Callable[[], ArchiveManager]
) -> None:
    plan = pool_at().release_plan(name="train-0")
    assert plan.blobs > 0 and plan.bytes > 0
    dry = as_json(run("release", "train-0", "--dry-run", "--json"))
    assert dry["owner"] == plan.owner
    assert (dry["frees_blobs"], dry["frees_bytes"]) == (plan.blobs, plan.bytes)
    assert dry["other_owners"] == []
    human = ok(run("release", "train-0", "-n")).stdout
    assert f"may reclaim {plan.blobs} blob(s), {human_size(plan.bytes)}" in human
    # The confirmation shows the same plan (on stderr, before the prompt).
    declined = run("release", "train-0", input="n\n")
    assert f"may reclaim {plan.blobs} blob(s), {human_size(plan.bytes)}" in declined.stderr
    assert pool_at().open_archive("train-0").state == "published"


def test_release_confirmed(
    run: Callable[..., Result], pool_at: Callable[[], ArchiveManager]
) -> None:
    result = as_json(run("release", "eval-1", "--json", input="y\n"))
    assert result["released"] is True
    assert pool_at().open_archive("eval-1").state == "released"


def test_retain_owners_release_owner(
    run: Callable[..., Result], pool_at: Callable[[], ArchiveManager]
) -> None:
    assert "now retains" in ok(run("retain", "checkpoint:step-1", "train-0")).stdout
    assert as_json(run("retain", "checkpoint:step-1", "train-0", "--json"))["added"] is False
    report = as_json(run("owners", "--json"))
    usage = {o["owner"]: o for o in report["owners"]}
    assert usage["checkpoint:step-1"]["archives"] == ["train-0"]
    assert usage["checkpoint:step-1"]["shared_bytes"] == usage["archive:train-0"]["bytes"]
    assert "checkpoint:step-1" in ok(run("owners")).stdout

    # Releasing the archive while the checkpoint holds it frees nothing.
    held = as_json(run("release", "train-0", "-n", "--json"))
    assert (held["frees_blobs"], held["frees_bytes"]) == (0, 0)
    assert held["other_owners"] == ["checkpoint:step-1"]
    assert "still retained by checkpoint:step-1" in ok(run("release", "train-0", "-n")).stdout

    # Likewise for the checkpoint, while the archive still retains itself.
    dry = as_json(run("release-owner", "checkpoint:step-1", "--dry-run", "--json"))
    plan = pool_at().release_plan(owner="checkpoint:step-1")
    assert dry["archives"] == plan.archives == ["train-0"] and dry["released"] == 0
    assert dry["still_retained"] == plan.still_retained == {"train-0": ["archive:train-0"]}
    assert (dry["frees_blobs"], dry["frees_bytes"]) == (plan.blobs, plan.bytes) == (0, 0)
    declined = run("release-owner", "checkpoint:step-1", input="n\n")
    assert declined.exit_code == 1 and "Aborted" in declined.output
    assert "train-0 stays retained by archive:train-0" in declined.stderr
    assert pool_at().open_archive("train-0").owners() == ["archive:train-0", "checkpoint:step-1"]
    done = as_json(run("release-owner", "checkpoint:step-1", "--yes", "--json"))
    assert done["released"] == 1
    assert pool_at().open_archive("train-0").owners() == ["archive:train-0"]
    assert "retained nothing" in ok(run("release-owner", "checkpoint:step-1", "--yes")).stdout
    assert "retains nothing" in ok(run("release-owner", "checkpoint:step-1")).stdout


def test_release_owner_dry_run_is_the_release_plan(
    run: Callable[..., Result], pool_at: Callable[[], ArchiveManager]
) -> None:
    ok(run("retain", "checkpoint:step-2", "eval-1"))
    ok(run("release", "eval-1", "--yes"))  # the checkpoint is now eval-1's only owner
    plan = pool_at().release_plan(owner="checkpoint:step-2")
    assert plan.archives == ["eval-1"] and plan.still_retained == {}
    assert plan.blobs > 0 and plan.bytes > 0
    dry = as_json(run("release-owner", "checkpoint:step-2", "-n", "--json"))
    assert (dry["frees_blobs"], dry["frees_bytes"]) == (plan.blobs, plan.bytes)
    assert dry["still_retained"] == {}
    reclaim = f"may reclaim {plan.blobs} blob(s), {human_size(plan.bytes)}"
    assert reclaim in ok(run("release-owner", "checkpoint:step-2", "-n")).stdout
    assert reclaim in run("release-owner", "checkpoint:step-2", input="n\n").stderr
    # What the plan promised is what gc then reclaims.
    ok(run("release-owner", "checkpoint:step-2", "--yes"))
    gc = as_json(run("gc", "--grace", "0", "--yes", "--json"))
    assert (gc["blobs"], gc["bytes"]) == (plan.blobs, plan.bytes)


# --------------------------------------------------------------------------- maintenance


def _blob_count(root: Path) -> int:
    return sum(1 for p in (root / "blobs").rglob("*") if p.is_file() and p.name != SPARE_FILE)


def test_gc_dry_run_decline_and_yes(run: Callable[..., Result], root: Path) -> None:
    before = _blob_count(root)
    ok(run("release", "train-0", "--yes"))
    plan = as_json(run("gc", "--grace", "0", "--dry-run", "--json"))
    assert plan["dry_run"] is True and plan["blobs"] > 0
    assert set(plan["per_archive"]) == {"train-0"}
    assert "would reclaim" in ok(run("gc", "--grace", "0", "--dry-run")).stdout
    # The default grace (1h) keeps blobs that were just released.
    assert as_json(run("gc", "--dry-run", "--json"))["blobs"] == 0

    declined = run("gc", "--grace", "0", input="n\n")
    assert declined.exit_code == 1 and "Aborted" in declined.output
    assert _blob_count(root) == before

    # A prompt goes to stderr, so --json output stays parseable after answering it.
    done = as_json(run("gc", "--grace", "0", "--json", input="y\n"))
    assert done["dry_run"] is False and done["blobs"] == plan["blobs"]
    assert _blob_count(root) == before - plan["blobs"]
    assert "reclaimed 0 blob(s)" in ok(run("gc", "--grace", "0", "--yes")).stdout
    assert run("gc", "--grace", "soon").exit_code == 2


def test_verify_ok_and_damaged(run: Callable[..., Result], root: Path) -> None:
    report = as_json(run("verify", "--read-data", "--json"))
    assert report["ok"] is True and report["read_data"] is True and report["bytes_read"] > 0
    assert ok(run("verify")).stdout.startswith("ok:")
    assert as_json(run("verify", "--subset", "1/2", "--json"))["read_data"] is True
    assert run("verify", "--subset", "200%").exit_code == 2

    victim = next(p for p in (root / "blobs").rglob("*") if p.is_file() and p.name != SPARE_FILE)
    victim.parent.chmod(0o755)
    victim.unlink()
    damaged = run("verify", "--json")
    assert damaged.exit_code == 1
    assert json.loads(damaged.stdout)["ok"] is False
    human = run("verify")
    assert human.exit_code == 1 and "problem:" in human.stdout and victim.name in human.stdout


def test_rebuild_catalog(run: Callable[..., Result], root: Path) -> None:
    assert "restored 0 archive(s)" in ok(run("rebuild-catalog", "--yes")).stdout
    for path in root.glob("catalog.db*"):
        path.unlink()
    # The catalog is lost: reads refuse, naming the verb that recovers; init does not
    # quietly make a new catalog over the old blobs; none of them creates a file.
    assert "rebuild-catalog" in failed(run("ls"))
    assert "rebuild-catalog" in failed(run("init"))
    declined = run("rebuild-catalog", input="n\n")  # asks first
    assert declined.exit_code == 1 and "Aborted" in declined.output
    assert not (root / "catalog.db").exists()
    rebuilt = as_json(run("rebuild-catalog", "--yes", "--json"))
    assert rebuilt["archives"] == ["eval-1", "train-0"]
    assert {a["name"] for a in as_json(run("ls", "--json"))} == {"train-0", "eval-1"}


@pytest.mark.parametrize(
    ("args", "dry_run"),
    [
        (["rebuild-catalog"], False),
        (["rebind"], False),
        (["gc"], True),
        (["forget", "--keep-last", "1"], True),
    ],
    ids=["rebuild-catalog", "rebind", "gc", "forget"],
)
def test_a_question_without_a_terminal_names_only_the_verbs_options(
    run: Callable[..., Result], root: Path, args: list[str], dry_run: bool
) -> None:
    """rebuild-catalog and rebind, asked with stdin not a terminal, said "pass --yes ... (or
    --dry-run to only look)", an option neither has, on the prompt's own line."""
    with ArchiveManager.open(root) as pool:
        pool.save("spare", _rollout(2), rollout_id=2)
        pool.open_archive("spare").release()  # something for gc and forget to ask about
    result = run(*args, "--grace", "0") if args == ["gc"] else run(*args)
    assert result.exit_code == 1, result.output
    question, error = result.stderr.splitlines()[-2:]
    assert question.rstrip().endswith("[y/N]:")
    hint = " (or --dry-run to only look)" if dry_run else ""
    assert error == (
        "error: this command asks for confirmation, and stdin is not a terminal: pass --yes "
        f"to go ahead without asking{hint}"
    )


def test_rebind_of_a_hard_linked_copy(
    run: Callable[..., Result], root: Path, tmp_path: Path
) -> None:
    """The verb the copy refusal advises, on a ``cp -al`` copy: the copy's catalog becomes a
    file of its own and the original's stays byte for byte; an empty mount point where a
    pool's catalog records the pool is one ``error:`` line."""
    import subprocess

    copy = tmp_path / "copy"
    subprocess.run(["cp", "-al", str(root), str(copy)], check=True)
    catalog = (root / "catalog.db").read_bytes()
    assert "rebind" in failed(run("ls", at=copy))
    ok(run("rebind", "--yes", at=copy))
    assert (root / "catalog.db").read_bytes() == catalog
    assert (copy / "catalog.db").stat().st_ino != (root / "catalog.db").stat().st_ino
    assert {a["name"] for a in as_json(run("ls", "--json"))} == {"train-0", "eval-1"}
    assert {a["name"] for a in as_json(run("ls", "--json", at=copy))} == {"train-0", "eval-1"}
    away = tmp_path / "the-mount"
    root.rename(away)
    root.mkdir()  # the mount point, with nothing mounted on it
    message = failed(run("--catalog-url", f"sqlite:///{away / 'catalog.db'}", "ls"))
    assert "looks unmounted" in message
    assert list(root.iterdir()) == []


# --------------------------------------------------------------------------- demo


def test_demo_refuses_a_pool_with_archives(run: Callable[..., Result]) -> None:
    assert "needs an empty pool" in failed(run("demo"))


def test_demo_defaults_to_a_new_temp_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    out = ok(CliRunner().invoke(cli, ["demo", "--samples", "16"])).stdout
    made = [p for p in tmp_path.iterdir() if p.name.startswith("archive-manager-demo-")]
    assert len(made) == 1 and str(made[0]) in out
    assert not (tmp_path / "archive-pool").exists()  # the default --root was left alone


def _cli_command() -> list[str]:
    script = shutil.which("archive-manager")
    return [script] if script else [sys.executable, "-m", "archive_manager.cli"]


def _subprocess(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARCHIVE_MANAGER_")}
    return subprocess.run(
        [*_cli_command(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_subprocess_demo_then_ls_json(tmp_path: Path) -> None:
    demo_root = tmp_path / "demo-pool"
    demo = _subprocess("--root", str(demo_root), "demo", cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr
    for step in range(1, 9):
        assert f"[{step}/8]" in demo.stdout
    assert "Try next" in demo.stdout and "routed experts" in demo.stdout
    assert demo.stderr == ""

    listed = _subprocess("--root", str(demo_root), "ls", "--json", "--state", "all", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    states = {a["name"]: a["state"] for a in json.loads(listed.stdout)}
    assert states == {"rollout-0": "released", "rollout-1": "published", "rollout-2": "published"}


def test_python_dash_m_reports_errors_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "archive_manager.cli", "--root", str(tmp_path), "show", "x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr.strip().startswith("error: no pool at")
    assert len(result.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------- helpers


def test_human_size() -> None:
    assert human_size(0) == "0 B"
    assert human_size(1023) == "1023 B"
    assert human_size(1536) == "1.5 KiB"
    assert human_size(5 * 1024**3) == "5.0 GiB"


def test_parse_duration_and_range() -> None:
    assert parse_duration("0") == timedelta(0)
    assert parse_duration("90s") == timedelta(seconds=90)
    assert parse_duration("1h30m") == timedelta(minutes=90)
    assert parse_duration("3d") == timedelta(days=3)
    with pytest.raises(ValueError):
        parse_duration("3 days")
    assert ROLLOUT_RANGE.convert("4", None, None) == (4, 4)
    assert ROLLOUT_RANGE.convert("..7", None, None) == (None, 7)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with progress_reporter("work") as report:
        assert report is None
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with progress_reporter("work", enabled=False) as report:
        assert report is None
    with progress_reporter("work") as report:
        assert report is not None
        report(1, 2)
        report(2, 2)
    assert "work" in terminal.getvalue()


# --------------------------------------------------------------------------- PostgreSQL


def test_every_verb_with_a_postgresql_catalog_url(tmp_path: Path, pg_server) -> None:
    """``--catalog-url postgresql+psycopg://...``: the same verbs, nothing in the root but blobs."""
    url = pg_server.create_database()
    try:
        runner = CliRunner()
        root = tmp_path / "shared"

        def run(*args: str, input: str | None = None) -> Result:
            return runner.invoke(
                cli, ["--root", str(root), "--catalog-url", url, *args], input=input
            )

        assert as_json(run("db", "current", "--json"))["current"] is None
        assert "no pool" in failed(run("info"))  # a fresh database is not a pool yet
        ok(run("init"))
        assert not list(root.glob("catalog.db*"))
        with ArchiveManager.open(root, catalog_url=url) as pool:
            pool.save("train-0", _rollout(0), rollout_id=0)
            pool.save("eval-1", _rollout(1), rollout_id=1, evaluation=True)
        assert as_json(run("db", "current", "--json"))["up_to_date"] is True
        assert as_json(run("db", "upgrade", "--json"))["upgraded"] is False
        info = as_json(run("info", "--json"))
        assert info["archives"] == {"published": 2} and info["catalog_url"] == url
        assert [a["name"] for a in as_json(run("ls", "--json"))] == ["train-0", "eval-1"]
        assert "train-0" in ok(run("show", "train-0")).stdout
        assert len(as_json(run("keys", "train-0", "--json"))) == N
        assert as_json(run("query", "--rollout-id", "1", "--json"))
        ok(run("export", "train-0", str(tmp_path / "t0.pt")))
        ok(run("import-pt", str(tmp_path / "t0.pt"), "--name", "imported"))
        ok(run("retain", "checkpoint:c1", "eval-1"))
        assert any(
            o["owner"] == "checkpoint:c1" for o in as_json(run("owners", "--json"))["owners"]
        )
        ok(run("release", "imported", "--yes"))
        ok(run("release-owner", "checkpoint:c1", "--yes"))
        ok(run("gc", "--grace", "0", "--yes"))
        ok(run("verify", "--read-data"))
        assert "restored 0 archive(s)" in ok(run("rebuild-catalog", "--yes")).stdout
        # Another root with this catalog is refused, in one line.
        other = runner.invoke(cli, ["--root", str(tmp_path / "other"), "--catalog-url", url, "ls"])
        assert other.exit_code == 1 and "belongs to the pool at" in other.output
    finally:
        pg_server.drop_database(url)


def test_no_verb_shows_a_catalog_password(tmp_path: Path, pg_server) -> None:
    """A password in ``--catalog-url`` (in the URL's user part or as libpq's ``password``
    query parameter) reaches the server and nothing else: not stdout, stderr or ``--json``."""
    secret = "s3cret-pw"
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    unreachable = f"postgresql+psycopg://u:{secret}@127.0.0.1:{closed.getsockname()[1]}/x"
    closed.close()
    runner = CliRunner()
    outputs: list[str] = []

    def run(root: Path, at: str, *args: str) -> Result:
        result = runner.invoke(cli, ["--root", str(root), "--catalog-url", at, *args])
        outputs.append(result.output + result.stderr)
        return result

    for n, form in enumerate(("user", "query")):
        url = pg_server.create_database()
        try:
            if form == "user":
                secret_url = url.replace("://postgres@", f"://postgres:{secret}@", 1)
            else:
                secret_url = f"{url}?password={secret}"
            root = tmp_path / f"pool-{n}"
            assert as_json(run(root, secret_url, "db", "current", "--json"))["current"] is None
            assert "no pool" in failed(run(root, secret_url, "info"))
            ok(run(root, secret_url, "init"))
            ok(run(root, secret_url, "init"))
            info = as_json(run(root, secret_url, "info", "--json"))
            assert info["catalog_url"].endswith(url.rsplit("/", 1)[1])
            ok(run(root, secret_url, "info"))
            ok(run(root, secret_url, "db", "current"))
            assert as_json(run(root, secret_url, "db", "current", "--json"))["up_to_date"]
            ok(run(root, secret_url, "db", "upgrade"))
            ok(run(root, secret_url, "ls", "--json"))
            other = tmp_path / "other"
            assert "belongs to the pool at" in failed(run(other, secret_url, "ls"))
        finally:
            pg_server.drop_database(url)
    assert "cannot reach" in failed(run(tmp_path / "x", unreachable, "info"))
    failed(run(tmp_path / "x", unreachable, "db", "current"))
    assert not [o for o in outputs if secret in o], outputs


def _escaped_pool(tmp_path: Path) -> ArchiveManager:
    pool = ArchiveManager.open(tmp_path / "pool", create=True)
    samples = tiny_rollout(2, seed=1, r3_layers=0)
    samples[0].response = "plain text"
    samples[1].task_key = "\x1b[31mred"  # type: ignore[attr-defined]
    pool.save("r1", samples, rollout_id=1)
    return pool


def test_csv_listing_keeps_escape_sequences_exactly(tmp_path: Path) -> None:
    """--format csv claims exact output, but click.echo stripped ANSI sequences from it when
    stdout is not a terminal: a task key '\\x1b[31mred' was exported as 'red'."""
    _escaped_pool(tmp_path).close()
    result = CliRunner().invoke(cli, ["--root", str(tmp_path / "pool"), "query", "--format", "csv"])
    assert result.exit_code == 0, result.output
    assert "\x1b[31mred" in result.output


def test_sample_names_the_class_it_was_saved_as_without_warnings(tmp_path: Path) -> None:
    """The CLI registers no user class: a slime Sample shows as its fields, named as the
    class its record holds, and the library's notice about the unregistered class is not
    printed (three stack lines per class on every call)."""
    frameworks = str(Path(__file__).resolve().parents[1] / "frameworks")
    sys.path.insert(0, frameworks)
    try:
        from rollouts import make_slime_rollout
    finally:
        sys.path.remove(frameworks)
    root = tmp_path / "pool"
    rows = make_slime_rollout(2, seed=1)
    with ArchiveManager.open(root) as pool:
        arc = pool.save("s", rows, rollout_id=1)
        assert arc.stored_class(1) == "slime.utils.types.Sample"
        pool.save("d", [{"a": 1}], rollout_id=2)
        assert pool.open_archive("d").stored_class(0) is None
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "archive_manager",
            "--root",
            str(root),
            "sample",
            "s",
            "--position",
            "0",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    shown = json.loads(done.stdout)
    assert shown["class"] == "slime.utils.types.Sample" and shown["status"] == "completed"


def test_sample_without_a_position_shows_the_first(
    run: Callable[..., Result], pool_at: Callable[[], ArchiveManager]
) -> None:
    """A first look needs no option: ``sample NAME`` is ``sample NAME --position 0``; both
    ``--position`` and ``--key`` at once is a usage error (exit 2), as is an empty archive's
    first sample an error naming its size."""
    with pool_at() as pool:
        pool.save("r", tiny_rollout(3), rollout_id=1)
        pool.save("empty", [], rollout_id=2)
    first = run("sample", "r", "--json")
    assert first.exit_code == 0, first.output
    assert json.loads(first.output)["position"] == 0
    assert json.loads(first.output) == json.loads(
        run("sample", "r", "--position", "0", "--json").output
    )
    both = run("sample", "r", "--position", "1", "--key", "sample:1")
    assert both.exit_code == 2 and "not both" in both.output
    empty = run("sample", "empty")
    assert empty.exit_code == 1 and "holds 0" in empty.output


def test_release_says_when_gc_reclaims(
    run: Callable[..., Result], pool_at: Callable[[], ArchiveManager]
) -> None:
    # gc right after a release reclaimed nothing (the grace period), and said so only then.
    out = run("release", "--yes", "eval-1").stdout
    assert out.startswith("released archive 'eval-1'; ")
    assert "--grace (1h by default" in out


# --------------------------------------------------------------------------- the RL lens


def _slime_rollout(n: int, seed: int) -> list[Any]:
    frameworks = str(Path(__file__).resolve().parents[1] / "frameworks")
    sys.path.insert(0, frameworks)
    try:
        from rollouts import make_slime_rollout
    finally:
        sys.path.remove(frameworks)
    return make_slime_rollout(n, seed=seed)


def test_groups_and_stats_group_by(
    run: Callable[..., Result], pool_at: Callable[[], ArchiveManager]
) -> None:
    """Without task keys the groups are slime's group_index ones; ``--group-by`` names another
    field, for ``groups`` and ``stats`` alike; a name that is no field is one line."""
    with pool_at() as pool:
        pool.save("slime", _slime_rollout(12, seed=2), rollout_id=5)
    table = ok(run("groups", "slime")).stdout
    assert "group_index=0" in table and "group_index=2" in table
    listed = as_json(run("groups", "slime", "--group-by", "metadata.rm_type", "--json"))
    assert sorted(g["value"] for g in listed) == ["deepscaler", "math"]
    assert {g["field"] for g in listed} == {"metadata.rm_type"}
    assert (
        "metadata.rm_type=math"
        in ok(run("groups", "slime", "--group-by", "metadata.rm_type")).stdout
    )
    (row,) = as_json(run("stats", "--rollout-id", "5", "--group-by", "metadata.rm_type", "--json"))
    assert row["groups"] == sum(g["rewarded"] >= 2 for g in listed)
    (default,) = as_json(run("stats", "--rollout-id", "5", "--json"))
    assert default["groups"] == sum(
        g["rewarded"] >= 2 for g in as_json(run("groups", "slime", "--json"))
    )
    assert "group_by" in failed(run("groups", "slime", "--group-by", "a..b"))
    assert "group_by" in failed(run("stats", "--group-by", ""))
    # a field no sample has (a typo) groups nothing: said, not one silent "(ungrouped)"
    typo = ok(run("groups", "slime", "--group-by", "metadata.rm_tpye")).stdout
    assert "(ungrouped)" in typo and "no sample of 'slime' has a value for" in typo
    assert "has a value" not in ok(run("groups", "slime", "--group-by", "metadata.rm_type")).stdout
    typo = ok(run("stats", "--rollout-id", "5", "--group-by", "metadata.rm_tpye")).stdout
    assert "no two rewarded samples share a value of 'metadata.rm_tpye'" in typo
    assert "share a value" not in ok(run("stats", "--group-by", "metadata.rm_type")).stdout


def test_reward_key_on_the_lens_verbs_and_at_import(
    run: Callable[..., Result], pool_at: Callable[[], ArchiveManager], tmp_path: Path
) -> None:
    """``--reward-key`` reads that part of dict rewards in ``stats``, ``query`` and
    ``groups`` (which say which key they read); without one ``stats`` says how many samples
    gave no number and which keys there are; ``import-pt --reward-key`` keeps the key with
    the new archive (``show`` names it; the export holds PIL images, whence the trust)."""
    samples = _slime_rollout(12, seed=4)
    dicts = sum(isinstance(s.reward, dict) for s in samples)
    with pool_at() as pool:
        pool.save("slime", samples, rollout_id=5)
        pool.open_archive("slime").export_pt(tmp_path / "slime.pt")
    table = ok(run("stats", "--rollout-id", "5")).stdout
    assert f"note: {dicts} sample(s)" in table and "--reward-key" in table
    assert "acc, score" in table
    (row,) = as_json(run("stats", "--rollout-id", "5", "--reward-key", "score", "--json"))
    assert row["unscored"] == 0 and row["reward_keys"] == ["score"]
    assert row["rewarded"] == len(samples)
    assert "score" in ok(run("stats", "--rollout-id", "5", "--reward-key", "score")).stdout
    found = as_json(
        run("query", "--rollout-id", "5", "--min-reward", "1", "--reward-key", "acc", "--json")
    )
    assert found and {r["reward_key"] for r in found} == {"acc"}
    assert all(r["reward"] == 1 for r in found)
    groups = ok(run("groups", "slime", "--reward-key", "score")).stdout
    assert "rewards read with the key 'score'" in groups
    assert "note:" in ok(run("groups", "slime")).stdout
    done = ok(run("import-pt", str(tmp_path / "slime.pt"), "--name", "again", "--rollout-id", "6",
                  "--reward-key", "score", "--trust-pickle"))  # fmt: skip
    assert "again" in done.stdout
    assert as_json(run("show", "again", "--json"))["reward_key"] == "score"
    (row,) = as_json(run("stats", "--rollout-id", "6", "--json"))
    assert row["unscored"] == 0 and row["reward_keys"] == ["score"]
    assert "reward_key" in failed(run("stats", "--reward-key", ""))


def test_long_prompts_as_task_keys_are_shown_as_text(
    run: Callable[..., Result], pool_at: Callable[[], ArchiveManager]
) -> None:
    """A prompt over 255 bytes given as a task key: ``groups`` and ``prompts`` show the
    beginning of its text (``--json`` all of it), and ``prompts --task-key`` takes the text."""
    prompt = "Solve the following problem and explain each step. " * 8 + "What is 2 + 3?"
    with pool_at() as pool:
        pool.save("p1", [{"reward": 0.0}, {"reward": 1.0}], rollout_id=7, task_keys=[prompt] * 2)
        pool.save("p2", [{"reward": 1.0}, {"reward": 1.0}], rollout_id=8, task_keys=[prompt] * 2)
    table = ok(run("groups", "p1")).stdout
    assert "Solve the following problem and explain" in table and "sha256:" not in table
    (group,) = as_json(run("groups", "p1", "--json"))
    assert group["task_text"] == prompt and group["task_key"].startswith("sha256:")
    history = as_json(run("prompts", "--task-key", prompt, "--json"))
    assert [h["rollout_id"] for h in history] == [7, 8]
    (change,) = as_json(run("prompts", "--from", "7", "--to", "8", "--json"))
    assert change["task_text"] == prompt
    assert "Solve the following" in ok(run("prompts", "--from", "7", "--to", "8")).stdout
