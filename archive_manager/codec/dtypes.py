"""Numeric lists as arrays of a dtype the caller names (``as_arrays=True, dtypes=...``;
docs/architecture/reading.md, "Reading", "Dtypes of numeric lists").

A list of Python ints or floats has no dtype of its own (the record stores the narrowest one
its values fit, which changes with the values), so a reader that wants a fixed, narrow dtype
(an ``int8`` loss mask, ``float32`` log-probs) names it per field.  Ints must be held
exactly by the dtype asked for; floats are rounded to it as numpy and torch round
(``np.asarray(values, dtype)``, ``torch.tensor(values, dtype=)``); floats are never made ints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import InvalidInputError

__all__ = ["NUMBER_DTYPES", "NotHeldError", "check_dtypes", "numbers_as"]

#: The dtypes a numeric list may be asked for, by name (numpy's, and torch's same names).
NUMBER_DTYPES = {
    name: np.dtype(name)
    for name in (
        "int8",
        "uint8",
        "int16",
        "uint16",
        "int32",
        "uint32",
        "int64",
        "uint64",
        "float16",
        "float32",
        "float64",
    )
}
_ALLOWED = frozenset(NUMBER_DTYPES.values())


class NotHeldError(InvalidInputError):
    """A numeric list holds a value the dtype asked for cannot hold (an int out of its range
    or not exact in a float dtype, a float asked for as an int)."""


def _dtype_of(spec: Any) -> np.dtype | None:
    kind = type(spec)
    if kind.__name__ == "dtype" and kind.__module__ == "torch":  # torch.int8, without torch
        return NUMBER_DTYPES.get(str(spec).removeprefix("torch."))
    if isinstance(spec, bool) or spec is None:  # np.dtype(None) is float64: not meant
        return None
    try:
        dtype = np.dtype(spec)
    except (TypeError, ValueError):
        return None
    return dtype if dtype in _ALLOWED and dtype.isnative else None


def check_dtypes(dtypes: Any) -> dict[str, np.dtype] | None:
    """``dtypes`` as given to a load: None, or a mapping of field names to dtypes (numpy
    dtypes or their names, numpy scalar types, torch dtypes) of `NUMBER_DTYPES`.

    Raises:
        InvalidInputError: not a mapping of field names, or a dtype that is not one of them.
    """
    if dtypes is None:
        return None
    if not isinstance(dtypes, Mapping):
        raise InvalidInputError(
            'dtypes must map field names to dtypes (e.g. {"loss_mask": "int8"}), not a '
            f"{type(dtypes).__name__}"
        )
    out: dict[str, np.dtype] = {}
    for field, spec in dtypes.items():
        if type(field) is not str:
            raise InvalidInputError(f"dtypes: {field!r:.40} is not a field name")
        dtype = _dtype_of(spec)
        if dtype is None:
            raise InvalidInputError(
                f"dtypes: {spec!r:.40} for field {field!r:.80} is not one of "
                f"{', '.join(NUMBER_DTYPES)}"
            )
        out[field] = dtype
    return out


def numbers_as(values: np.ndarray, want: np.dtype, field: Any) -> np.ndarray:
    """``values`` (a numeric list's array: ints or floats) as a ``want`` array of its own
    memory (a copy unless ``values`` is already writable and of that dtype).

    Raises:
        NotHeldError: an int ``want`` cannot hold exactly, or floats asked for as ints.
    """
    have = values.dtype
    if have.kind in "iu" and values.size and not _always_held(have, want):
        _check_ints(values, want, field)
    elif have.kind == "f" and want.kind in "iu":
        raise NotHeldError(
            f"field {field!r:.80} holds floats, which {want.name} (an integer dtype) cannot hold"
        )
    with np.errstate(over="ignore"):  # a float past float16/float32's range rounds to inf
        return values.astype(want, copy=not values.flags.writeable)


def _always_held(have: np.dtype, want: np.dtype) -> bool:
    """Whether every value of int dtype ``have`` is exact in ``want``.

    NOTE: not ``np.can_cast(..., "safe")``, which calls int64 -> float64 safe: 2**53 + 1 is not."""
    if want.kind in "iu":
        return np.can_cast(have, want, "safe")
    return have.itemsize * 8 - (have.kind == "i") <= np.finfo(want).nmant + 1


def _check_ints(values: np.ndarray, want: np.dtype, field: Any) -> None:
    if want.kind in "iu":
        info = np.iinfo(want)
        low, high = int(values.min()), int(values.max())
        bad = low if low < info.min else high if high > info.max else None
    else:
        # every int up to 2**(mantissa bits + 1) is exact in a float; past it, one by one
        bound = 2 ** (np.finfo(want).nmant + 1)
        bad = None
        far = values[(values > bound) | (values < -bound)]
        for value in map(int, far):
            with np.errstate(over="ignore"):
                held = want.type(value)
            if not np.isfinite(held) or int(held) != value:
                bad = value
                break
    if bad is not None:
        raise NotHeldError(f"field {field!r:.80} holds {bad}, which {want.name} cannot hold")
