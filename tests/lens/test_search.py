"""Search (`pool.search`, ``archive-manager grep``, the viewer's /search): what it finds
against a brute-force scan (case folding, escaping, line handling, chat contents), the C and
Python prefilters, regular expressions (runaway, unbounded, empty-matching ones refused),
damaged chunks named by archive, limits, ranges and filters.  Each test states the claim it
holds the code to; a comment says what was wrong where a fix closed a break."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import local_store, tiny_rollout
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import archive_manager
from archive_manager import ArchiveManager
from archive_manager.cli import cli
from archive_manager.codec import chunk as chunk_module
from archive_manager.codec._accel import native_texts_holding
from archive_manager.codec.chunk import _HEAD, _INDEX2, BytesNeedle, _holding_py
from archive_manager.errors import (
    IntegrityError,
    InvalidInputError,
    SearchTimeoutError,
    UnsupportedFormatError,
)
from archive_manager.lens import search
from archive_manager.lens.search import _regex_literal, _text
from archive_manager.pool.archive import Archive

regex_module = pytest.importorskip("regex")

# Texts meant to trip case folding, escaping and line handling: the letters `re` folds from
# beyond ASCII (Kelvin sign, long s, dotted and dotless i), 'ß'/'SS', Greek sigmas,
# ligatures, combining marks (NFD) next to NFC, NUL, a lone surrogate, JSON's escapes,
# CRLF, a long text (stored as UTF-8 outside the JSON tree) and chat prompts.
TRICKY = [
    "Straße STRASSE strasse",
    "\u212aelvin KELVIN kelvin",
    "\u017ftop STOP",
    "\u0130stanbul ISTANBUL \u0131i",
    "\u03a3\u038a\u03a3\u03a5\u03a6\u039f\u03a3 \u03c3\u03af\u03c3\u03c5\u03c6\u03bf\u03c2",
    "\ufb01le FILE fi",
    "cafe\u0301 caf\u00e9",
    "first\r\nsecond\r\nthird",
    "a\x00b NUL",
    "x\ud800y lone surrogate",
    'quote " back \\ tab\tend',
    "ends with the needle",
    "multi\nline\ntext\n",
    "\u1e9e \u00df",
    "\u00b5 \u03bc \u039c",
    "x" * 600 + " LONG text with \u212a and \u017f and STRASSE",
    "",
]


def _tricky_samples() -> list[Any]:
    out: list[Any] = []
    for i, text in enumerate(TRICKY):
        prompt = f"prompt {i}: " + TRICKY[(i * 7 + 3) % len(TRICKY)]
        out.append({"prompt": prompt, "response": text, "tokens": [i], "task_key": f"t{i % 3}"})
    out.append(
        {
            "prompt": [
                {"role": "user", "content": "hello"},
                {"role": "assistant", "content": "world"},
            ],
            "response": "chat",
            "tokens": [1],
        }
    )
    return out


@pytest.fixture(scope="module")
def tricky(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ArchiveManager, list]]:
    root = tmp_path_factory.mktemp("search") / "pool"
    samples = _tricky_samples()
    with ArchiveManager.open(root, chunk_size=4) as pool:
        pool.save("a", samples, rollout_id=1)
        pool.save("b", samples[::-1], rollout_id=2, evaluation=True)
        yield pool, samples


def _brute(
    samples: list[Any], pattern: str, *, regex: bool, ignore_case: bool, fields: tuple[str, ...]
) -> list[tuple[int, str, int, int]]:
    """Every sample's first match, loaded whole and scanned with Python: the reference."""
    out = []
    for position, sample in enumerate(samples):
        for name in fields:
            text = _text(sample.get(name))
            if not text:
                continue
            if regex:
                m = regex_module.search(pattern, text, regex_module.I if ignore_case else 0)
            elif ignore_case:
                m = re.search(re.escape(pattern), text, re.I)
            else:
                at = text.find(pattern)
                m = None if at < 0 else re.compile(re.escape(pattern)).search(text, at)
            if m is not None:
                out.append((position, name, *m.span()))
                break
    return out


def _spans(pool: ArchiveManager, pattern: str, **kwargs: Any) -> list[tuple[int, str, int, int]]:
    """The matches of archive "a" with the span of each in its whole field (`_line` cuts)."""
    found = pool.search(pattern, names=["a"], limit=10_000, **kwargs).matches
    return [(m.position, m.field, m.start, m.end) for m in found]


