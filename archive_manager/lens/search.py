"""Text search over the samples of a pool (docs/architecture/search.md, "Search"): the prompt and
response of every sample of the published archives chosen, scanned chunk by chunk.

The scan reads only the text fields of each record (`ChunkReader.fields`): of a chunk of
format version 2, only each record's text part is inflated (docs/architecture/chunk-format.md,
"Chunk format"); of a version 1 chunk the whole record, whose tree is then parsed.  Token ids,
log-probs and tensors are never decoded, and tensor blobs never read.  Every chunk is read through the blob store, so what a
search sees is checked against its digest like any load.  Memory stays bounded: at most a
few chunks are in flight, and at most ``limit`` matches are kept.

Patterns: a literal (the default) is searched as it is (``ignore_case`` folds case); a regular
expression (``regex=True``) runs in the `regex` module with a time limit per text, so a
pattern that backtracks without end (``(a|aa)+$``) stops with `SearchTimeoutError` instead of
holding a thread (and a viewer's worker) for ever; Python's `re` cannot be interrupted.  A
search that reaches its own ``timeout`` returns what it found so far (`SearchResult.timed_out`).
"""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from .._util.constants import DEFAULT_SEARCH_TIMEOUT, MAX_SEARCH_LIMIT
from .._util.threads import Helpers
from ..catalog import archives_table, chunks_table, entries_table, sample_metadata_table
from ..codec import ChunkReader
from ..codec.chunk import BytesNeedle
from ..errors import (
    IntegrityError,
    InvalidInputError,
    MissingDependencyError,
    SearchTimeoutError,
    UnsupportedFormatError,
    extra_hint,
)
from ..pool.archive import Archive
from .stats import archive_filters, check_rollout_range

if TYPE_CHECKING:
    from ..pool.context import PoolContext

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_LIMIT",
    "MAX_PATTERN",
    "SEARCH_FIELDS",
    "SearchMatch",
    "SearchResult",
    "search_pool",
]

#: The fields a search reads, in the order they are tried.
SEARCH_FIELDS = ("prompt", "response")
#: Most matches one search returns (memory is bounded by it).
MAX_LIMIT = MAX_SEARCH_LIMIT
#: Longest pattern accepted (characters).
MAX_PATTERN = 1_000
#: Default time limit of a search, in seconds.
DEFAULT_TIMEOUT = DEFAULT_SEARCH_TIMEOUT
#: Characters of the matched line kept on either side of the match.
LINE_CONTEXT = 120
#: Seconds one text may take a regular expression: a sane pattern needs microseconds for a
#: response; past this it is backtracking without end (see `_finder`).
_PER_TEXT = 2.0
#: Seconds the check against the empty text may take: a sane pattern needs microseconds.
_EMPTY_TEXT = 0.25
#: Chunks read and scanned ahead of the one whose matches are being collected.
_AHEAD = 4
_WORKERS = 2


@dataclass(frozen=True)
class SearchMatch:
    """One sample whose text matched: where it is, its keys and reward, and the line."""

    archive: str
    rollout_id: int | None
    evaluation: bool
    position: int
    sample_key: str
    task_key: str | None
    reward: float | None
    status: str | None
    field: str
    line_number: int  # 1-based, in the field's text
    line: str  # the matched line, cut to LINE_CONTEXT characters around the match
    start: int  # where the match begins in ``line``
    end: int

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class SearchResult:
    """The matches (in archive, then position order) and what the search read."""

    pattern: str
    regex: bool
    fields: tuple[str, ...]
    matches: list[SearchMatch] = field(default_factory=list)
    archives: int = 0  # archives scanned
    samples: int = 0  # samples scanned
    bytes_read: int = 0  # chunk bytes read
    limited: bool = False  # stopped at the limit: more samples may match
    timed_out: bool = False  # stopped at the time limit: later archives were not scanned
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "pattern": self.pattern,
            "regex": self.regex,
            "fields": list(self.fields),
            "archives": self.archives,
            "samples_scanned": self.samples,
            "bytes_read": self.bytes_read,
            "limited": self.limited,
            "timed_out": self.timed_out,
            "seconds": self.seconds,
            "matches": [m.as_dict() for m in self.matches],
        }


