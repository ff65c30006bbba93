"""The ``sample_shared`` column: the places of one tensor or array held in several places of a
sample, and giving those places one object again on import.

(docs/architecture/getting-data-out.md, "Getting data out".)
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._util.lazy_torch import is_tensor, torch_module
from ...codec import StoredNumbers, TensorRef
from ...errors import UnsupportedFormatError

if TYPE_CHECKING:
    pass


def shared_places(fields: dict[str, Any]) -> list[list[list[Any]]] | None:
    """The places of each tensor or numpy array that a sample's fields hold more than once
    (it loads as one object: docs/architecture/samples-and-values.md, "Samples and values"), for the
    ``sample_shared`` column: ``[[place, place, ...], ...]``, a place being the field name
    then a step per container, a list's or tuple's index or a dict's item ordinal (its keys
    may be anything a mapping key can be).  None when nothing is held twice.

    NOTE: every place still holds the whole value, so a reader that knows nothing of this
    column (pandas, DuckDB, datasets) reads every place; the column only lets an import
    give the places one object again (`share_places`).
    """
    places: dict[int, list[list[Any]]] = {}
    stack: list[tuple[Any, list[Any]]] = [(v, [k]) for k, v in reversed(fields.items())]
    while stack:
        value, place = stack.pop()
        t = type(value)
        if t is list or t is tuple or t is dict:
            items = value.values() if t is dict else value
            inner = [
                (v, [*place, i])
                for i, v in enumerate(items)
                if type(v) not in _LEAVES  # strings and numbers: nothing to share
            ]
            stack.extend(reversed(inner))
        elif t is np.ndarray or t is TensorRef or is_tensor(value):
            places.setdefault(id(value), []).append(place)
    groups = [group for group in places.values() if len(group) > 1]
    return groups or None


_LEAVES = frozenset((str, int, float, bool, type(None), StoredNumbers))


def _shared_text(fields: dict[str, Any]) -> str | None:
    groups = shared_places(fields)
    return None if groups is None else json.dumps(groups)


def share_places(fields: dict[str, Any], groups: Any, where: str) -> None:
    """Make the places each group of ``groups`` (`shared_places`) names hold one object, in
    ``fields`` as read from a table.

    A place in a field the row lacks (a column left out) is skipped.  The table's values
    win: places that do not hold the same tensor or array (dtype, shape and bits; an edited
    table) are refused rather than made one, and so is a malformed column.

    Raises:
        UnsupportedFormatError: a malformed ``sample_shared`` value, a place that holds no
            tensor or array, or places of one group holding different values.
    """
    if type(groups) is not list or not all(type(g) is list for g in groups):
        raise UnsupportedFormatError(f"{where}: sample_shared is not a list of place lists")
    # NOTE: a dict's step is an ordinal; its keys (which `_put` never changes) are listed
    # once per dict, not once per place: a column naming places in a 100,000-item dict
    # 4,000 times took 14 s for a 1.6 MB table (quadratic).  The dict is kept with its
    # keys, so its id cannot be reused meanwhile.
    keys: dict[int, tuple[dict[Any, Any], list[Any]]] = {}
    for group in groups:
        found: list[tuple[list[Any], Any]] = []
        seen: set[str] = set()
        for place in group:
            if type(place) is not list or not place or type(place[0]) is not str:
                raise UnsupportedFormatError(f"{where}: sample_shared holds a malformed place")
            text = _place_text(place)
            if text in seen:
                continue  # named again: nothing more to look up, compare or put
            seen.add(text)
            if place[0] in fields:
                found.append((place, _at_place(fields[place[0]], place, where, keys)))
        if len(found) < 2:
            continue
        first = found[0][1]
        for place, value in found[1:]:
            if value is not first and not _same_data(first, value):
                raise UnsupportedFormatError(
                    f"{where}: sample_shared says {_place_text(found[0][0])} and "
                    f"{_place_text(place)} hold one value, but they differ (an edited "
                    "table?); drop the sample_shared column to import them as separate values"
                )
        for place, _ in found[1:]:
            fields[place[0]] = _put(fields[place[0]], place[1:], first, keys)


def _place_text(place: list[Any]) -> str:
    return repr(place[0]) + "".join(f"[{step!r}]" for step in place[1:])


def _dict_keys(
    value: dict[Any, Any], keys: dict[int, tuple[dict[Any, Any], list[Any]]]
) -> list[Any]:
    known = keys.get(id(value))
    if known is None:
        known = keys[id(value)] = (value, list(value))
    return known[1]


def _at_place(
    value: Any,
    place: list[Any],
    where: str,
    keys: dict[int, tuple[dict[Any, Any], list[Any]]],
) -> Any:
    for step in place[1:]:
        t = type(value)
        size = len(value) if t is dict or t is list or t is tuple else -1
        if type(step) is not int or not 0 <= step < size:
            raise UnsupportedFormatError(
                f"{where}: sample_shared names {_place_text(place)}, which the row lacks"
            )
        value = value[_dict_keys(value, keys)[step]] if t is dict else value[step]
    if not (type(value) is np.ndarray or is_tensor(value)):
        raise UnsupportedFormatError(
            f"{where}: sample_shared names {_place_text(place)}, which holds no tensor or array"
        )
    return value


def _put(
    container: Any,
    steps: list[Any],
    obj: Any,
    keys: dict[int, tuple[dict[Any, Any], list[Any]]],
) -> Any:
    """``container`` with ``obj`` at ``steps`` (a tuple on the way is built again)."""
    if not steps:
        return obj
    step, rest = steps[0], steps[1:]
    t = type(container)
    if t is dict:
        key = _dict_keys(container, keys)[step]
        container[key] = _put(container[key], rest, obj, keys)
        return container
    if t is tuple:
        items = list(container)
        items[step] = _put(items[step], rest, obj, keys)
        return tuple(items)
    container[step] = _put(container[step], rest, obj, keys)
    return container


def _same_data(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are one type of value holding the same dtype, shape and bits."""
    if type(a) is not type(b) or a.dtype != b.dtype or a.shape != b.shape:
        return False
    if type(a) is np.ndarray:
        return bool(a.tobytes() == b.tobytes())
    torch = torch_module()
    bits = [t.detach().cpu().contiguous().reshape(-1).view(torch.uint8) for t in (a, b)]
    return bool(torch.equal(bits[0], bits[1]))
