"""Archive names and owners (`archive_manager._util.names`): new ones may hold no invisible or
terminal-active character and are stored in Unicode NFC, so the composed and decomposed
spellings of ``café`` name one archive (and one owner); what an older version stored
(decomposed, or holding a character refused now) stays reachable by its exact string."""

from __future__ import annotations

import os
import unicodedata
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import PoolSnapshot, older_version, open_on, snapshot_pool, tiny_rollout
from hypothesis import given, settings
from hypothesis import strategies as st

from archive_manager import ArchiveManager, RolloutArchive
from archive_manager._util.names import (
    check_archive_name,
    check_new_archive_name,
    check_new_owner,
    check_owner,
    name_spellings,
)
from archive_manager.cli import cli
from archive_manager.compat import archive_name_for
from archive_manager.errors import ArchiveExistsError, ArchiveNotFoundError, InvalidNameError

NFC = "caf\u00e9"  # é as one code point
NFD = "cafe\u0301"  # e + COMBINING ACUTE ACCENT: the same text to a reader

#: What a new name or owner may not hold, with the code point the error names.
INVISIBLE = {
    "C1 NEL": ("a\x85b", "U+0085"),
    "C1 CSI": ("old\x9b31m", "U+009B"),
    "right-to-left override": ("\u202erollout", "U+202E RIGHT-TO-LEFT OVERRIDE"),
    "left-to-right embedding": ("a\u202ab", "U+202A"),
    "right-to-left isolate": ("a\u2067b", "U+2067"),
    "pop directional isolate": ("ab\u2069c", "U+2069"),
    "right-to-left mark": ("a\u200fb", "U+200F"),
    "arabic letter mark": ("a\u061cb", "U+061C"),
    "zero width space": ("rollout-1\u200b", "U+200B ZERO WIDTH SPACE"),
    "zero width joiner": ("a\u200db", "U+200D"),
    "word joiner": ("a\u2060b", "U+2060"),
    "byte order mark": ("\ufeffrollout", "U+FEFF"),
    "line separator": ("a\u2028b", "U+2028"),
    "soft hyphen": ("roll\u00adout", "U+00AD"),
}


def test_nfc_and_nfd_are_one_text() -> None:
    assert NFC != NFD and unicodedata.normalize("NFC", NFD) == NFC
    assert check_new_archive_name(NFD) == NFC == check_new_archive_name(NFC)
    assert check_new_owner(f"checkpoint:{NFD}") == f"checkpoint:{NFC}"
    assert name_spellings(NFD) == [NFD, NFC]
    assert name_spellings(NFC) == [NFC, NFD]
    assert name_spellings("plain") == ["plain"]
    # Lookups keep the exact string: what an older version stored stays reachable.
    assert check_archive_name(NFD) == NFD and check_owner(f"q:{NFD}") == f"q:{NFD}"


@pytest.mark.parametrize("case", list(INVISIBLE))
def test_invisible_characters_are_refused_with_their_code_point(case: str) -> None:
    text, shown = INVISIBLE[case]
    for check, value in ((check_new_archive_name, text), (check_new_owner, f"checkpoint:{text}")):
        with pytest.raises(InvalidNameError, match="invisible or control character") as info:
            check(value)
        assert shown in str(info.value)
        # The message itself holds no invisible character: it reaches terminals as it is.
        assert str(info.value).isprintable()
    # What an older version may have stored stays a valid lookup.
    assert check_archive_name(text) == text
    assert check_owner(f"checkpoint:{text}") == f"checkpoint:{text}"


def test_normalising_cannot_sneak_past_the_length_limit() -> None:
    # U+0958 DEVANAGARI LETTER QA is a composition exclusion: NFC decomposes it into two
    # code points (3 -> 6 UTF-8 bytes), so 85 of them pass 255 bytes only once normalised.
    name = "\u0958" * 85
    assert len(name.encode()) == 255 and check_archive_name(name) == name
    with pytest.raises(InvalidNameError, match="the limit is 255"):
        check_new_archive_name(name)


@pytest.fixture
def sqlite_pool(tmp_path: Path) -> Iterator[tuple[ArchiveManager, PoolSnapshot]]:
    """A SQLite pool with archive ``a`` retained by ``checkpoint:keep``, and its snapshot."""
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        pool.retain("checkpoint:keep", "a")
        yield pool, snapshot_pool(pool)