Finder = Callable[[str], "tuple[int, int] | None"]


def _fields(value: object) -> tuple[str, ...]:
    if value is None or value == "all":
        return SEARCH_FIELDS
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, (list, tuple)) or not value:
        raise InvalidInputError("field must be 'prompt', 'response', 'all' or a list of them")
    for name in value:
        if name not in SEARCH_FIELDS:
            raise InvalidInputError(
                f"cannot search field {name!r:.40}: give {', '.join(SEARCH_FIELDS)} or 'all'"
            )
    return tuple(dict.fromkeys(value))


def _finder(pattern: object, regex: bool, ignore_case: bool, deadline: float) -> Finder:
    """The function that finds ``pattern`` in one text: the span of its first match."""
    if not isinstance(pattern, str) or not pattern:
        raise InvalidInputError("give a non-empty pattern to search for")
    if len(pattern) > MAX_PATTERN:
        raise InvalidInputError(f"the pattern is longer than {MAX_PATTERN} characters")
    if not regex:
        if not ignore_case:

            def find_literal(text: str) -> tuple[int, int] | None:
                at = text.find(pattern)
                return None if at < 0 else (at, at + len(pattern))

            return find_literal
        # An escaped literal has no alternatives to backtrack into: `re` runs in linear time.
        folded = re.compile(re.escape(pattern), re.IGNORECASE)

        def find_folded(text: str) -> tuple[int, int] | None:
            m = folded.search(text)
            return None if m is None else m.span()

        return find_folded
    try:
        import regex as regex_module
    except ModuleNotFoundError as exc:
        raise MissingDependencyError(
            "regular expressions need the regex module; " + extra_hint("lens")
        ) from exc
    if _expansion(pattern) > _MAX_EXPANSION:
        raise InvalidInputError(
            f"the regular expression {pattern[:60]!r} repeats too much: its counted repeats "
            f"(x{{n}}, nested) spell out more than {_MAX_EXPANSION:,} items; simplify it"
        )
    try:
        compiled = regex_module.compile(pattern, regex_module.IGNORECASE if ignore_case else 0)
    except (regex_module.error, ValueError, OverflowError, RecursionError) as exc:
        raise InvalidInputError(f"the regular expression does not compile: {exc}") from None
    try:
        # Time-limited too: a pattern recursing into itself (``(?R)``) never ends on "" and
        # the regex module ends it with MemoryError, after seconds and ~100 MB.
        empty = compiled.search("", timeout=_EMPTY_TEXT)
    except (TimeoutError, MemoryError, RecursionError):
        raise InvalidInputError(
            f"the regular expression {pattern[:60]!r} does not finish even on an empty text "
            "(it recurses or backtracks without end); simplify it"
        ) from None
    if empty is not None:
        # Matches everywhere (``.*``, ``a?``): every sample would match, with nothing found.
        raise InvalidInputError(_EMPTY_MATCH)

    def find_regex(text: str) -> tuple[int, int] | None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _DeadlineReached
        limit = min(left, _PER_TEXT)
        try:
            # concurrent: the GIL is let go while it matches (the text is an immutable str), so
            # the other scan thread inflates and decodes meanwhile.
            m = compiled.search(text, timeout=limit, concurrent=True)
        except (TimeoutError, MemoryError, RecursionError):
            # MemoryError: the regex module's end of a recursion without bound.
            if limit < _PER_TEXT:
                raise _DeadlineReached from None  # the search's own time ran out meanwhile
            raise SearchTimeoutError(_timeout_message(pattern)) from None
        if m is not None and m.start() == m.end():
            # NOTE: the check against the empty text misses what matches only an empty
            # string inside a text (``\b``, ``(?=a)``): every sample "matched", with nothing
            # found (tests/lens/test_search.py); refused as the empty text's match is.
            raise InvalidInputError(_EMPTY_MATCH)
        return None if m is None else m.span()

    return find_regex


