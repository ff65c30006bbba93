"""Which prompt group each sample of an archive is in (docs/lens.md, "Groups"): by the lens's
rule, or by a field the caller names (``group_by=`` of `ArchiveManager.stats` and
`ArchiveManager.groups`, ``--group-by`` of the CLI).

The rule (``group_by=None``): a sample's task key; without one, its ``group_index`` (slime
marks a prompt's completions so and saves no task key); else no group
(`pool.summary.group_key_of`).  ``group_by="task_key"`` and ``group_by="group_index"`` use that
one only, from the catalog.  Any other name is a field of the samples (``"label"``; a dotted
name walks into dicts, ``"metadata.source_name"``), which the catalog does not hold: it is
decoded from the archive's chunks, that field alone (`Archive.field_values`), so grouping by
it reads each archive's payload once.
"""

from __future__ import annotations

import json
import math
import numbers
import sys
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from ..errors import InvalidInputError
from ..pool.context import PoolContext
from ..pool.summary import group_index_of, group_key_of

__all__ = [
    "CATALOG_FIELDS",
    "GroupKey",
    "catalog_group",
    "check_group_by",
    "field_group",
    "payload_groups",
    "shown_value",
]

CATALOG_FIELDS = ("task_key", "group_index")
"""The fields a group can be taken from without reading a payload."""

_MAX_FIELD = 255

GroupKey = Any
"""What the samples of one group share, hashable: a task key (str), a ``group_index`` (int),
or ``(kind, value)`` of another field (`field_group`); None for no group."""


def check_group_by(group_by: object) -> str | None:
    """None (the lens's rule) or a field name, checked.

    Raises:
        InvalidInputError: not a str, empty, over 255 characters, or a dotted name with an
            empty part.
    """
    if group_by is None:
        return None
    if not isinstance(group_by, str):
        raise InvalidInputError(
            f"group_by must be a field name (a str), not {type(group_by).__name__}"
        )
    if not group_by or len(group_by) > _MAX_FIELD or "\x00" in group_by:
        raise InvalidInputError(f"group_by {group_by!r:.80} is not a field name")
    if any(not part for part in group_by.split(".")):
        raise InvalidInputError(
            f"group_by {group_by!r:.80}: a dotted name needs a field before and after each dot"
        )
    return group_by


def catalog_group(group_by: str | None, task_key: str | None, description: Any) -> GroupKey:
    """The group of a sample from its catalog rows, for ``group_by`` None or one of
    `CATALOG_FIELDS`."""
    if group_by is None:
        return group_key_of(task_key, description)
    if group_by == "task_key":
        return task_key
    return group_index_of(description)


def field_group(value: Any, field: str) -> GroupKey:
    """The group key of a field's value: ``(kind, value)`` so that ``1``, ``True`` and ``"1"``
    are three groups; a str subclass, a numpy scalar or an enum member as its plain value; a
    list or dict of plain values as its JSON text (keys sorted); None (and NaN) for none.

    Raises:
        InvalidInputError: a value no group can be keyed by (a tensor, an object).
    """
    if isinstance(value, Enum):
        value = value.value
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, (numpy.generic, numpy.ndarray)) and value.ndim == 0:
        value = value.item()
    if value is None:
        return None
    if isinstance(value, str):
        return ("str", str.__str__(value))
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, numbers.Integral):
        return ("int", int(value))
    if isinstance(value, numbers.Real):
        number = float(value)
        return None if math.isnan(number) else ("float", number)
    if isinstance(value, (Mapping, list, tuple)):
        try:
            return ("json", json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False))
        except (TypeError, ValueError):
            pass
    raise InvalidInputError(
        f"cannot group by {field!r}: a sample holds a {type(value).__qualname__} there "
        "(a group is keyed by text, a number, a bool, or a list or dict of those)"
    )


def shown_value(key: GroupKey) -> Any:
    """The value a group key stands for, as shown (`Group.value`)."""
    return key[1] if isinstance(key, tuple) else key


def _walk(value: Any, path: Sequence[str]) -> Any:
    for part in path:
        if isinstance(value, Mapping):
            value = value.get(part)
        else:
            return None
        if value is None:
            return None
    return value


def payload_groups(pool: PoolContext, name: str, group_by: str) -> list[GroupKey]:
    """The group of every sample of archive ``name`` by a field the catalog does not hold,
    in position order: decoded from its chunks, that field alone (`Archive.field_values`).

    Raises:
        ArchiveReleasedError: the archive was released and its payload reclaimed.
        InvalidInputError: a value no group can be keyed by (`field_group`).
    """
    from ..pool.archive import open_archive

    top, *path = group_by.split(".")
    values = open_archive(pool, name).field_values(top)
    return [field_group(_walk(value, path), group_by) for value in values]
