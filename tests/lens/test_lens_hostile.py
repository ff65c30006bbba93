"""Review of issues 18, 19 and 23 (retention, search, summaries and paging): each test here
failed before its fix, on a real defect found by attacking the claims of README.md and
docs/architecture.md."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import tiny_rollout

from archive_manager import ArchiveManager
from archive_manager.cli import cli
from archive_manager.errors import InvalidInputError

pytest.importorskip("regex")

#: A pattern that recurses into itself without consuming anything: the regex module ran it
#: on the empty string with no time limit and ended in MemoryError after ~2 s and ~100 MB.
_SELF_RECURSION = "(?R)"


def _pool(tmp_path: Path) -> ArchiveManager:
    pool = ArchiveManager.open(tmp_path / "pool", create=True)
    samples = tiny_rollout(2, seed=1, r3_layers=0)
    samples[0].response = "plain text"
    samples[1].task_key = "\x1b[31mred"  # type: ignore[attr-defined]
    pool.save("r1", samples, rollout_id=1)
    return pool


def test_search_refuses_a_self_recursive_regex_with_a_clear_error(tmp_path: Path) -> None:
    """pool.search('(?R)', regex=True) raised a bare MemoryError (CLI: a traceback)."""
    with _pool(tmp_path) as pool, pytest.raises(InvalidInputError):
        pool.search(_SELF_RECURSION, regex=True)


def test_viewer_search_with_a_self_recursive_regex_is_a_400(tmp_path: Path) -> None:
    """/search?q=(?R)&regex=1 was a 500 (MemoryError) instead of a 400."""
    pytest.importorskip("flask")
    from archive_manager.web import create_app

    with _pool(tmp_path) as pool:
        client = create_app(pool).test_client()
        response = client.get("/search", query_string={"q": _SELF_RECURSION, "regex": "1"})
        assert response.status_code == 400


def test_csv_listing_keeps_escape_sequences_exactly(tmp_path: Path) -> None:
    """--format csv claims exact output, but click.echo stripped ANSI sequences from it when
    stdout is not a terminal: a task key '\\x1b[31mred' was exported as 'red'."""
    _pool(tmp_path).close()
    result = CliRunner().invoke(cli, ["--root", str(tmp_path / "pool"), "query", "--format", "csv"])
    assert result.exit_code == 0, result.output
    assert "\x1b[31mred" in result.output


def test_import_pt_takes_an_existing_file_whose_name_looks_like_a_glob(tmp_path: Path) -> None:
    """A dump named 'rollout[1].pt' was taken for a glob (its [1] a character class) that
    matches nothing: the file could not be imported by its own path."""
    pytest.importorskip("torch")
    with _pool(tmp_path) as pool:
        dump = tmp_path / "rollout[1].pt"
        pool.open_archive("r1").export_pt(dump)
    target = tmp_path / "other"
    ArchiveManager.open(target, create=True).close()
    result = CliRunner().invoke(cli, ["--root", str(target), "import-pt", str(dump)])
    assert result.exit_code == 0, result.output
    with ArchiveManager.open(target) as other:
        assert len(other.find()) == 1
