"""Validation of archive names and owner strings: they never become paths, but they are
shown in shells, stored in SQL and embedded in owner strings, so they must be unambiguous."""

from __future__ import annotations

from .errors import InvalidNameError

__all__ = [
    "ARCHIVE_OWNER_PREFIX",
    "LEASE_PREFIX",
    "MAX_NAME_BYTES",
    "archive_owner",
    "check_archive_name",
    "check_owner",
]

MAX_NAME_BYTES = 255
ARCHIVE_OWNER_PREFIX = "archive:"
LEASE_PREFIX = "lease:"
GC_LEASE_PREFIX = "gc:"
_RESERVED = (ARCHIVE_OWNER_PREFIX, LEASE_PREFIX, GC_LEASE_PREFIX)


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


def check_archive_name(name: object) -> str:
    """Return ``name`` if it is a valid archive name, else raise `InvalidNameError`.

    Unicode is allowed (and round-trips); path separators, ``..``, NUL and other control
    characters, and names over 255 UTF-8 bytes are not.
    """
    name = _check_text(name, "archive name")
    if "/" in name or "\\" in name:
        raise InvalidNameError(f"archive name {name!r:.80} holds a path separator")
    if ".." in name or name == ".":
        raise InvalidNameError(f"archive name {name!r:.80} holds '..' or is '.'")
    return name


def check_owner(owner: object, *, external: bool = True) -> str:
    """Return ``owner`` if it is a valid owner string, else raise `InvalidNameError`.

    Owners read ``kind:rest`` (``checkpoint:step-1200``, ``queue:train``,
    ``checkpoint:/ckpt/run1/step-1200``).  Unlike archive names they never become paths, so
    ``/`` and ``..`` are allowed (a checkpoint's path is a natural owner, and pools written
    before may hold such owners, which must stay releasable); NUL and other control
    characters, surrounding whitespace and over-long strings are not.  With ``external``
    (owners that users add and release), the prefixes the pool itself uses are refused.
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


def archive_owner(name: str) -> str:
    """The owner string by which an archive retains its own blobs."""
    return ARCHIVE_OWNER_PREFIX + name