def _check_against_brute(pool: ArchiveManager, samples: list, pattern: str, **kw: Any) -> None:
    regex, ignore_case = kw.get("regex", False), kw.get("ignore_case", False)
    fields = ("prompt", "response") if kw.get("fields", "all") == "all" else (kw["fields"],)
    if regex:
        try:
            compiled = regex_module.compile(pattern, regex_module.I if ignore_case else 0)
        except regex_module.error:
            with pytest.raises(InvalidInputError):
                pool.search(pattern, **kw)
            return
        want = _brute(samples, pattern, regex=True, ignore_case=ignore_case, fields=fields)
        if compiled.search("") is not None or any(s == e for *_, s, e in want):
            with pytest.raises(InvalidInputError, match="empty string"):
                pool.search(pattern, limit=10_000, **kw)
            return
    else:
        want = _brute(samples, pattern, regex=False, ignore_case=ignore_case, fields=fields)
    found = pool.search(pattern, names=["a"], limit=10_000, **kw).matches
    assert [(m.position, m.field) for m in found] == [w[:2] for w in want], (pattern, kw)
    for m, (position, name, start, end) in zip(found, want, strict=True):
        text = _text(samples[position][name])
        assert text is not None
        # the reported line holds the match where it says (unless cut around it)
        if "…" not in m.line:
            assert m.line[m.start : m.end] == text[start:end], (pattern, m)


# --------------------------------------------------------------------------- prefilter


# Claim: the C prefilter (`_native.texts_holding`) keeps exactly the parts `_holding_py`
# keeps: needle ASCII-folded or not, any of `also` byte for byte.
@pytest.mark.skipif(native_texts_holding is None, reason="the C extension is not built")
@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.binary(max_size=40), max_size=8),
    needle=st.binary(min_size=1, max_size=6),
    folded=st.booleans(),
    also=st.lists(st.binary(min_size=1, max_size=3), max_size=3),
)
def test_the_c_prefilter_agrees_with_the_python_rule(
    parts: list[bytes], needle: bytes, folded: bool, also: list[bytes]
) -> None:
    if folded:
        needle = needle.lower()
    assert native_texts_holding is not None
    native = native_texts_holding(parts, needle, folded, tuple(also))
    assert native == _holding_py(parts, needle, folded, tuple(also))
    # and on memoryviews of a bigger buffer, as `_text_batch` hands it raw text parts
    joined = b"".join(parts)
    views, at = [], 0
    for p in parts:
        views.append(memoryview(joined)[at : at + len(p)])
        at += len(p)
    assert native_texts_holding(views, needle, folded, tuple(also)) == native


# Claim: the prefilter never drops a real match, whatever the pattern's characters: a
# literal (exact or case-folded) and its escaped regex find what a brute-force scan of every
# loaded sample finds, with the reported line holding the match.
_PIECES = st.sampled_from(
    [
        "ß", "SS", "ss", "k", "K", "\u212a", "s", "S", "\u017f", "i", "I", "\u0130", "\u0131",
        "\u03c3", "\u03a3", "\u03c2", "fi", "\ufb01", "FI", "e\u0301", "\u00e9", "\r\n", "\r",
        "\n", "\x00", "\ud800", "\"", "\\", "\t", " ", "a", "e", "t", "x", "the", "line",
        "\u00b5", "\u039c", "\u1e9e", "hello\nworld", "o\nw", "end",
    ]
)  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pattern=st.lists(_PIECES, min_size=1, max_size=3).map("".join),
    ignore_case=st.booleans(),
    as_regex=st.booleans(),
    fields=st.sampled_from(["all", "prompt", "response"]),
)
def test_a_search_finds_what_a_brute_force_scan_finds(
    tricky: tuple[ArchiveManager, list],
    pattern: str,
    ignore_case: bool,
    as_regex: bool,
    fields: str,
) -> None:
    pool, samples = tricky
    _check_against_brute(
        pool,
        samples,
        re.escape(pattern) if as_regex else pattern,
        regex=as_regex,
        ignore_case=ignore_case,
        fields=fields,
    )