_EMPTY_MATCH = "the regular expression matches the empty string"


class _DeadlineReached(Exception):
    """The search's time is up: it stops and returns what it found."""


def _timeout_message(pattern: str) -> str:
    return (
        f"the regular expression {pattern[:60]!r} ran for more than {_PER_TEXT:g} s on one "
        "text: it backtracks without end (nested or overlapping repeats such as (a|aa)+); "
        "simplify it"
    )


# The characters beyond ASCII that `re.IGNORECASE` matches to an ASCII one (found by trying
# every code point; tests/lens/test_lens.py checks the table still holds).
_FOLDS_BEYOND_ASCII = {"i": "\u0130\u0131", "s": "\u017f", "k": "\u212a"}


try:  # the parser of Python's `re` (3.11 renamed it)
    from re import _parser as _re_parser  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _re_parser

_LITERAL = _re_parser.LITERAL
_GROUPS = (_re_parser.SUBPATTERN, getattr(_re_parser, "ATOMIC_GROUP", None))
_REPEATS = tuple(
    op
    for op in (
        _re_parser.MAX_REPEAT,
        _re_parser.MIN_REPEAT,
        getattr(_re_parser, "POSSESSIVE_REPEAT", None),
    )
    if op is not None
)
#: Longest literal a regular expression's fixed repeats are spelled out to.
_MAX_REGEX_LITERAL = 1_000
# Regex syntax `re` would read as literal characters: fuzzy constraints (``{e<=1}``) are the
# only braces that are not a repeat count.
_BRACES = re.compile(r"\\.|\{(?!\d+(?:,\d*)?\}|,\d+\})", re.DOTALL)


#: Most items a regular expression's counted repeats may spell out.  NOTE: the `regex` module
#: unrolls counted repeats when it compiles, which no timeout bounds: ``(?:a{1000}){1000}``
#: took 0.7 s and 280 MB, ``(?:x{65535}){65535}`` gigabytes without end, in one viewer
#: request (tests/lens/test_search.py); 200,000 compile in about 0.15 s.
_MAX_EXPANSION = 200_000
# Counted repeats as text, for a pattern `re` cannot parse (syntax only `regex` reads).
_COUNTS = re.compile(r"\\.|\{(\d*)(?:,(\d*))?\}", re.DOTALL)


