"""What the CLI prints for people is safe for a terminal, and its durations stay in range.

A pool holds text its writers chose: task keys, statuses and attrs may hold any character,
and archive names and owners stored by older versions may hold C1 controls, bidi overrides
and zero-width characters.  Tables, field lists, plain lines, prompts and error messages
show all of them as escapes (``\\x1b``, ``\\u202e``); ``--json`` stays exact.  The runs use
``color=True``: click strips CSI sequences from output that is not a terminal, which would
hide a leak that a terminal receives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from helpers import older_version, tiny_rollout

from archive_manager import ArchiveManager
from archive_manager._util.names import INVISIBLE_CATEGORIES
from archive_manager.cli import cli
from archive_manager.cli._output import echo_json, terminal_safe
from archive_manager.cli._params import parse_duration

EVIL = "\x1b]0;pwned\x07\x1b[2J"  # retitle the terminal, then clear it
EVIL_SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J"
TASK_KEY = EVIL + "\tTAB\nNL"
LEGACY_NAME = "old\u202eevil\x9b31m"  # a right-to-left override and an 8-bit CSI
LEGACY_SHOWN = "old\\u202eevil\\x9b31m"
GONE = "gone\u200b"  # released, so gc lists it
LEGACY_OWNER = "checkpoint:\u200bx\u2066"
OWNER_SHOWN = "checkpoint:\\u200bx\\u2066"


def unsafe(text: str) -> list[str]:
    """The characters of ``text`` that would act on a terminal (newlines end lines)."""
    return [c for c in text if c != "\n" and unicodedata.category(c) in INVISIBLE_CATEGORIES]


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "pool"
    samples = [
        {"index": i, "tokens": [1, 2, 3], "status": EVIL, "reward": 1.0, "response_length": 2}
        for i in range(2)
    ]
    with ArchiveManager.open(path) as pool:
        pool.save(
            "hostile",
            samples,
            rollout_id=1,
            task_keys=[TASK_KEY, TASK_KEY],
            attrs={"note": EVIL, "tab": "a\tb"},
        )
        with older_version(monkeypatch):
            pool.save(LEGACY_NAME, tiny_rollout(2), rollout_id=2)
            pool.save(GONE, tiny_rollout(2, seed=1), rollout_id=3)
            pool.retain(LEGACY_OWNER, LEGACY_NAME)
        pool.open_archive(GONE).release()
    return path


@pytest.fixture
def run(root: Path) -> Callable[..., Result]:
    def _run(*args: str, input: str | None = None) -> Result:
        return CliRunner().invoke(cli, ["--root", str(root), *args], input=input, color=True)

    return _run


def clean(result: Result, code: int = 0) -> Result:
    """Assert the exit code, no traceback, and nothing unsafe on stdout or stderr."""
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert unsafe(result.stdout) == [] and unsafe(result.stderr) == []
    return result


# --------------------------------------------------------------------------- the helpers


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b[31m", "\\x1b[31m"),
        ("\x07\x00\x7f", "\\x07\\x00\\x7f"),
        ("a\tb\nc\rd", "a\\tb\\nc\\rd"),
        ("\x85\x9b", "\\x85\\x9b"),
        ("\u202a\u202b\u202c\u202d\u202e", "\\u202a\\u202b\\u202c\\u202d\\u202e"),
        ("\u2066\u2067\u2068\u2069", "\\u2066\\u2067\\u2068\\u2069"),
        ("\u200e\u200f\u061c", "\\u200e\\u200f\\u061c"),
        ("\u200b\u200c\u200d\u2060\ufeff", "\\u200b\\u200c\\u200d\\u2060\\ufeff"),
        ("\u2028\u2029", "\\u2028\\u2029"),
        ("\udcff\ud800", "\\udcff\\ud800"),
        ("\U000e0001", "\\U000e0001"),
        ("café データ \U0001f9ea ~ \\x1b", "café データ \U0001f9ea ~ \\x1b"),  # unchanged
    ],
)
def test_terminal_safe(text: str, shown: str) -> None:
    assert terminal_safe(text) == shown
    assert unsafe(shown) == []
    assert terminal_safe(shown) == shown  # escaping twice changes nothing
    assert terminal_safe(3) == "3"


def test_json_escapes_what_json_dumps_leaves_raw(capsys: pytest.CaptureFixture[str]) -> None:
    value = {
        "name": "a\x1b\x7f\x85\u202e\u200b\ufeff\u2028é",
        "lone": "\udcff",
        "tag": "\U000e0001",
        "key\u2066": ["\t\n"],
    }
    echo_json(value)
    out = capsys.readouterr().out
    assert unsafe(out) == []
    assert json.loads(out) == value
    assert "é" in out  # readable text stays readable


# --------------------------------------------------------------------------- every verb


def test_every_listing_shows_escapes(run: Callable[..., Result]) -> None:
    assert LEGACY_SHOWN in clean(run("ls")).stdout
    assert GONE.replace("\u200b", "\\u200b") in clean(run("ls", "--state", "all")).stdout

    shown = clean(run("show", "hostile")).stdout
    assert f"1 {EVIL_SHOWN}" not in shown and f"2 {EVIL_SHOWN}" in shown  # the status line
    # attrs are shown as JSON, whose escapes (\u001b) are as inert as the table's (\x1b).
    attrs_line = shown.split("attrs", 1)[1].splitlines()[0]
    assert '"note": "\\u001b]0;pwned\\u0007\\u001b[2J"' in attrs_line
    assert '"tab": "a\\tb"' in attrs_line and "\x1b" not in attrs_line
    assert LEGACY_SHOWN in clean(run("show", LEGACY_NAME)).stdout
    assert OWNER_SHOWN in clean(run("show", LEGACY_NAME)).stdout

    keys = clean(run("keys", "hostile")).stdout.splitlines()
    assert len(keys) == 3  # a tab or newline in a key does not break the table
    assert keys[1].split() == ["0", "sample:0", EVIL_SHOWN + "\\tTAB\\nNL"]

    query = clean(run("query")).stdout
    assert len(query.splitlines()) == 1 + 4  # two samples in each published archive
    assert EVIL_SHOWN + "\\tTAB\\nNL" in query and LEGACY_SHOWN in query
    assert EVIL_SHOWN in clean(run("stats")).stdout
    assert OWNER_SHOWN in clean(run("owners")).stdout
    clean(run("info"))
    clean(run("verify"))


def test_previews_confirmations_and_reports_show_escapes(run: Callable[..., Result]) -> None:
    assert LEGACY_SHOWN in clean(run("release", LEGACY_NAME, "--dry-run")).stdout
    assert LEGACY_SHOWN in clean(run("release", LEGACY_NAME), 1).stderr  # no input: aborted
    preview = clean(run("release-owner", LEGACY_OWNER, "--dry-run")).stdout
    assert OWNER_SHOWN in preview and LEGACY_SHOWN in preview
    prompt = clean(run("release-owner", LEGACY_OWNER, input="n\n"), 1).stderr
    assert f"Release owner {OWNER_SHOWN}?" in prompt
    plan = clean(run("gc", "--grace", "0", "--dry-run")).stdout
    assert "gone\\u200b" in plan
    assert "gone\\u200b" in clean(run("gc", "--grace", "0", "--yes")).stdout
    assert OWNER_SHOWN in clean(run("release-owner", LEGACY_OWNER, "--yes")).stdout
    # An owner that holds nothing is echoed back as typed: escaped too.
    assert OWNER_SHOWN in clean(run("release-owner", LEGACY_OWNER, "--yes")).stdout


def test_json_stays_exact(run: Callable[..., Result]) -> None:
    def parsed(*args: str) -> Any:
        return json.loads(clean(run(*args, "--json")).stdout)

    assert {a["name"] for a in parsed("ls", "--state", "all")} == {"hostile", LEGACY_NAME, GONE}
    assert [k["task_key"] for k in parsed("keys", "hostile")] == [TASK_KEY, TASK_KEY]
    shown = parsed("show", "hostile")
    assert shown["attrs"] == {"note": EVIL, "tab": "a\tb"}
    assert shown["metadata"]["status"] == {EVIL: 2}
    assert LEGACY_OWNER in parsed("show", LEGACY_NAME)["owners"]
    assert LEGACY_OWNER in {o["owner"] for o in parsed("owners")["owners"]}
    assert {r["status"] for r in parsed("query", "--task-key", TASK_KEY)} == {EVIL}
    assert parsed("release", LEGACY_NAME, "--dry-run")["archive"] == LEGACY_NAME


def test_errors_echo_the_users_text_escaped(run: Callable[..., Result], tmp_path: Path) -> None:
    def error(result: Result, code: int) -> str:
        assert "Traceback" not in clean(result, code).output
        return result.stderr

    # The library's errors and the CLI's own.
    assert "x\\u202ey" in error(run("show", "x\u202ey"), 1)
    dump = tmp_path / "dump.pt"
    clean(run("export", LEGACY_NAME, str(dump)))
    assert "a\\u202e" in error(run("import-pt", str(dump), "--name", "a\u202e"), 1)
    exists = tmp_path / f"out{EVIL}.pt"
    exists.write_bytes(b"")
    assert f"out{EVIL_SHOWN}.pt exists" in error(run("export", "hostile", str(exists)), 1)
    assert "\\u202e" in error(run("retain", "checkpoint:\u202e", "hostile"), 1)
    # Click's usage errors, before and after the verb.
    assert "\\x1b" in error(run(f"frob{EVIL}"), 2)
    assert "\\x1b" in error(run("ls", "--state", EVIL), 2)
    assert "\\x9b" in error(run("ls", "--since", "\x9b"), 2)
    assert "\\x1b" in error(CliRunner().invoke(cli, [f"--bogus{EVIL}"], color=True), 2)
    assert "\\x1b" in error(run("import-pt", str(tmp_path / f"no{EVIL}.pt")), 2)


def test_subprocess_shows_escape_sequences_escaped(root: Path) -> None:
    """The console script on a pipe: what a name or key holds never reaches it raw."""
    worktree = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARCHIVE_MANAGER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(worktree), env.get("PYTHONPATH", "")])
    script = Path(sys.executable).with_name("archive-manager")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "archive_manager.cli"]
    for args, expected in ((["ls"], LEGACY_SHOWN), (["keys", "hostile"], EVIL_SHOWN)):
        done = subprocess.run(
            [*command, "--root", str(root), *args], env=env, capture_output=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        out = done.stdout.decode("utf-8")
        assert expected in out
        for raw in ("\x1b", "\x07", "\x9b", "\u202e"):
            assert raw not in out


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize("text", ["99999999999d", "1000000000d", "1" * 400 + "s", "9" * 30 + "w"])
def test_durations_past_a_timedelta_are_value_errors(text: str) -> None:
    with pytest.raises(ValueError, match="too long a duration"):
        parse_duration(text)


def test_durations_at_the_limit_parse() -> None:
    assert parse_duration("999999999d").days == 999999999


@pytest.mark.parametrize(
    "args",
    [
        ["gc", "--grace", "99999999999d", "--dry-run"],
        ["gc", "--grace", "1" * 400 + "s", "--yes"],
        ["ls", "--since", "99999999d"],
        ["ls", "--since", "9" * 30 + "d"],
        ["ls", "--since", "0001-01-01T00:00+14:00"],  # before the year 1 in every other zone
    ],
    ids=lambda a: " ".join(a)[:30],
)
def test_durations_out_of_range_are_usage_errors(run: Callable[..., Result], args: list) -> None:
    result = clean(run(*args), 2)
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and ("--grace" in errors[0] or "--since" in errors[0]), errors


def test_help_lists_the_verbs_by_task_with_a_place_to_start() -> None:
    from archive_manager.cli import VERB_SECTIONS

    placed = [verb for _, verbs in VERB_SECTIONS for verb in verbs]
    assert sorted(placed) == sorted(cli.commands), "place every verb in VERB_SECTIONS once"
    out = clean(CliRunner().invoke(cli, ["--help"])).stdout
    titles = [line for line in out.splitlines() if line and not line.startswith(" ")]
    assert titles[-len(VERB_SECTIONS) :] == [f"{title}:" for title, _ in VERB_SECTIONS]
    assert out.index("Start here:") < out.index("  demo ") < out.index("  gc ")