REGEX_CASES = [
    r"SS|ss",
    r"(kelvin)?\s",
    r"(abc){0}end",
    r"(?i)kelvin",
    r"(?i:STRASSE)",
    r"(?x) S T R A S S E  # comment",
    r"\x4bELVIN",
    r"[Kk\u212a]elvin",
    r"(\w)\1",
    r"(?<=first)\r\n",
    r"(?=ISTANBUL)IST",
    r"(?m)^second\r$",
    r"(?m)^line$",
    r"line\ntext",
    r"caf(e\u0301|\u00e9)",
    r"\bNUL\b",
    r"a\x00b",
    r"quote \" back",
    r"back \\\\ tab",
    r"x\ud800y",
    r"(?:the ){1}needle",
    r"needle$",
    r"^ends",
    r"\b",
    r"(?=hello)",
    r"S{2}E",
]


# Claim: regular expressions too (alternation, optional and {0} groups, inline flags,
# verbose mode, escapes, classes, backrefs, lookarounds, MULTILINE anchors): what the scan
# finds is what the brute-force scan finds; a pattern whose matches can be empty is refused.
@pytest.mark.parametrize("ignore_case", [False, True])
@pytest.mark.parametrize("pattern", REGEX_CASES)
def test_regular_expressions_find_what_a_brute_force_scan_finds(
    tricky: tuple[ArchiveManager, list], pattern: str, ignore_case: bool
) -> None:
    pool, samples = tricky
    _check_against_brute(pool, samples, pattern, regex=True, ignore_case=ignore_case)


def _regex_strategy() -> st.SearchStrategy[str]:
    atoms = st.sampled_from(
        ["a", "b", "ab", "A", r"\x61", r"\u0062", "[ab]", "[a]", ".", r"\d", r"\n", "\n",
         '"', r"\\", r"\b", "^", "$", r"\Z", "(?#c)", "ß", "K", " "]
    )  # fmt: skip

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, inner).map("".join),
            st.tuples(inner, inner).map(lambda t: f"(?:{t[0]}|{t[1]})"),
            st.tuples(inner, inner).map(lambda t: f"{t[0]}|{t[1]}"),
            st.tuples(
                inner, st.sampled_from(["?", "*", "+", "{0}", "{1}", "{2}", "{,2}", "*+", "??"])
            ).map(lambda t: f"({t[0]}){t[1]}"),
            inner.map(lambda t: f"(?={t})"),
            inner.map(lambda t: f"(?!{t})"),
            inner.map(lambda t: f"(?<=a){t}"),
            st.tuples(st.sampled_from("imsx"), inner).map(lambda t: f"(?{t[0]}:{t[1]})"),
            st.tuples(st.sampled_from("imsxa"), inner).map(lambda t: f"(?{t[0]}){t[1]}"),
            inner.map(lambda t: f"(?>{t})"),
            inner.map(lambda t: f"(a){t}(?(1)b|c)"),
            inner.map(lambda t: f"(?P<n>{t})(?P=n)"),
        )

    return st.recursive(atoms, extend, max_leaves=8)


# Claim: the literal a regular expression's prefilter looks for is in every text it matches.
@settings(max_examples=400, deadline=None)
@given(
    pattern=_regex_strategy(),
    texts=st.lists(st.text(alphabet='abAB\n"\\ 0ßsSK\u212a', max_size=12), max_size=20),
)
def test_every_match_of_a_regex_holds_its_prefilter_literal(pattern: str, texts: list) -> None:
    literal = _regex_literal(pattern)
    if literal is None:
        return
    try:
        compiled = regex_module.compile(pattern)
    except (regex_module.error, ValueError, OverflowError, RecursionError):
        return
    for text in texts:
        if compiled.search(text) is not None:
            assert literal in text, (pattern, literal, text)


