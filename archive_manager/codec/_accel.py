"""The native list conversion, when it is there (docs/architecture.md, "Native list conversion").

`native_numbers`, `native_first_leaves` and `native_dict_items` are the functions of ``archive_manager.codec._native``
(setup.py builds it) or None, and then the codec converts numeric lists and counts leaves
against the expansion bound in Python: the bytes and the bound are the same.  The extension
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

__all__ = ["NO_NATIVE_ENV", "native_dict_items", "native_first_leaves", "native_numbers"]

NO_NATIVE_ENV = "ARCHIVE_MANAGER_NO_NATIVE"

NumbersFn = Callable[[list[Any]], "tuple[str, bytes, bool] | None"]
FirstLeavesFn = Callable[["list[Any] | tuple[Any, ...]", dict[int, int]], bool]
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


def _load() -> tuple[NumbersFn, FirstLeavesFn, DictItemsFn] | tuple[None, None, None]:
    if os.environ.get(NO_NATIVE_ENV, "") not in ("", "0"):
        return None, None, None
    try:
        from ._native import dict_items, first_leaves, numbers
    except ImportError as exc:
        warnings.warn(
            f"archive_manager's C extension is not available ({exc}): numeric lists are "
            "converted in Python, which writes the same bytes more slowly; reinstall with a C "
            f"compiler to build it, or set {NO_NATIVE_ENV}=1 to silence this",
            NativeFallbackWarning,
            stacklevel=2,
        )
        return None, None, None
    return numbers, first_leaves, dict_items


native_numbers, native_first_leaves, native_dict_items = _load()