def _expansion(pattern: str) -> int:
    """How many items the counted repeats of ``pattern`` spell out (at least; past
    `_MAX_EXPANSION` the count stops)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parsed = _re_parser.parse(pattern)
    except (re.error, ValueError, TypeError, OverflowError, RecursionError):
        # Syntax only `regex` reads: every count taken as nested in every other.
        total = 1
        for m in _COUNTS.finditer(pattern):
            if m.group(0).startswith("\\") or not (m.group(1) or m.group(2)):
                continue
            total *= max(int(m.group(1) or 0), int(m.group(2) or 0), 1)
            if total > _MAX_EXPANSION:
                break
        return total
    return _spelled(parsed.data)


def _spelled(nodes: Any) -> int:
    total = 0
    for op, av in nodes:
        if op in _REPEATS:
            low, high, body = av
            count = low if high is _re_parser.MAXREPEAT else max(low, high)
            total += max(count, 1) * _spelled(body)
        elif op is _re_parser.SUBPATTERN:
            total += _spelled(av[3])
        elif op in _GROUPS:
            total += _spelled(av)
        elif op is _re_parser.BRANCH:
            total += sum(_spelled(branch) for branch in av[1])
        elif op in (_re_parser.ASSERT, _re_parser.ASSERT_NOT):
            total += _spelled(av[1])
        elif op is _re_parser.GROUPREF_EXISTS:
            total += sum(_spelled(branch) for branch in av[1:] if branch is not None)
        else:
            total += 1
        if total > _MAX_EXPANSION:
            break
    return total


# What a record's tree escapes, and lone surrogates (stored with surrogatepass).
_UNSTORED = re.compile(r'["\\\x00-\x1f\ud800-\udfff]')
# The same, and every character beyond ASCII: what a case-folded needle leaves out.
_UNSTORED_OR_BEYOND_ASCII = re.compile(r'["\\\x00-\x1f\x80-\U0010ffff]')


def _exact(node: tuple[Any, Any]) -> str | None:
    """The one string ``node`` of a parsed `re` pattern matches, if it matches only one."""
    op, av = node
    if op is _LITERAL:
        return chr(av)
    if op is _re_parser.SUBPATTERN:
        _, add_flags, del_flags, body = av
        return None if add_flags or del_flags else _exact_seq(body)
    if op in _GROUPS:
        return _exact_seq(av)
    if op in _REPEATS:
        low, high, body = av
        one = _exact_seq(body) if low == high and low <= _MAX_REGEX_LITERAL else None
        return None if one is None or len(one) * low > _MAX_REGEX_LITERAL else one * low
    return None


def _exact_seq(nodes: Any) -> str | None:
    parts = []
    for node in nodes:
        part = _exact(node)
        if part is None:
            return None
        parts.append(part)
    return "".join(parts)


def _required(nodes: Any, out: list[str]) -> None:
    """Add to ``out`` strings that every match of the sequence ``nodes`` holds: runs of
    nodes that match one string, and those of the groups and repeats (at least once) that
    every match goes through."""
    run = ""
    for node in nodes:
        part = _exact(node)
        if part is not None:
            run += part
            continue
        out.append(run)
        run = ""
        op, av = node
        if op is _re_parser.SUBPATTERN and not (av[1] or av[2]):
            _required(av[3], out)
        elif op in _GROUPS and op is not _re_parser.SUBPATTERN:
            _required(av, out)
        elif op in _REPEATS and av[0] >= 1:
            _required(av[2], out)
    out.append(run)


def _regex_literal(pattern: str) -> str | None:
    """A string every match of the regular expression ``pattern`` (case-sensitive) holds,
    the longest found, or None.

    NOTE: read with Python's `re` parser, as the `regex` module (which runs the pattern) reads
    the same syntax: a pattern using syntax only `regex` has (``\\p{L}``, ``(?V1)``,
    ``(*SKIP)``, ``[[:alpha:]]``, named lists) is refused by `re` or warned about, and gets
    none; so does one with braces that are not a repeat count (`regex`'s fuzzy matching,
    ``(?:abc){e<=1}``, which `re` reads as literal characters), or any case folding.
    """
    if any(m.group() == "{" for m in _BRACES.finditer(pattern)):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            parsed = _re_parser.parse(pattern)
    except (re.error, Warning, ValueError, TypeError, OverflowError, RecursionError):
        return None
    if parsed.state.flags & (re.IGNORECASE | re.VERBOSE):
        return None
    found: list[str] = []
    _required(parsed.data, found)
    # A part of a required string is required: the longest run without what the record's
    # tree escapes (see `_prefilter`) or UTF-8 cannot hold (a lone surrogate).
    pieces = [p for text in found for p in _UNSTORED.split(text) if p]
    return max(pieces, key=len, default=None)


def _prefilter(pattern: str, regex: bool, ignore_case: bool) -> BytesNeedle | None:
    """The bytes every record holding a match of ``pattern`` holds, or None.

    NOTE: a literal's UTF-8 bytes appear in the inflated record of every sample whose text
    holds it: a long text is stored as its UTF-8 bytes, a short one inside the record's JSON
    tree, which writes every character as it is (``ensure_ascii=False``) except ``"``, ``\\``
    and control characters (`_UNSTORED`): of a literal holding those, its longest piece
    without them is looked for.  Records without the bytes (most, for a rare pattern) are
    skipped before their tree is parsed: that parse cost as much as the inflation
    (docs/architecture/search.md, "Search").  A case-folded literal's longest ASCII piece is looked
    for in the bytes ASCII lower-cased, and a record holding a character `re.IGNORECASE`
    folds to one of its letters from beyond ASCII (rare: ``K``, ``ſ``, ``İ``, ``ı``) is
    always kept.  A regular expression's is the longest string its matches hold
    (`_regex_literal`).
    """
    if regex:
        literal = None if ignore_case else _regex_literal(pattern)
        if literal is None:
            return None
        pattern = literal
    pieces = (_UNSTORED_OR_BEYOND_ASCII if ignore_case else _UNSTORED).split(pattern)
    piece = max(pieces, key=len)
    if not piece:
        return None
    if ignore_case:
        needle = piece.lower().encode()
        beyond = {
            c.encode() for letter in set(piece.lower()) for c in _FOLDS_BEYOND_ASCII.get(letter, "")
        }
        return BytesNeedle(needle, folded=True, also=tuple(sorted(beyond)))
    return BytesNeedle(piece.encode("utf-8"))


def _text(value: object) -> str | None:
    """The searchable text of a field: a string, or the contents of chat messages (a
    message's content a string, or a list of content parts whose ``text`` is one)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        texts = [
            text
            for m in value
            if isinstance(m, dict) and "content" in m
            for text in _content(m["content"])
        ]
        return "\n".join(texts) if texts else None
    return None