# Claim: the Python path (ARCHIVE_MANAGER_NO_NATIVE=1: no C prefilter) finds the same.
def test_the_python_path_finds_what_the_native_path_finds(
    tricky: tuple[ArchiveManager, list],
) -> None:
    pool, _ = tricky
    cases: list[dict[str, Any]] = [
        {"pattern": p, "ignore_case": ic}
        for p in ("kelvin", "STRASSE", "ß", "\u212a", "\u017f", "i", "\r\n", '" back \\', "x")
        for ic in (False, True)
    ] + [{"pattern": r"(?m)^second\r$", "regex": True}, {"pattern": "S{2}E", "regex": True}]
    script = (
        "import json, sys\n"
        "from archive_manager import ArchiveManager\n"
        "from archive_manager.codec import chunk\n"
        "assert chunk._texts_holding is chunk._holding_py\n"
        "pool = ArchiveManager.open(sys.argv[1])\n"
        "out = [[(m.archive, m.position, m.field, m.line, m.start, m.end)\n"
        "        for m in pool.search(limit=10000, **kw).matches]\n"
        "       for kw in json.loads(sys.argv[2])]\n"
        "print(json.dumps(out))\n"
    )
    env = {
        **os.environ,
        "ARCHIVE_MANAGER_NO_NATIVE": "1",
        "PYTHONPATH": str(Path(archive_manager.__file__).parents[1]),
    }
    done = subprocess.run(
        [sys.executable, "-c", script, str(pool.root), json.dumps(cases)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    here = [
        [
            [m.archive, m.position, m.field, m.line, m.start, m.end]
            for m in pool.search(limit=10_000, **kw).matches
        ]
        for kw in cases
    ]
    assert json.loads(done.stdout) == here
    assert any(here)


# --------------------------------------------------------------------------- runaway regexes


# Claim: a regular expression that backtracks without end is stopped with a clear error.
# (The `regex` module finishes the classic ``(a+)+$``, ``(a*)*b`` and ``(\w+\s?)+$`` at
# once, with the right answer: no error is due for them.)
@pytest.mark.parametrize("pattern", [r"(a|aa)+$", r"(a|a)+$", r"(?:a|a)+(?:b|c)"])
def test_a_runaway_regex_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pattern: str
) -> None:
    monkeypatch.setattr(search, "_PER_TEXT", 0.2)
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("a", [{"response": "a" * 40 + "!", "tokens": [1]}], rollout_id=1)
        for tame in (r"(a+)+$", r"(a*)*b", r"(\w+\s?)+$"):
            assert pool.search(tame, regex=True, timeout=30).matches == []
        with pytest.raises(SearchTimeoutError, match="backtracks"):
            pool.search(pattern, regex=True, timeout=30)
        # the CLI: one line, non-zero exit, no traceback
        done = CliRunner().invoke(
            cli, ["--root", str(tmp_path / "pool"), "grep", "-E", pattern, "--timeout", "30"]
        )
        assert done.exit_code != 0 and "Traceback" not in done.output
        assert len(done.output.strip().splitlines()) == 1, done.output


# Claim: a regular expression that would run away is bounded with a clear error.  Fixed:
# the `regex` module unrolls counted repeats when it compiles, which no timeout bounds:
# ``(?:x{65535}){65535}`` took gigabytes and never finished (one viewer request could take
# the server down), ``(?:a{1000}){1000}`` 0.7 s and 280 MB.
@pytest.mark.parametrize(
    "pattern",
    [
        r"(?:x{65535}){65535}",
        r"(?:(?:a{1000}){1000}){1000}",
        r"(?:a{1000,}){1000}",
        r"(?:\p{L}{1000}){1000}",  # syntax `re` does not read: counted from the text
        r"(?:ab|cd){100000}",
    ],
)
def test_a_regex_that_unrolls_without_bound_is_refused(tmp_path: Path, pattern: str) -> None:
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("a", [{"response": "x" * 10}], rollout_id=1)
        with pytest.raises(InvalidInputError, match="repeats too much"):
            pool.search(pattern, regex=True)
        # ordinary counted repeats still run
        for fine in (r"x{10}", r"\d{4}-\d{2}-\d{2}|x{3}", r"(?:x{5}){2}", r"[\s\S]{65535}"):
            pool.search(fine, regex=True)


# --------------------------------------------------------------------------- damaged chunks


def _forge(mutate: Callable[[bytearray], bytearray]) -> Callable[..., bytes]:
    real = Archive._read_blob

    def read(self: Archive, digest: str, what: str) -> bytes:
        return bytes(mutate(bytearray(real(self, digest, what))))

    return read


def _set_entry(field: int, value: int, record: int = 2) -> Callable[[bytearray], bytearray]:
    def mutate(data: bytearray) -> bytearray:
        at = _HEAD.size + record * _INDEX2.size
        values = list(_INDEX2.unpack_from(data, at))
        values[field] = value
        _INDEX2.pack_into(data, at, *values)
        return data

    return mutate


def _set(fmt: str, at: int, value: int) -> Callable[[bytearray], bytearray]:
    def mutate(data: bytearray) -> bytearray:
        struct.pack_into(fmt, data, at, value)
        return data

    return mutate


# Claim: damage is a clear error naming the archive, never wrong results or a crash.  A chunk
# passes its digest check before it is parsed, so these forge what the reader is handed (a
# blob store that lies, or a bug): an index entry pointing outside, bad lengths, an unknown
# compression, a header refused.  Fixed: the last two named only the blob (the reader was
# made outside the try, and UnsupportedFormatError is no IntegrityError).
@pytest.mark.parametrize(
    ("mutate", "error"),
    [
        (_set_entry(0, 10**12), IntegrityError),  # record offset past the end
        (_set_entry(0, 2**64 - 1), IntegrityError),
        (_set_entry(0, _HEAD.size), IntegrityError),  # pointing into the index
        (_set_entry(1, 2**63), IntegrityError),  # text stored length
        (_set_entry(3, 2**64 - 1), IntegrityError),  # rest stored length
        (_set_entry(2, 2**40), IntegrityError),  # text raw length
        (_set_entry(2, 0), IntegrityError),
        (_set_entry(5, 0), IntegrityError),  # text "stored raw", with the wrong length
        (_set_entry(5, 7), UnsupportedFormatError),  # unknown compression
        (_set("<H", 8, 3), UnsupportedFormatError),  # format version 3
        (_set("<I", 12, 2**32 - 1), IntegrityError),  # index longer than the blob
        (lambda data: data[: _HEAD.size], IntegrityError),  # truncated after the header
        (lambda data: bytearray(), IntegrityError),  # empty
        (lambda data: bytearray(b"NOTCHUNK") + data[8:], UnsupportedFormatError),  # bad magic
    ],
    ids=[
        "offset-past-end",
        "offset-max",
        "offset-into-index",
        "text-stored-huge",
        "rest-stored-huge",
        "text-raw-huge",
        "text-raw-zero",
        "raw-text-wrong-length",
        "unknown-compression",
        "version-3",
        "index-past-end",
        "header-only",
        "empty",
        "bad-magic",
    ],
)
def test_a_forged_chunk_is_an_error_naming_the_archive(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mutate: Callable[[bytearray], bytearray],
    error: type[Exception],
) -> None:
    with ArchiveManager.open(tmp_path / "pool") as pool:
        samples = [{"prompt": f"p{i}", "response": f"the answer {i} " * 30} for i in range(6)]
        pool.save("named-archive", samples, rollout_id=1)
        monkeypatch.setattr(Archive, "_read_blob", _forge(mutate))
        cases: list[tuple[str, dict[str, Any]]] = [
            ("answer 2", {}),
            ("ANSWER 2", {"ignore_case": True}),
            (r"answer\s2", {"regex": True}),
        ]
        for pattern, kwargs in cases:
            with pytest.raises(error, match="archive 'named-archive', chunk 0"):
                pool.search(pattern, **kwargs)


# Claim: a truncated or missing chunk blob is an error naming the archive.
def test_a_truncated_or_missing_chunk_names_the_archive(tmp_path: Path) -> None:
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("arc", [{"response": f"answer {i}"} for i in range(5)], rollout_id=1)
        path = local_store(pool).path(pool.open_archive("arc").chunks()[0]["digest"])
        data = path.read_bytes()
        path.chmod(0o644)
        path.write_bytes(data[: len(data) // 2])
        cases: list[dict[str, Any]] = [{}, {"ignore_case": True}]
        for options in cases:
            with pytest.raises(IntegrityError, match="archive 'arc', chunk 0"):
                pool.search("answer", **options)
        path.unlink()

        with pytest.raises(IntegrityError, match="archive 'arc', chunk 0"):
            pool.search("answer")


# Claim: a search reads the contents of chat messages.  Fixed: a message whose content is a
# list of content parts (the OpenAI form, [{"type": "text", "text": ...}], which the viewer
# shows) was never searched.
def test_chat_content_parts_are_searched(tmp_path: Path) -> None:
    prompt = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "what is in the picture?"},
                                     {"type": "image_url", "image_url": {"url": "x"}}]},
    ]  # fmt: skip
    response = [{"role": "assistant", "content": [{"type": "text", "text": "a zebra"}]}]
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("a", [{"prompt": prompt, "response": response, "tokens": [1]}], rollout_id=1)
        (found,) = pool.search("the picture").matches
        assert (found.field, found.line_number, found.line) == (
            "prompt",
            2,
            "what is in the picture?",
        )
        assert [m.field for m in pool.search("ZEBRA", ignore_case=True).matches] == ["response"]
        assert pool.search("image_url").matches == []  # the parts' other keys are no text


