"""Validation of archive names and owner strings: they never become paths, but they are
shown in shells, stored in SQL and embedded in owner strings, so they must be unambiguous.

Two levels of check.  `check_new_archive_name` and `check_new_owner` decide what may name
something *new*: besides the rules below they refuse every invisible or terminal-active
character (C1 controls, bidi overrides and isolates, zero-width characters, line and
paragraph separators: Unicode categories Cc, Cf, Cs, Zl and Zp) and return the text in
Unicode NFC, so that ``café`` typed composed (U+00E9) or decomposed (``e`` + U+0301) names
one archive.  `check_archive_name` and `check_owner` keep the rules of earlier versions
and are what lookups use, so a name an older version stored (decomposed, or holding a
character now refused) stays openable and releasable by its exact stored string;
`name_spellings` gives the spellings a lookup tries.
"""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

import xxhash

from ..errors import InvalidInputError, InvalidNameError

__all__ = [
    "ARCHIVE_OWNER_PREFIX",
    "INVISIBLE_CATEGORIES",
    "LEASE_PREFIX",
    "MAX_NAME_BYTES",
    "archive_name_for",
    "archive_owner",
    "check_archive_name",
    "check_new_archive_name",
    "check_new_owner",
    "check_owner",
    "invisible_character",
    "is_invisible",
    "name_spellings",
]

MAX_NAME_BYTES = 255
ARCHIVE_OWNER_PREFIX = "archive:"
LEASE_PREFIX = "lease:"
GC_LEASE_PREFIX = "gc:"
_RESERVED = (ARCHIVE_OWNER_PREFIX, LEASE_PREFIX, GC_LEASE_PREFIX)

#: Unicode categories of controls (C0, DEL, C1), format characters (bidi controls,
#: zero-width characters, the BOM, soft hyphen), lone surrogates, line and paragraph
#: separators: invisible, or acting on the terminal or on the order in which the text
#: around them is shown.  New names and owners may not hold them; the CLI escapes them.
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})

#: Characters of other categories that render as nothing: Unicode's Default_Ignorable_Code_Point
#: ranges outside Cf (the combining grapheme joiner, Hangul fillers, Mongolian and other
#: variation selectors, tag characters) and blank letters and symbols (the Braille blank).
_INVISIBLE_RANGES = (
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x2800, 0x2800),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFFA0, 0xFFA0),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)


def is_invisible(char: str) -> bool:
    """Whether ``char`` is invisible or acts on the terminal (see `INVISIBLE_CATEGORIES`)."""
    if unicodedata.category(char) in INVISIBLE_CATEGORIES:
        return True
    code = ord(char)
    return any(low <= code <= high for low, high in _INVISIBLE_RANGES)


def invisible_character(text: str) -> str | None:
    """The first character of ``text`` that a new name or owner may not hold, or None."""
    if text.isascii():
        # NOTE: the fast path: ASCII can only hold C0 controls and DEL, both category Cc.
        return next((c for c in text if ord(c) < 0x20 or ord(c) == 0x7F), None)
    return next((c for c in text if is_invisible(c)), None)


def _describe(char: str) -> str:
    name = unicodedata.name(char, "")
    return f"U+{ord(char):04X}" + (f" {name}" if name else "")