@pytest.mark.parametrize("case", list(INVISIBLE))
def test_new_names_and_owners_with_invisible_characters_change_nothing(
    sqlite_pool: tuple[ArchiveManager, PoolSnapshot], case: str
) -> None:
    pool, before = sqlite_pool
    text, _ = INVISIBLE[case]
    calls = [
        lambda: pool.save(text, tiny_rollout(), rollout_id=1),
        lambda: pool.writer(text, rollout_id=1),
        lambda: pool.save(text, None, rollout_id=1, reference="a"),
        lambda: pool.retain(f"checkpoint:{text}", "a"),
    ]
    for call in calls:
        with pytest.raises(InvalidNameError):
            call()
    # Lookups of such a name are no error: nothing by that name is stored.
    with pytest.raises(ArchiveNotFoundError):
        pool.open_archive(text)
    assert pool.release_owner(f"checkpoint:{text}") == 0
    assert snapshot_pool(pool) == before


def test_both_spellings_of_cafe_name_one_archive(pool: ArchiveManager) -> None:
    arc = pool.save(NFD, tiny_rollout(2), rollout_id=1)
    assert arc.name == NFC  # stored in NFC
    for spelling in (NFC, NFD):
        assert pool.open_archive(spelling).name == NFC
        with pytest.raises(ArchiveExistsError):
            pool.save(spelling, tiny_rollout(2), rollout_id=2)
        with pytest.raises(ArchiveExistsError), pool.writer(spelling, rollout_id=2) as w:
            w.add(tiny_rollout(1)[0])
    assert [i.name for i in pool.find(state=None)] == [NFC]
    assert pool.open_archive(NFD).keys() == pool.open_archive(NFC).keys()

    # Owners too: one owner whichever way it is spelt.
    assert pool.retain(f"checkpoint:{NFD}", NFD) is True
    assert pool.retain(f"checkpoint:{NFC}", NFC) is False
    assert pool.open_archive(NFC).owners() == [f"archive:{NFC}", f"checkpoint:{NFC}"]
    plan = pool.release_plan(owner=f"checkpoint:{NFD}")
    assert plan.owner == f"checkpoint:{NFC}" and plan.archives == [NFC]
    assert pool.release_owner(f"checkpoint:{NFD}") == 1
    assert pool.open_archive(NFD).owners() == [f"archive:{NFC}"]
    assert pool.release_plan(name=NFD).owner == f"archive:{NFC}"
    assert pool.open_archive(NFD).release() is True
    assert pool.open_archive(NFC).state == "released"


