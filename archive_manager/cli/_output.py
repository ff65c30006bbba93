"""Formatting for the CLI: aligned tables, human sizes and durations, local times, JSON, and
progress bars that appear only on a terminal.

Archive names, keys, statuses, owners and attrs come from whoever wrote the pool, so every
line for people passes through `terminal_safe`: a control character, a bidi override or a
zero-width character in them is shown as an escape (``\\x1b``, ``\\u202e``) and never
reaches the terminal.  ``--json`` output stays exact: such characters are JSON ``\\u``
escapes there, which decode to the stored text.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any

import click

from .._util.humanize import human_duration, human_size, local_time
from .._util.names import is_invisible

__all__ = [
    "counted",
    "echo",
    "echo_fields",
    "echo_json",
    "echo_records",
    "echo_table",
    "human_duration",
    "human_size",
    "local_time",
    "progress_reporter",
    "terminal_safe",
    "to_jsonable",
]


def to_jsonable(value: Any) -> Any:
    """Turn dataclasses, datetimes (ISO 8601), paths, enums, tuples and sets into JSON types."""
    if is_dataclass(value) and not isinstance(value, type):
        as_dict = getattr(value, "as_dict", None)
        return to_jsonable(as_dict() if callable(as_dict) else asdict(value))
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(to_jsonable(v) for v in value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Enum):
        return value.value
    return value


_NOT_PRINTABLE_ASCII = re.compile(r"[^ -~]")
_NAMED_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _unsafe(char: str) -> bool:
    # Every ASCII character outside ' '..'~' is a C0 control or DEL.
    return char.isascii() or is_invisible(char)


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if not _unsafe(char):
        return char
    code = ord(char)
    if char in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[char]
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def terminal_safe(text: object) -> str:
    """``text`` (or its ``str``) with every character that could act on a terminal or hide
    itself shown as a Python-style escape: C0 controls (tab and newline too, which would
    break a table's line), DEL, C1 controls, bidi controls, zero-width and other format
    characters, lone surrogates, line and paragraph separators (`INVISIBLE_CATEGORIES`).

    Printable text, non-ASCII included, is unchanged; so is a backslash, so a stored
    ``\\x1b`` (four characters) and a real escape look alike here: ``--json`` tells them
    apart.
    """
    return _NOT_PRINTABLE_ASCII.sub(_escape, text if isinstance(text, str) else str(text))


def counted(n: int, noun: str) -> str:
    """``1 sample``, ``2 samples``: a count and its noun, in the number it takes."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def echo(message: object = "", *, err: bool = False) -> None:
    """`click.echo` of one line for people, made `terminal_safe`."""
    click.echo(terminal_safe(message), err=err)


def _json_escape(match: re.Match[str]) -> str:
    char = match.group()
    if char == "\n" or not _unsafe(char):
        return char  # a newline of the indentation, or printable text
    code = ord(char)
    if code > 0xFFFF:  # JSON spells characters past the BMP as a UTF-16 surrogate pair
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def echo_json(value: Any) -> None:
    """Print ``value`` as indented JSON on stdout.

    Non-ASCII text stays readable; characters that would act on a terminal are ``\\u``
    escapes (``json.dumps`` escapes C0 controls, not DEL, C1 or bidi controls, and writing a
    lone surrogate raw would fail to encode), which JSON decodes to the same text.
    """
    text = json.dumps(to_jsonable(value), indent=2, ensure_ascii=False)
    click.echo(_NOT_PRINTABLE_ASCII.sub(_json_escape, text))


def echo_records(records: Sequence[dict[str, Any]], fmt: str) -> None:
    """Print listing rows as ``ndjson`` (one JSON object a line) or ``csv`` (a header of the
    first row's keys; nested values as JSON), for tools that stream or spreadsheet them.

    Both are exact (no escaping for the terminal): they are for pipes and files.
    """
    rows = [to_jsonable(r) for r in records]
    if fmt == "ndjson":
        for row in rows:
            click.echo(json.dumps(row, ensure_ascii=False))
        return
    if fmt != "csv":
        raise ValueError(f"unknown format {fmt!r}")
    out = io.StringIO()
    if rows:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow(
                {
                    k: json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else v
                    for k, v in row.items()
                }
            )
    # color=True: click.echo strips ANSI sequences when stdout is no terminal, which would
    # alter stored text ('\x1b[31mred' -> 'red') in a format that promises it exactly.
    click.echo(out.getvalue(), nl=False, color=True)


def echo_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    right: Collection[int] = (),
    indent: int = 0,
    err: bool = False,
) -> None:
    """Print an aligned table (every cell `terminal_safe`); columns whose index is in
    ``right`` are right-aligned."""
    cells = [[terminal_safe(h) for h in headers]] + [
        ["-" if c is None else terminal_safe(c) for c in r] for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    pad = " " * indent
    for row in cells:
        parts = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        click.echo(pad + "  ".join(parts).rstrip(), err=err)


def echo_fields(
    fields: Sequence[tuple[str, object]], *, indent: int = 0, err: bool = False
) -> None:
    """Print ``label  value`` lines with the values aligned (and `terminal_safe`)."""
    width = max((len(label) for label, _ in fields), default=0)
    pad = " " * indent
    for label, value in fields:
        shown = "-" if value is None else terminal_safe(value)
        click.echo(f"{pad}{label.ljust(width)}  {shown}".rstrip(), err=err)


@contextmanager
def progress_reporter(
    label: str, *, enabled: bool = True, unit: str = "items"
) -> Iterator[Callable[[int, int], None] | None]:
    """A ``progress(done, total)`` callback drawing a bar on stderr, or None.

    None (no bar) unless ``enabled``, stderr is a terminal and the command line has no
    ``-q``: pipes, logs and ``--json`` output stay free of control characters, and a quiet
    run prints only errors.  The bar is created on the first call, because
    the library learns the total only once it has listed its work.  With ``unit="bytes"``
    the bar shows the bytes done and the total in binary units beside its ETA.
    """
    ctx = click.get_current_context(silent=True)
    quiet = ctx is not None and bool(ctx.find_root().params.get("quiet"))
    if not (enabled and not quiet and sys.stderr.isatty()):
        yield None
        return
    bar: Any = None
    shown = 0

    def report(done: int, total: int) -> None:
        nonlocal bar, shown
        if bar is None:
            shown_bytes: Callable[[Any], str | None] | None = None
            if unit == "bytes":

                def shown_bytes(_: Any) -> str:
                    return f"{human_size(min(shown, total))} of {human_size(total)}"

            bar = click.progressbar(
                length=max(total, 1),
                label=label,
                file=sys.stderr,
                show_eta=True,
                item_show_func=shown_bytes,
            )
            bar.__enter__()
        step = max(0, done - shown)
        shown = max(shown, done)
        bar.update(step)

    try:
        yield report
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