def _check_text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidNameError(f"{what} must be a str, not {type(value).__name__}")
    if not value:
        raise InvalidNameError(f"{what} must not be empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidNameError(f"{what} {value!r:.80} is not valid unicode text") from exc
    if size > MAX_NAME_BYTES:
        raise InvalidNameError(f"{what} is {size} bytes long; the limit is {MAX_NAME_BYTES}")
    bad = next((c for c in value if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        raise InvalidNameError(f"{what} {value!r:.80} holds a control character {bad!r}")
    if value != value.strip():
        raise InvalidNameError(f"{what} {value!r:.80} has leading or trailing whitespace")
    return value


def _check_new_text(value: object, what: str) -> str:
    """The text in NFC, checked by `_check_text` (before and after normalising: NFC may
    lengthen a string) and free of invisible characters."""
    _check_text(value, what)
    text = unicodedata.normalize("NFC", value)  # type: ignore[arg-type]
    _check_text(text, what)
    bad = invisible_character(text)
    if bad is not None:
        raise InvalidNameError(
            f"{what} {text!r:.80} holds an invisible or control character ({_describe(bad)})"
        )
    return text


def name_spellings(text: str) -> list[str]:
    """The spellings a lookup of ``text`` tries, best first: the exact string (what an older
    version may have stored), then its NFC form (what this version stores), then its NFD
    form (what a name taken from a macOS file name may have been stored as)."""
    out = [text]
    for form in ("NFC", "NFD"):
        other = unicodedata.normalize(form, text)
        if other not in out:
            out.append(other)
    return out


def check_archive_name(name: object) -> str:
    """Return ``name`` if it may name a stored archive, else raise `InvalidNameError`.

    The rules every version enforced, used to look an archive up: unicode is allowed (and
    round-trips); path separators, ``..``, NUL and other C0 control characters, surrounding
    whitespace and names over 255 UTF-8 bytes are not.  New archives are checked by
    `check_new_archive_name`.
    """
    name = _check_text(name, "archive name")
    if "/" in name or "\\" in name:
        raise InvalidNameError(f"archive name {name!r:.80} holds a path separator")
    if ".." in name or name == ".":
        raise InvalidNameError(f"archive name {name!r:.80} holds '..' or is '.'")
    return name


def check_new_archive_name(name: object) -> str:
    """The name a new archive is stored under: ``name`` in Unicode NFC.

    On top of `check_archive_name`, refuses invisible and terminal-active characters (C1
    controls, bidi overrides and isolates, zero-width characters, line separators).  The NFC
    form is what is stored, so the composed and the decomposed spelling of ``café`` name one
    archive; lookups find it by either (see `name_spellings`).

    Raises:
        InvalidNameError: the name breaks a rule.
    """
    return check_archive_name(_check_new_text(name, "archive name"))


def check_owner(owner: object, *, external: bool = True) -> str:
    """Return ``owner`` if it may name a stored owner, else raise `InvalidNameError`.

    Owners read ``kind:rest`` (``checkpoint:step-1200``, ``queue:train``,
    ``checkpoint:/ckpt/run1/step-1200``).  Unlike archive names they never become paths, so
    ``/`` and ``..`` are allowed (a checkpoint's path is a natural owner, and pools written
    before may hold such owners, which must stay releasable); NUL and other control
    characters, surrounding whitespace and over-long strings are not.  With ``external``
    (owners that users add and release), the prefixes the pool itself uses are refused.
    New owners are checked by `check_new_owner`.
    """
    owner = _check_text(owner, "owner")
    kind, sep, rest = owner.partition(":")
    if not sep or not kind or not rest:
        raise InvalidNameError(
            f"owner {owner!r:.80} must read 'kind:name', e.g. 'checkpoint:step-1200'"
        )
    if external and owner.startswith(_RESERVED):
        raise InvalidNameError(
            f"owner {owner!r:.80} uses a reserved prefix ({', '.join(_RESERVED)}); "
            "release an archive's own owner with Archive.release()"
        )
    return owner


def check_new_owner(owner: object) -> str:
    """The owner string a new retention is stored under: ``owner`` in Unicode NFC, checked
    by `check_owner` and, like `check_new_archive_name`, free of invisible characters.

    Raises:
        InvalidNameError: the owner breaks a rule.
    """
    return check_owner(_check_new_text(owner, "owner"))


def archive_owner(name: str) -> str:
    """The owner string by which an archive retains its own blobs."""
    return ARCHIVE_OWNER_PREFIX + name


def archive_name_for(path: str | os.PathLike[str], generation: int = 1) -> str:
    """The archive name of a pointer path: its absolute path, made safe for a name.

    Two runs that both save ``rollout_3.json`` in different folders of one shared pool get
    different names.  ``%``, ``/``, ``\\``, whitespace, control and other invisible
    characters and ``..`` are percent-encoded, and so is every non-ASCII character of a path
    that is not in Unicode NFC (new names are stored in NFC: a path spelt otherwise would
    not keep its own name); a name that would pass 255 bytes keeps its tail and gains a
    digest of the whole path.  A ``generation`` past 1 (a path saved again after its first
    archive was released) adds ``%~<generation>``, which no path's encoding contains: ``%``
    is always encoded as ``%25``.
    """
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 1:
        raise InvalidInputError("generation must be an int >= 1")
    text = os.path.abspath(Path(path).expanduser())
    not_nfc = not unicodedata.is_normalized("NFC", text)
    out = []
    for ch in text:
        if (
            ch in "%/\\"
            or ch.isspace()
            or invisible_character(ch) is not None
            or (not_nfc and not ch.isascii())
        ):
            # NOTE: the UTF-8 bytes, each as %XX: ``%{ord(ch):X}`` made U+2000 and " 00"
            # both "%2000".  Surrogates (undecodable bytes in a file name) are no valid name
            # text, so they are encoded too.
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass")))
        else:
            out.append(ch)
    name = "".join(out)
    while ".." in name:
        name = name.replace("..", ".%2E")
    suffix = "" if generation == 1 else f"%~{generation}"
    if len((name + suffix).encode("utf-8")) > MAX_NAME_BYTES:
        tag = "~" + xxhash.xxh3_64_hexdigest(text.encode("utf-8", "surrogatepass")) + suffix
        tail = name.encode("utf-8")[-(MAX_NAME_BYTES - len(tag)) :].decode("utf-8", "ignore")
        return tail + tag
    return name + suffix
