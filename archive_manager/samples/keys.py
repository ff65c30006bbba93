"""Sample keys and task keys: what the catalog stores for a sample's index and its task."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import (
    InvalidInputError,
)

# --------------------------------------------------------------------------- keys


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def sample_key(obj_or_fields: Any, position: int) -> str:
    """``"sample:<index>"`` when the sample has a non-None ``index``, else ``"position:<n>"``.

    Not unique: samples that share an index share a key.
    """
    index = _get(obj_or_fields, "index")
    if index is None:
        return f"position:{position}"
    try:
        return f"sample:{index}"
    except ValueError:  # an int of over 4,300 digits has no str
        raise InvalidInputError("a sample index is too large to make a sample key") from None


MAX_KEY_BYTES = 255
"""Sample and task keys are catalog columns of 255 characters; PostgreSQL enforces that."""


def check_key_text(key: str, what: str) -> str:
    """Return ``key`` if the catalog can store it on every backend, else raise.

    Raises:
        InvalidInputError: over `MAX_KEY_BYTES` UTF-8 bytes, not encodable (a lone
            surrogate), or holding NUL, which PostgreSQL text cannot hold.
    """
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInputError(f"{what} {key!r:.80} is not valid unicode text") from None
    if size > MAX_KEY_BYTES:
        raise InvalidInputError(f"{what} is {size} bytes long; the limit is {MAX_KEY_BYTES}")
    if "\x00" in key:
        raise InvalidInputError(f"{what} {key!r:.80} holds a NUL character")
    return key


TASK_TEXT_PREFIX = "sha256:"
"""How the task key of a long text begins: ``sha256:`` and the hex SHA-256 of its UTF-8."""

MAX_TASK_TEXT_BYTES = 1 << 20
"""The longest text a task key may be (UTF-8 bytes): a prompt, not a document."""


def task_key_and_text(task_key: object) -> tuple[str | None, str | None]:
    """The task key the catalog stores for ``task_key``, and the full text when it is the
    digest of a long one: ``(key, None)`` for a key that fits the catalog's column, and
    ``("sha256:<hex>", text)`` for a str over `MAX_KEY_BYTES` UTF-8 bytes (a real prompt; an
    int that long is refused),
    so one text is one key in every archive and its text is kept beside (`check_task_key`).

    Raises:
        InvalidInputError: as `check_task_key`.
    """
    import numbers  # stdlib, imported already by the metadata a save describes

    if task_key is None:
        return None, None
    if isinstance(task_key, str):
        text = str.__str__(task_key)  # a str subclass as plain text: drivers bind types
    # NOTE: numpy's bool is no `numbers.Integral`; Python's is, and is refused.
    elif isinstance(task_key, numbers.Integral) and not isinstance(task_key, bool):
        # Checked like any key: a 300-digit int made a key PostgreSQL's column refused.
        try:
            text = str(int(task_key))
        except ValueError:  # over 4,300 digits
            raise InvalidInputError("a task key int is too large to be a key") from None
    else:
        what = type(task_key).__name__
        raise InvalidInputError(
            f"a task key must be a str, an int or None, not {what} ({task_key!r:.40}); a "
            "float or a bool names no task: give its text (str(...)) if it is one"
        )
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInputError(f"task key {text!r:.80} is not valid unicode text") from None
    if size <= MAX_KEY_BYTES or not isinstance(task_key, str):
        # An int of over 255 digits names no prompt: refused as before (only text is kept).
        return check_key_text(text, "task key"), None
    if size > MAX_TASK_TEXT_BYTES:
        raise InvalidInputError(
            f"task key is {size} bytes long; a text of up to {MAX_TASK_TEXT_BYTES} bytes "
            "is kept whole (its key is its digest)"
        )
    if "\x00" in text:
        raise InvalidInputError(f"task key {text!r:.80} holds a NUL character")
    return long_task_key(text), text


def long_task_key(text: str) -> str:
    """The task key of a text over `MAX_KEY_BYTES` bytes: ``sha256:`` and the hex SHA-256 of
    its UTF-8 (71 characters)."""
    import hashlib

    return TASK_TEXT_PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_task_key(task_key: object) -> str | None:
    """A task key is text or None; the catalog stores it as text.

    Accepted: a str, and a str subclass (``numpy.str_``) as its plain text; an int or another
    integer (``numpy.int64``, any `numbers.Integral` but bool) as its decimal text, so
    ``42``, ``np.int64(42)`` and ``"42"`` are one task key.  A text over `MAX_KEY_BYTES`
    UTF-8 bytes (a whole prompt) is keyed by its digest (`task_key_and_text`): the save keeps
    its text beside, and a lookup by the text finds it.

    Raises:
        InvalidInputError: another type (a bool, a float, bytes), or text the catalog cannot
            hold (a lone surrogate, NUL, over `MAX_TASK_TEXT_BYTES`).
    """
    return task_key_and_text(task_key)[0]


def task_key_of(obj: Any) -> str | None:
    """The id of the rollout task that produced ``obj`` as text, or None.

    Its ``task_key`` attribute or key if set; else the ``task_id`` of its
    ``_queue_receipt`` or ``_queue_lease`` (a mapping or an object).  What `check_task_key`
    accepts, and only that: a str subclass (``numpy.str_``) is its plain text, an int or
    ``numpy.int64`` its decimal text; a long text stays whole (the save keys it by its
    digest and keeps it).  Pass the original sample: stored fields have no ``_queue_*``.

    Raises:
        InvalidInputError: the id is a float, a bool or another object: refused, as in
            ``task_keys`` (a float id 1.0 and 1 would be two keys, True the key "True").
    """
    import numbers

    candidates = [("its task_key", _get(obj, "task_key"))]
    for attr in ("_queue_receipt", "_queue_lease"):
        handle = _get(obj, attr)
        if handle is not None:
            candidates.append((f"the task_id of its {attr}", _get(handle, "task_id")))
    for where, key in candidates:
        if key is None:
            continue
        if isinstance(key, str):
            return str.__str__(key)
        if isinstance(key, numbers.Integral) and not isinstance(key, bool):
            return task_key_and_text(key)[0]  # its decimal text, checked as such
        raise InvalidInputError(
            f"a sample's task key ({where}) is a {type(key).__name__} ({key!r:.40}): a task "
            "key must be a str or an int; give its text (str(...)) if it names a task"
        )
    return None