# Claim: a search reads the texts of a prompt whose content parts hold an image (a numpy
# array above the inline limit, stored as a blob of its own).  Fixed: the search's chunk
# reader had no array loader, so one such sample failed every search of its pool
# ("needs an array_loader"), and `field_values("prompt")` too.
def test_a_prompt_holding_an_array_blob_is_searched(tmp_path: Path) -> None:
    import numpy as np

    image = np.arange(3 * 64 * 64, dtype=np.uint8).reshape(64, 64, 3)  # above the limit
    prompt = [
        {"role": "user", "content": [{"type": "image", "image": image},
                                     {"type": "text", "text": "what is in the picture?"}]},
    ]  # fmt: skip
    with ArchiveManager.open(tmp_path / "pool", inline_limit=1024) as pool:
        arc = pool.save("a", [{"prompt": prompt, "response": "a zebra"}], rollout_id=1)
        (found,) = pool.search("the picture").matches
        assert (found.field, found.line) == ("prompt", "what is in the picture?")
        assert [m.field for m in pool.search("zebra").matches] == ["response"]
        (value,) = arc.field_values("prompt")
        assert np.array_equal(value[0]["content"][0]["image"], image)


# --------------------------------------------------------------------------- lines, limits


# Claim: the matched line is reported right for matches at the start and end of a text,
# over several lines, and in CRLF text.  Fixed: a CRLF line was shown with its "\r".
def test_the_matched_line(tmp_path: Path) -> None:
    texts = ["needle at the start", "at the end: needle", "one\r\ntwo needle\r\nthree", "x\nneedle"]
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("a", [{"response": t} for t in texts], rollout_id=1)
        found = pool.search("needle").matches
        got = [(m.line_number, m.line, m.line[m.start : m.end]) for m in found]
        assert got == [
            (1, "needle at the start", "needle"),
            (1, "at the end: needle", "needle"),
            (2, "two needle", "needle"),
            (2, "needle", "needle"),
        ]
        multi = pool.search(r"two needle\r\nth", regex=True).matches
        assert [(m.line_number, m.line[m.start : m.end]) for m in multi] == [
            (2, "two needle\r\nth")
        ]
        assert multi[0].line == "two needle\r\nthree"
        long = "y" * 1000 + "needle" + "z" * 1000
        pool.save("b", [{"response": long}], rollout_id=2)
        (cut,) = pool.search("needle", rollout_ids=(2, 2)).matches
        assert cut.line.startswith("…") and cut.line.endswith("…")
        assert cut.line[cut.start : cut.end] == "needle"