def _content(content: object) -> list[str]:
    # NOTE: the OpenAI form of a message, content parts ([{"type": "text", "text": ...}]),
    # was skipped without a word while the viewer shows it (tests/lens/test_search.py).
    if isinstance(content, str):
        return [content]
    if isinstance(content, (list, tuple)):
        return [
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        ]
    return []


def _line(text: str, start: int, end: int) -> tuple[int, str, int, int]:
    """The line holding ``text[start:end]``: its number, its text (cut around the match) and
    where the match is in that text."""
    begin = text.rfind("\n", 0, start) + 1
    stop = text.find("\n", end)
    stop = len(text) if stop < 0 else stop
    if stop > end and text[stop - 1] == "\r" and text.startswith("\n", stop):
        stop -= 1  # a CRLF line ends before its \r (it was shown as part of the line)
    number = text.count("\n", 0, start) + 1
    left = max(begin, start - LINE_CONTEXT)
    right = min(stop, max(end, start + 1) + LINE_CONTEXT)
    shown = ("…" if left > begin else "") + text[left:right] + ("…" if right < stop else "")
    offset = start - left + (1 if left > begin else 0)
    return number, shown, offset, offset + min(end, right) - start


# A match found by a scan thread: the sample's position, the field and its line (see `_line`).
_Found = tuple[int, str, tuple[int, str, int, int]]


