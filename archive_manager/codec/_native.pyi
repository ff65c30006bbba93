from collections.abc import Callable

# The C extension's signature (_native.c); None: not a list of exact ints or exact floats.
def numbers(value: list[object], /) -> tuple[str, bytes, bool] | None: ...

# Marks the plain leaves of items met for the first time; False (leaves unchanged): Python's turn.
def first_leaves(items: list[object] | tuple[object, ...], leaves: dict[int, int], /) -> bool: ...

# _Encoder._dict's loop over a dict of str keys; None (leaves unchanged): Python's turn (a map).
def dict_items(
    value: dict[object, object],
    leaves: dict[int, int],
    encode: Callable[[object], object],
    again: Callable[[object], None] | None,
    where: list[object],
    /,
) -> dict[str, object] | None: ...

# A stored numeric array's items as Python numbers (tolist); None: a dtype it leaves to numpy.
def stored_list(data: object, dtype: str, shuffled: object, /) -> list[object] | None: ...

# A load begins (True) or ends (False): pymalloc's arenas are made ahead on a thread meanwhile;
# whether the allocator is now installed (True) or was put back (False).
def arenas_ahead(on: bool, /) -> bool: ...

# The indices of parts holding needle (ASCII case-folded when folded) or any of also.
def texts_holding(
    parts: object, needle: bytes, folded: bool, also: tuple[bytes, ...], /
) -> list[int]: ...