# Claim: limit, rollout ranges, evaluation and field filters narrow a search; a huge limit
# is a clear error (library: InvalidInputError, CLI: one line, viewer: 400).
def test_limits_ranges_and_filters(tricky: tuple[ArchiveManager, list]) -> None:
    pool, _ = tricky
    both = pool.search("kelvin", ignore_case=True, limit=10_000).matches
    assert {m.archive for m in both} == {"a", "b"}
    assert {m.archive for m in pool.search("kelvin", evaluation=True).matches} == {"b"}
    assert {m.archive for m in pool.search("kelvin", rollout_ids=(1, 1)).matches} == {"a"}
    assert pool.search("kelvin", rollout_ids=(3, None)).matches == []
    one = pool.search("e", limit=1)
    assert len(one.matches) == 1 and one.limited
    assert pool.search("hello", fields="response").matches == []
    assert pool.search("hello\nworld", fields="prompt").matches  # chat messages, one per line
    # a match never spans the prompt's end and the response's start
    for pattern in ("worldchat", "world\nchat", "hello\nworld\nchat"):
        assert pool.search(pattern).matches == [], pattern
    assert pool.search(r"world\s*chat", regex=True).matches == []
    for limit in (0, -1, 10**30, 10_001, True, 1.5):
        with pytest.raises(InvalidInputError, match="limit"):
            pool.search("e", limit=limit)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        pool.search("e", rollout_ids=(5, 1))
    runner = CliRunner()
    for args in (["--limit", str(10**30)], ["--limit", "0"], ["--rollout-id", "5..1"]):
        done = runner.invoke(cli, ["--root", str(pool.root), "grep", "e", *args])
        assert done.exit_code != 0 and "Traceback" not in done.output, (args, done.output)