def _scan_chunk(
    archive: Archive,
    ordinal: int,
    digest: str,
    entries: list[tuple[int, int]],
    fields: tuple[str, ...],
    find: Finder,
    require: BytesNeedle | None,
) -> tuple[int, list[_Found]]:
    """Read one chunk (verified) and search the texts of its samples (``entries``: their
    positions and offsets); return the bytes read and, per matching sample, its first match."""
    data = archive._read_blob(digest, f"chunk {ordinal}")
    found: list[_Found] = []
    # The samples of a prompt group share its prompt, and one chunk holds whole groups:
    # each distinct text is searched once.
    seen: dict[str, tuple[int, int] | None] = {}
    # Of a version 2 chunk, only the text parts, inflated and searched for the prefilter's
    # bytes in two calls that release the GIL (`ChunkReader.search_texts`): the other scan
    # thread reads and inflates meanwhile.  NOTE: a version 1 chunk's records are still
    # inflated one by one: one buffer for a chunk's whole records cost 1.5x the CPU (fresh
    # pages for every chunk; 1.2 against 0.8 s for 10 rollouts).
    texts: Iterator[tuple[int, dict[str, Any]]] | None = None
    while True:
        try:
            # NOTE: the reader is made in here too: a header it refuses (truncated, another
            # format version) and a record in an unknown compression (UnsupportedFormatError,
            # not an IntegrityError) named only the blob, not the archive (tests/lens/test_search.py).
            if texts is None:
                # an array above the inline limit in a text field (an image among a
                # prompt's content parts) is a blob of its own, read as it is decoded
                reader = ChunkReader(data, digest=digest, array_loader=archive._load_array)
                texts = reader.search_texts([offset for _, offset in entries], fields, require)
            got = next(texts, None)
        except (IndexError, IntegrityError, UnsupportedFormatError) as exc:
            kind = (
                UnsupportedFormatError
                if isinstance(exc, UnsupportedFormatError)
                else IntegrityError
            )
            raise kind(f"archive {archive.name!r}, chunk {ordinal} (blob {digest}): {exc}") from exc
        if got is None:
            break
        k, values = got
        for name in fields:
            text = _text(values.get(name))
            if not text:
                continue
            if name == "prompt":
                if text not in seen:
                    seen[text] = find(text)
                span = seen[text]
            else:
                span = find(text)
            if span is not None:
                found.append((entries[k][0], name, _line(text, *span)))
                break
    return len(data), found


def _archives(
    ctx: PoolContext, rollout_ids: object, evaluation: bool | None, names: Sequence[str] | None
) -> list[Any]:
    a = archives_table
    where = archive_filters(check_rollout_range(rollout_ids), evaluation, ("published",))
    if names is not None:
        where.append(a.c.name.in_(list(names)))
    with ctx.catalog.read() as conn:
        return list(
            conn.execute(
                select(a).where(*where).order_by(a.c.rollout_id.is_(None), a.c.rollout_id, a.c.name)
            ).all()
        )


def _layout(
    ctx: PoolContext, archive_id: int
) -> tuple[dict[int, str], dict[int, list[tuple[int, int]]]]:
    """The chunks of an archive and, per chunk, its samples' positions and offsets.

    NOTE: only what the scan needs; the keys, reward and status of a sample are read when it
    matches (`_facts`): reading them for every sample (a join with ``sample_metadata``, and
    an object per sample) took 1.1 s of the GIL's time over 100 rollouts, a sixth of the
    search.
    """
    e, c = entries_table, chunks_table
    with ctx.catalog.read() as conn:
        digests = dict(
            conn.execute(select(c.c.ordinal, c.c.digest).where(c.c.archive_id == archive_id)).all()
        )
        rows = conn.execute(
            select(e.c.chunk_ordinal, e.c.position, e.c.offset)
            .where(e.c.archive_id == archive_id)
            .order_by(e.c.position)
        ).all()
    by_chunk: dict[int, list[tuple[int, int]]] = {}
    for ordinal, position, offset in rows:
        by_chunk.setdefault(ordinal, []).append((position, offset))
    return digests, by_chunk


def _facts(
    ctx: PoolContext, row: Any, positions: list[int]
) -> dict[int, tuple[str, str | None, float | None, str | None]]:
    """The catalog's facts (sample key, task key, reward, status) of the samples at
    ``positions`` of one chunk of the archive ``row``: read for matches only."""
    e, m = entries_table, sample_metadata_table
    with ctx.catalog.read() as conn:
        rows = conn.execute(
            select(e.c.position, e.c.sample_key, e.c.task_key, m.c.reward, m.c.status)
            .join(
                m,
                (m.c.archive_id == e.c.archive_id) & (m.c.position == e.c.position),
                isouter=True,
            )
            .where(e.c.archive_id == row.id, e.c.position.between(min(positions), max(positions)))
        ).all()
    facts = {r.position: (r.sample_key, r.task_key, r.reward, r.status) for r in rows}
    missing = [p for p in positions if p not in facts]
    if missing:  # the archive went away during the search (a published one never changes)
        raise IntegrityError(f"archive {row.name!r} has no catalog row for sample {missing[0]}")
    return facts


