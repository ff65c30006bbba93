"""The native list conversion and search prefilter, when they are there
(docs/architecture/samples-and-values.md, "Native list conversion", and docs/architecture/search.md,
"Search").

`native_numbers`, `native_first_leaves`, `native_dict_items` and `native_texts_holding` are the
functions of
``archive_manager.codec._native`` (setup.py builds it) or None, and then the codec converts
numeric lists, counts leaves against the expansion bound and prefilters a search's text parts
in Python: the bytes, the bound and the records kept are the same.  The extension
is optional at install (no compiler, a failed build), so a missing one is not an error: it is
warned once, here, at import.  ``ARCHIVE_MANAGER_NO_NATIVE=1`` forces the Python path without
a warning (the tests compare the two paths with it).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

from ..errors import NativeFallbackWarning

__all__ = [
    "NO_NATIVE_ENV",
    "native_arenas_ahead",
    "native_dict_items",
    "native_fill_taken",
    "native_first_leaves",
    "native_hand_over",
    "native_numbers",
    "native_stored_list",
    "native_take_dict",
    "native_take_object",
    "native_texts_holding",
]

NO_NATIVE_ENV = "ARCHIVE_MANAGER_NO_NATIVE"

NumbersFn = Callable[[list[Any]], "tuple[str, bytes, bool] | None"]
FirstLeavesFn = Callable[["list[Any] | tuple[Any, ...]", dict[int, int]], bool]
TextsHoldingFn = Callable[[Any, bytes, bool, "tuple[bytes, ...]"], list[int]]
StoredListFn = Callable[[Any, str, object], "list[Any] | None"]
DictItemsFn = Callable[
    [
        dict[Any, Any],
        dict[int, int],
        Callable[[Any], Any],
        "Callable[[Any], None] | None",
        list[Any],
    ],
    "dict[str, Any] | None",
]


def _load() -> (
    tuple[NumbersFn, FirstLeavesFn, DictItemsFn, TextsHoldingFn] | tuple[None, None, None, None]
):
    if os.environ.get(NO_NATIVE_ENV, "") not in ("", "0"):
        return None, None, None, None
    try:
        from ._native import dict_items, first_leaves, numbers, texts_holding
    except ImportError as exc:
        warnings.warn(
            f"archive_manager's C extension is not available ({exc}): numeric lists are "
            "converted (and searches prefiltered) in Python, which writes the same bytes more "
            "slowly; reinstall with a C "
            f"compiler to build it, or set {NO_NATIVE_ENV}=1 to silence this",
            NativeFallbackWarning,
            stacklevel=2,
        )
        return None, None, None, None
    return numbers, first_leaves, dict_items, texts_holding


native_numbers, native_first_leaves, native_dict_items, native_texts_holding = _load()


def _optional(name: str) -> Any:
    """The extension's function ``name``, or None where there is no extension or it lacks
    that function.

    NOTE: the functions added after the first four are looked up one by one: an extension
    built from an older checkout lacks them, and then only their callers take the Python
    path (the decoder converts with numpy, `save_async` snapshots in Python, a load's arenas
    are mapped by pymalloc as needed, `GilHandOver` sleeps), the rest stays native."""
    if native_numbers is None:
        return None
    from . import _native

    return getattr(_native, name, None)


native_stored_list: StoredListFn | None = _optional("stored_list")

TakeDictFn = Callable[..., "int | None"]
TakeObjectFn = Callable[..., "tuple[Any, int] | None"]
FillTakenFn = Callable[[list[Any], int], list[int]]


def _load_snapshot() -> tuple[TakeDictFn, TakeObjectFn, FillTakenFn] | tuple[None, None, None]:
    # all three or none: `save_async`'s snapshot runs in C or in Python (codec/snapshot.py)
    take_dict, take_object = _optional("take_dict"), _optional("take_object")
    fill_taken = _optional("fill_taken")
    if take_dict is None or take_object is None or fill_taken is None:
        return None, None, None
    return take_dict, take_object, fill_taken


native_take_dict, native_take_object, native_fill_taken = _load_snapshot()


ArenasAheadFn = Callable[[bool], bool]
native_arenas_ahead: ArenasAheadFn | None = _optional("arenas_ahead")

HandOverFn = Callable[[int], bool]
native_hand_over: HandOverFn | None = _optional("hand_over")