# --------------------------------------------------------------------------- empty matches


@pytest.fixture
def client(tmp_path: Path) -> Iterator[tuple[Any, ArchiveManager]]:
    """The viewer's test client on a pool of two archives of eight samples each."""
    pytest.importorskip("flask")
    from archive_manager.web import create_app

    pool = ArchiveManager.open(tmp_path / "pool")
    samples = [
        {"prompt": f"q{i // 2}", "response": f"<b>alert</b> {i}", "task_key": f"k{i // 2}"}
        for i in range(8)
    ]
    pool.save("r1", samples, rollout_id=1)
    pool.save("r2", samples, rollout_id=2)
    try:
        yield create_app(pool).test_client(), pool
    finally:
        pool.close()


# Claim: a regular expression whose match is empty finds nothing: refused as one matching the
# empty text is.  Fixed: ``\b`` and lookarounds passed the check against "" and then
# "matched" every sample with an empty match.
@pytest.mark.parametrize("pattern", [r"\b", r"(?=a)", r"(?<=l)", r"\B"])
def test_a_regex_matching_only_empty_strings_is_refused(
    client: tuple[Any, ArchiveManager], pattern: str
) -> None:
    app, pool = client
    with pytest.raises(InvalidInputError, match="empty string"):
        pool.search(pattern, regex=True)
    page = app.get("/search", query_string={"q": pattern, "regex": "1", "format": "json"})
    assert page.status_code == 400 and "empty string" in page.json["error"]


# Claim: the Python and C prefilters are the same object the search uses (no test above
# would notice a search that silently bypassed the prefilter it claims to use).
def test_the_search_uses_the_prefilter(tricky: tuple[ArchiveManager, list]) -> None:
    pool, _ = tricky
    calls: list[int] = []
    real = chunk_module._texts_holding

    def counted(parts: Any, needle: bytes, folded: bool, also: tuple[bytes, ...]) -> list[int]:
        calls.append(len(parts))
        return list(real(parts, needle, folded, also))

    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(chunk_module, "_texts_holding", counted)
        assert pool.search("kelvin", ignore_case=True).matches
        assert calls
        needle = search._prefilter("KELVIN", False, True)
        beyond = tuple(sorted(c.encode() for c in "\u0130\u0131\u212a"))  # folds of i and k
        assert needle == BytesNeedle(b"kelvin", folded=True, also=beyond)
    finally:
        mp.undo()


#: A pattern that recurses into itself without consuming anything: the regex module ran it
#: on the empty string with no time limit and ended in MemoryError after ~2 s and ~100 MB.
_SELF_RECURSION = "(?R)"


def _rendered_pool(tmp_path: Path) -> ArchiveManager:
    pool = ArchiveManager.open(tmp_path / "pool", create=True)
    samples = tiny_rollout(2, seed=1, r3_layers=0)
    samples[0].response = "plain text"
    samples[1].task_key = "\x1b[31mred"  # type: ignore[attr-defined]
    pool.save("r1", samples, rollout_id=1)
    return pool


def test_search_refuses_a_self_recursive_regex_with_a_clear_error(tmp_path: Path) -> None:
    """pool.search('(?R)', regex=True) raised a bare MemoryError (CLI: a traceback)."""
    with _rendered_pool(tmp_path) as pool, pytest.raises(InvalidInputError):
        pool.search(_SELF_RECURSION, regex=True)


def test_viewer_search_with_a_self_recursive_regex_is_a_400(tmp_path: Path) -> None:
    """/search?q=(?R)&regex=1 was a 500 (MemoryError) instead of a 400."""
    pytest.importorskip("flask")
    from archive_manager.web import create_app

    with _rendered_pool(tmp_path) as pool:
        client = create_app(pool).test_client()
        response = client.get("/search", query_string={"q": _SELF_RECURSION, "regex": "1"})
        assert response.status_code == 400