def search_pool(
    ctx: PoolContext,
    pattern: str,
    *,
    regex: bool = False,
    ignore_case: bool = False,
    fields: str | Sequence[str] | None = None,
    rollout_ids: object = None,
    evaluation: bool | None = None,
    names: Sequence[str] | None = None,
    limit: int = 100,
    timeout: float = DEFAULT_TIMEOUT,
) -> SearchResult:
    """The published samples whose prompt or response contains ``pattern`` (a literal, or a
    regular expression with ``regex``), first match per sample, in archive order (by
    rollout id, then name) and position, at most ``limit`` of them.

    Raises:
        InvalidInputError: an empty or too long pattern, a regular expression that does not
            compile or matches the empty string, a bad field, range or limit.
        SearchTimeoutError: a regular expression ran away on one text (backtracking without
            end).  A search that reaches ``timeout`` is not an error: it stops and returns
            what it found, with `SearchResult.timed_out` set.
        MissingDependencyError: ``regex`` without the `regex` module installed.
    """
    for flag, what in ((regex, "regex"), (ignore_case, "ignore_case")):
        if not isinstance(flag, bool):
            raise InvalidInputError(f"{what} must be True or False")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInputError(f"limit must be a whole number from 1 to {MAX_LIMIT:,}")
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout <= 24 * 3600
    ):
        raise InvalidInputError("timeout must be a number of seconds above 0, at most a day")
    chosen = _fields(fields)
    started = time.monotonic()
    deadline = started + float(timeout)
    find = _finder(pattern, regex, ignore_case, deadline)
    require = _prefilter(pattern, regex, ignore_case)
    result = SearchResult(pattern, regex, chosen)
    rows = _archives(ctx, rollout_ids, evaluation, names)
    with Helpers(_WORKERS, thread_name_prefix="archive-search") as pool:
        pending: list[tuple[Any, Future[Any]]] = []

        def collect(row: Any, future: Future[Any]) -> bool:
            try:
                read, found = future.result()
            except _DeadlineReached:
                result.timed_out = True
                return False
            result.bytes_read += read
            if not found:
                return True
            facts = _facts(ctx, row, [position for position, _, _ in found])
            for position, name, (number, line, start, end) in found:
                if len(result.matches) >= limit:
                    result.limited = True
                    return False
                sample_key, task_key, reward, status = facts[position]
                result.matches.append(
                    SearchMatch(
                        row.name,
                        row.rollout_id,
                        bool(row.evaluation),
                        position,
                        sample_key,
                        task_key,
                        reward,
                        status,
                        name,
                        number,
                        line,
                        start,
                        end,
                    )
                )
            return True

        try:
            stopped = False
            for row, ordinal, digest, entries in _chunks(ctx, rows, result):
                if time.monotonic() > deadline:
                    result.timed_out = True
                    break  # what is in flight is still collected below
                archive = Archive(ctx, row)
                pending.append(
                    (
                        row,
                        pool.submit(
                            _scan_chunk, archive, ordinal, digest, entries, chosen, find, require
                        ),
                    )
                )
                result.samples += len(entries)
                if len(pending) > _AHEAD and not collect(*pending.pop(0)):
                    stopped = True
                    break
            while pending and not stopped:
                stopped = not collect(*pending.pop(0))
        finally:
            for _, future in pending:
                future.cancel()
    result.seconds = time.monotonic() - started
    return result


def _chunks(
    ctx: PoolContext, rows: list[Any], result: SearchResult
) -> Iterator[tuple[Any, int, str, list[tuple[int, int]]]]:
    for row in rows:
        digests, by_chunk = _layout(ctx, row.id)
        result.archives += 1
        for ordinal in sorted(by_chunk):
            digest = digests.get(ordinal)
            if digest is None:
                raise IntegrityError(f"archive {row.name!r} has no row for chunk {ordinal}")
            yield row, ordinal, digest, by_chunk[ordinal]