def test_both_spellings_in_the_cli(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save(NFC, tiny_rollout(2), rollout_id=1)

    def run(*args: str) -> Any:
        result = CliRunner().invoke(cli, ["--root", str(root), *args])
        assert result.exit_code == 0, (result.output, result.exception)
        return result

    assert NFC in run("show", NFD).stdout
    run("retain", f"checkpoint:{NFD}", NFD)
    # release-owner plans first (without --yes): the plan must find the owner by either spelling.
    assert "retains 1 archive" in run("release-owner", f"checkpoint:{NFC}", "--dry-run").stdout
    run("release-owner", f"checkpoint:{NFC}", "--yes")
    run("release", NFD, "--yes")
    with ArchiveManager.open(root) as pool:
        assert pool.open_archive(NFC).state == "released"
        assert pool.open_archive(NFC).owners() == []


LEGACY_NAMES = [NFD, "\u202eold", "old\x9b31m", "zero\u200bwidth"]
LEGACY_OWNERS = [f"checkpoint:{NFD}", "checkpoint:\u200bx", "queue:\u2066q"]


def test_what_older_versions_stored_stays_reachable(
    tmp_path: Path, backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "pool"
    with open_on(backend, root) as pool:
        with older_version(monkeypatch):
            for i, name in enumerate(LEGACY_NAMES):
                pool.save(name, tiny_rollout(2, seed=i), rollout_id=i)
            for owner in LEGACY_OWNERS:
                pool.retain(owner, "zero\u200bwidth")

        for i, name in enumerate(LEGACY_NAMES):
            arc = pool.open_archive(name)
            assert arc.name == name and arc.rollout_id == i
        # Its NFC spelling finds the decomposed name, and cannot be saved beside it.
        assert pool.open_archive(NFC).name == NFD
        with pytest.raises(ArchiveExistsError):
            pool.save(NFC, tiny_rollout(2), rollout_id=9)
        assert pool.retain(f"checkpoint:{NFC}", "zero\u200bwidth") is False  # held as NFD
        assert pool.release_plan(owner="checkpoint:\u200bx").archives == ["zero\u200bwidth"]
        assert pool.release_owner("checkpoint:\u200bx") == 1
        assert pool.release_owner(f"checkpoint:{NFC}") == 1  # releases the NFD owner
        assert pool.open_archive("zero\u200bwidth").owners() == [
            "archive:zero\u200bwidth",
            "queue:\u2066q",
        ]
        assert pool.release_owner("queue:\u2066q") == 1
        for name in LEGACY_NAMES:
            assert pool.open_archive(name).release() is True
        assert {i.name: i.state for i in pool.find(state=None)} == dict.fromkeys(
            LEGACY_NAMES, "released"
        )


def test_both_spellings_stored_by_an_older_version_stay_apart(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two archives and two owners that an older version stored under the two spellings:
    each exact spelling finds its own."""
    with older_version(monkeypatch):
        pool.save(NFC, tiny_rollout(2, seed=1), rollout_id=1)
        pool.save(NFD, tiny_rollout(2, seed=2), rollout_id=2)
        pool.retain(f"checkpoint:{NFC}", NFC)
        pool.retain(f"checkpoint:{NFD}", NFC)
    assert pool.open_archive(NFC).rollout_id == 1
    assert pool.open_archive(NFD).rollout_id == 2
    assert pool.release_owner(f"checkpoint:{NFD}") == 1
    assert pool.open_archive(NFC).owners() == [f"archive:{NFC}", f"checkpoint:{NFC}"]


def test_legacy_names_in_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool, older_version(monkeypatch):
        pool.save("old\x9b31m", tiny_rollout(2), rollout_id=1)
    runner = CliRunner()
    for args in (["show", "old\x9b31m"], ["keys", "old\x9b31m"], ["release", "old\x9b31m", "-y"]):
        result = runner.invoke(cli, ["--root", str(root), *args])
        assert result.exit_code == 0, (result.output, result.exception)
        assert "\x9b" not in result.output
        assert args[0] == "keys" or "old\\x9b31m" in result.output
    with ArchiveManager.open(root) as pool:
        assert pool.open_archive("old\x9b31m").state == "released"


# --------------------------------------------------------------------------- pointer names


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=()), max_size=18))
def test_pointer_archive_names_are_valid_new_names(tail: str) -> None:
    """The facade's names pass this version's rules and are stored as they are (NFC), and
    they still percent-decode to the absolute path, so distinct paths keep distinct names."""
    path = "/r/" + tail
    name = archive_name_for(path)
    assert check_new_archive_name(name) == name
    assert urllib.parse.unquote(name, errors="surrogatepass") == os.path.abspath(Path(path))


def test_pointer_files_in_folders_of_any_spelling(tmp_path: Path) -> None:
    args = SimpleNamespace(archive_root=str(tmp_path / "pool"))
    paths = [
        tmp_path / NFC / "r.json",
        tmp_path / NFD / "r.json",  # another folder on Linux: another archive
        tmp_path / "zero\u200bwidth" / "r\u202e.json",
    ]
    names = []
    for i, path in enumerate(paths):
        assert RolloutArchive.save(path, tiny_rollout(2, seed=i), rollout_id=i, args=args) is None
        with RolloutArchive(path) as arc:
            names.append(arc.name)
            assert arc.name == archive_name_for(path)
    assert len(set(names)) == len(paths)
    for i, path in enumerate(paths):
        with RolloutArchive(path) as arc:
            assert arc.archive.rollout_id == i


@pytest.mark.parametrize(
    "char",
    ["\u034f", "\ufe0f", "\U000e0100", "\u3164", "\u115f", "\u2800"],
    ids=["CGJ", "VS16", "VS17", "hangul-filler", "choseong-filler", "braille-blank"],
)
def test_names_refuse_invisible_default_ignorable_characters(tmp_path: Path, char: str) -> None:
    """A hostile user saves `ckpt-1200` + an invisible character beside the real
    `ckpt-1200`: two archives that look identical in `ls`, the viewer and the terminal, and
    `release` of the one seen may hit the other.  Names refuse zero-width characters, but
    only by category (Cc, Cf, Cs, Zl, Zp): the combining grapheme joiner and variation
    selectors (Mn, zero width, Default_Ignorable_Code_Point) and the Hangul fillers / Braille
    blank (letters and symbols that render as nothing) pass.  Expected: InvalidNameError, as
    for U+200B."""
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("ckpt-1200", tiny_rollout(n=1), rollout_id=1)
        with pytest.raises(InvalidNameError):
            pool.save("ckpt-1200" + char, tiny_rollout(n=1, seed=2), rollout_id=1)
