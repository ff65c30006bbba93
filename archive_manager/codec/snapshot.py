"""Snapshots of samples that encode as the samples do (`ArchiveManager.save_async`;
docs/architecture/save-protocol.md, "Saving in the background").

`take_samples` copies what of each sample the caller could change afterwards, and no more:

* a numeric list becomes the array a record stores for it (`TakenList`): reading each number
  once is what any copy of the list costs, and the encoder needs that array anyway.  The
  lists of a batch of samples are converted together (`fill`), on several threads where the
  C extension has them: the calling thread holds the GIL meanwhile, so no Python code runs
  and no list can change (docs/architecture/samples-and-values.md, "Native list conversion");
  there the arrays are read-only views of one block of memory per batch, which a later batch
  reuses once no copy holds it (no page faults: docs/architecture/save-protocol.md, "Saving
  in the background");
* other lists, dicts and tuples are copied around the same leaves (str, int, float, bool,
  None, bytes, enum members and numpy scalars are immutable: the copy holds those very
  objects);
* a tensor or numpy array that owns its memory whole is copied once;
* a registered dataclass (the sample itself included) whose fields are plain attributes
  becomes an object of its class, made without running any code of it, over a copy of its
  ``__dict__`` (live ``_queue_*`` state left out: it is never stored).

A container met twice is copied once (a memo, as `copy.deepcopy` keeps), so what the
encoder meets shared or cyclic in the copy is what it met in the sample.  The encoder then
writes the copy exactly as it would have written the sample at that moment: the same record,
text part, tensor blobs and description (tests/codec/test_snapshot.py).

A sample holding anything else (a view of another tensor or array, a tensor on a device, a
lazy `TensorRef`, a PIL image, a dict subclass, an object of a class the codec refuses, a
numeric-looking list the codec does not store as an array, nesting too deep) is not taken
(None): the caller encodes that sample itself right away (`writer.prepare_sample`), which
copies what the codec stores and refuses what it refuses.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._util.lazy_torch import tensor_class, torch_module
from ..samples import QUEUE_PREFIX
from ..samples.records import _rebuild_plan
from ._accel import native_fill_taken, native_take_dict, native_take_object
from .values import _MIN_ARRAY_LEN, TakenList, list_array

__all__ = ["TakenList", "fill", "lists_ahead", "take_samples"]

# Values the caller cannot change that cost nothing to hold: kept as they are.
_SMALL = frozenset({int, float, bool, type(None)})
# The first item of a list that may be a numeric array (the rest are checked by `fill`).
_NUMBER = frozenset({int, float})
# What a snapshot is charged for each sample beside its values (its containers).
_SAMPLE_OVERHEAD = 512
# Threads that convert a batch's numeric lists (this one included): the copy is bound by
# memory reads (one per number), which more cores than this no longer speed up.
_MAX_THREADS = 4
# The fewest numbers `lists_ahead` converts ahead: ~1 ms of conversion on one thread, about
# what starting its threads can cost on a loaded machine.
_AHEAD_MIN = 1 << 18


def _threads() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(_MAX_THREADS, cores))


THREADS = _threads()


class _NotTaken(Exception):
    """A value this does not copy: its sample is encoded on the caller's thread."""


class _Taker:
    """The copies of one sample: the memo, the bytes they hold, the lists left to `fill`."""

    __slots__ = ("memo", "nbytes", "pending", "ranges", "storages")

    def __init__(self, pending: list[tuple[list[Any], TakenList]]) -> None:
        # id of an original container -> its copy (the originals are alive: the sample
        # holds them while it is taken)
        self.memo: dict[int, Any] = {}
        self.nbytes = _SAMPLE_OVERHEAD
        self.pending = pending
        # memory tensors and arrays were copied from: two over one buffer (views, windows
        # of one numpy array) are not taken, as the encoder's expansion bound and alias
        # indices count them together
        self.storages: set[int] = set()
        self.ranges: list[tuple[int, int]] = []

    def take(self, value: Any) -> Any:
        t = type(value)
        if t in _SMALL:
            return value
        handler = _HANDLERS.get(t)
        if handler is None:
            handler = _handler(t)
        return handler(self, value)

    def _text(self, value: str | bytes) -> str | bytes:
        self.nbytes += len(value)
        return value

    def _same(self, value: Any) -> Any:
        return value

    def _list(self, value: list[Any]) -> Any:
        key = id(value)
        copied = self.memo.get(key)
        if copied is not None:
            return copied
        if len(value) >= _MIN_ARRAY_LEN and type(value[0]) in _NUMBER:
            return self._deferred(value)
        copied = self.memo[key] = []
        take = self.take
        small = _SMALL
        copied.extend([v if type(v) in small else take(v) for v in value])
        self.nbytes += 8 * len(value)
        return copied

    def _deferred(self, value: list[Any]) -> TakenList:
        """A list that may be a numeric array: its `TakenList`, filled by `fill`."""
        taken = self.memo[id(value)] = TakenList()
        taken.length = len(value)
        self.pending.append((value, taken))
        return taken

    def _tuple(self, value: tuple[Any, ...]) -> tuple[Any, ...]:
        copied = self.memo.get(id(value))
        if copied is None:
            take = self.take
            copied = self.memo[id(value)] = tuple([take(v) for v in value])
            self.nbytes += 8 * len(value)
        return copied

    def _dict(self, value: dict[Any, Any]) -> dict[Any, Any]:
        copied = self.memo.get(id(value))
        if copied is not None:
            return copied  # type: ignore[no-any-return]
        copied = self.memo[id(value)] = {}
        self._fill(value, copied)
        return copied

    def _fill(self, value: dict[Any, Any], out: dict[Any, Any]) -> None:
        """Put the copy of each entry of ``value`` in the empty dict ``out``."""
        if native_take_dict is not None:
            # the same loop in C (it calls `take` for what is not a leaf or a list to defer)
            nbytes = native_take_dict(
                value, out, self.memo, TakenList, self.take, self.pending, _SAME, _PLAIN
            )
            if nbytes is not None:
                self.nbytes += nbytes
                return
        self.nbytes += 16 * len(value)
        take = self.take
        for k, v in value.items():
            if type(k) is not str:
                k = self._key(k)
            t = type(v)
            if t in _SMALL:
                out[k] = v
            elif t is str or t is bytes:
                self.nbytes += len(v)
                out[k] = v
            elif t is list and len(v) >= _MIN_ARRAY_LEN and type(v[0]) in _NUMBER:
                known = self.memo.get(id(v))
                out[k] = known if known is not None else self._deferred(v)
            else:
                out[k] = take(v)

    def _key(self, key: Any) -> Any:
        t = type(key)
        if t in _SMALL or t is str or t is bytes or t is tuple:
            return self.take(key)
        raise _NotTaken

    def _bytearray(self, value: bytearray) -> bytearray:
        copied = self.memo.get(id(value))
        if copied is None:
            copied = self.memo[id(value)] = bytearray(value)
            self.nbytes += len(value)
        return copied

    def _object(self, value: Any) -> Any:
        """A dataclass whose fields are all plain attributes: an object of its class (no code
        of it run) over a copy of its ``__dict__``, live queue state left out."""
        copied = self.memo.get(id(value))
        if copied is not None:
            return copied
        state, declared = _plain_state(value)
        copied = self.memo[id(value)] = object.__new__(type(value))
        if _holds_queue_key(state):
            state = {k: v for k, v in state.items() if not _is_queue(k) or k in declared}
        fields: dict[str, Any] = {}
        self._fill(state, fields)
        object.__setattr__(copied, "__dict__", fields)
        return copied

    def _tensor(self, value: Any) -> Any:
        copied = self.memo.get(id(value))
        if copied is not None:
            return copied
        torch = torch_module()
        if (
            value.device.type != "cpu"
            or value.layout != torch.strided
            or value.is_nested
            or value.is_quantized
            or value.is_conj()
            or value.is_neg()
            or value.storage_offset()
            or not value.is_contiguous()
        ):
            raise _NotTaken
        storage = value.untyped_storage()
        nbytes = storage.nbytes()
        if nbytes != value.numel() * value.element_size():
            raise _NotTaken  # a view of part of its storage
        if nbytes:
            self._claim(storage.data_ptr(), nbytes)
        copied = self.memo[id(value)] = value.detach().clone()
        self.nbytes += nbytes
        return copied

    def _ndarray(self, value: np.ndarray) -> np.ndarray:
        copied = self.memo.get(id(value))
        if copied is not None:
            return copied  # type: ignore[no-any-return]
        if value.base is not None or value.dtype.hasobject or not value.flags.c_contiguous:
            raise _NotTaken
        if value.nbytes:
            self._claim(value.__array_interface__["data"][0], value.nbytes)
        copied = self.memo[id(value)] = value.copy()
        self.nbytes += value.nbytes
        return copied

    def _claim(self, start: int, nbytes: int) -> None:
        """Note the memory ``[start, start + nbytes)`` copied; a value over any of it again is
        not taken."""
        if start in self.storages:
            raise _NotTaken
        end = start + nbytes
        for lo, hi in self.ranges:
            if lo < end and start < hi:
                raise _NotTaken
        self.storages.add(start)
        self.ranges.append((start, end))


def _not_taken(taker: _Taker, value: Any) -> Any:
    raise _NotTaken


Handler = Callable[[_Taker, Any], Any]

# How each type of value is taken, by exact type (`_handler` adds the types met).
_HANDLERS: dict[type, Handler] = {
    str: _Taker._text,
    bytes: _Taker._text,
    list: _Taker._list,
    dict: _Taker._dict,
    tuple: _Taker._tuple,
    bytearray: _Taker._bytearray,
    np.ndarray: _Taker._ndarray,
}
# The types `_handler` found immutable (the C loop keeps their values as they are too),
# and the dataclasses whose fields are their ``__dict__``'s entries, with their declared
# field names (the C loop copies their objects as `_Taker._object` does).
_SAME: set[type] = set()
_PLAIN: dict[type, frozenset[str]] = {}
# bounded: classes made on the fly cannot grow them without limit
_MAX_HANDLERS = 256


def _handler(t: type) -> Handler:
    handler: Handler
    if issubclass(t, (enum.Enum, np.generic)):
        handler = _Taker._same  # members and numpy scalars are immutable
        if len(_SAME) < _MAX_HANDLERS:
            _SAME.add(t)
    elif t is tensor_class():
        handler = _Taker._tensor
    elif dataclasses.is_dataclass(t):
        handler = _Taker._object
        try:
            plan = _rebuild_plan(t)
        except TypeError:
            plan = None
        if (
            plan is not None
            and plan.plain_names is not None
            and plan.instance_dict is not None
            and len(_PLAIN) < _MAX_HANDLERS
        ):
            _PLAIN[t] = plan.declared
    else:
        # anything else (a subclass of a container, tensor or array, an image, a lazy
        # TensorRef, an object the codec refuses) is left to the encoder on the caller's
        # thread, which copies what it stores and refuses as `save` refuses
        handler = _not_taken
    if len(_HANDLERS) < _MAX_HANDLERS:
        _HANDLERS[t] = handler
    return handler


def _plain_state(value: Any) -> tuple[dict[str, Any], frozenset[str]]:
    """A dataclass instance's ``__dict__`` and declared field names, when its fields are its
    ``__dict__``'s entries (no slot, property or attribute hook: what `sample_to_record`
    then copies whole); else `_NotTaken`."""
    try:
        plan = _rebuild_plan(type(value))  # type: ignore[arg-type]  # a class is hashable
    except TypeError:
        raise _NotTaken from None
    if plan.plain_names is None or plan.instance_dict is None:
        raise _NotTaken
    state = plan.instance_dict(value)
    if type(state) is not dict:
        raise _NotTaken
    return state, plan.declared


def _is_queue(key: Any) -> bool:
    return isinstance(key, str) and key.startswith(QUEUE_PREFIX)  # as `is_queue_key`


def _holds_queue_key(keys: Any) -> bool:
    try:
        joined = "\0".join(keys)  # one C call; a false hit only takes the exact test
    except TypeError:  # a key that is not a str
        return any(_is_queue(k) for k in keys)
    return QUEUE_PREFIX in joined and any(_is_queue(k) for k in keys)


def _take_one(sample: Any, pending: list[tuple[list[Any], TakenList]]) -> list[Any] | None:
    """``[copy, bytes, holds queue state]`` of one sample, its lists appended to ``pending``
    unfilled; None when it is not taken (``pending`` as it was)."""
    start = len(pending)
    taker = _Taker(pending)
    try:
        if type(sample) is dict:
            # a dict sample's ``_queue_*`` keys are never stored either (`sample_to_record`)
            queue = _holds_queue_key(sample)
            taken = taker.take(
                {k: v for k, v in sample.items() if not _is_queue(k)} if queue else sample
            )
            fields = taken
        elif (_HANDLERS.get(type(sample)) or _handler(type(sample))) is _Taker._object:
            got = None
            if native_take_object is not None:
                got = native_take_object(
                    sample, taker.memo, TakenList, taker.take, pending, _SAME, _PLAIN
                )
            if got is None:
                taken = taker.take(sample)
            else:
                taken, nbytes = got
                taker.nbytes += nbytes
            fields = taken.__dict__
            queue = len(fields) != len(sample.__dict__)  # `_object` left queue state out
        else:
            raise _NotTaken  # not a sample: `save` refuses it (the encoder says why)
        get = fields.get
        if TakenList in (type(get("task_key")), type(get("index")), type(get("status"))):
            raise _NotTaken  # a list where the save reads text
    except Exception:
        # NOTE: not only `_NotTaken`: nesting too deep (RecursionError), an object its class
        # will not make: whatever the copy meets is the encoder's to refuse, with its message
        del pending[start:]
        return None
    return [taken, taker.nbytes, queue]


def fill(pending: list[tuple[list[Any], TakenList]]) -> list[int]:
    """Give each pending `TakenList` the array of its list (`list_array`); the indices of the
    entries whose list is no numeric array (an empty one included: Python code may have run
    since it was collected)."""
    if native_fill_taken is not None:
        return native_fill_taken(pending, THREADS)
    bad = []
    for i, (value, taken) in enumerate(pending):
        got = list_array(value) if value else None  # emptied since it was collected
        if got is None:
            bad.append(i)
        else:
            taken.dtype, taken.data, taken.shuffled = got
    return bad


def lists_ahead(samples: Sequence[Any]) -> dict[int, tuple[list[Any], TakenList]]:
    """The numeric lists among the top-level fields of ``samples`` (dataclasses, `Sample`s,
    dicts) converted together to the arrays the codec stores for them, as `take_samples`
    converts them (`fill`, on `THREADS` threads): id -> (the list, its array), for
    `codec.encode_sample`'s ``ahead``.

    For a save whose caller holds the samples until it returns (`pool.save`): the encoder
    then writes each list's array instead of reading the list on the caller's thread alone.
    The list is held beside its array, so its id names no other list meanwhile; a list that
    is no numeric array after all is left out (the encoder decides it as before).  A batch of
    fewer than `_AHEAD_MIN` numbers gets an empty map: the encoder converts them as it goes,
    since starting the conversion's threads costs more than they would save (a save of 8
    samples took 0.07-0.09 ms longer with them, 1-2%).
    """
    pending: list[tuple[list[Any], TakenList]] = []
    numbers = 0
    for sample in samples:
        try:
            fields = sample if type(sample) is dict else getattr(sample, "__dict__", None)
        except Exception:
            continue  # (a class's own ``__dict__``) the encoder meets it and says what is wrong
        if type(fields) is not dict:
            continue
        for value in fields.values():
            if type(value) is list and len(value) >= _MIN_ARRAY_LEN and type(value[0]) in _NUMBER:
                taken = TakenList()
                taken.length = len(value)
                pending.append((value, taken))
                numbers += len(value)
    if numbers < _AHEAD_MIN:
        return {}
    bad = set(fill(pending))
    return {id(entry[0]): entry for i, entry in enumerate(pending) if i not in bad}


def take_samples(samples: Sequence[Any]) -> list[tuple[Any, int, bool] | None]:
    """For each sample, a copy that encodes (and is described) as the sample does now, the
    bytes it holds, and whether the sample holds live queue state (``_queue_*``: left out of
    the copy, so its task key is to be read from the sample itself); None for a sample this
    does not copy (encode the sample itself then).

    Leaves the caller's objects as they are; the copies hold none of their mutable parts.
    """
    pending: list[tuple[list[Any], TakenList]] = []
    owners: list[int] = []  # the sample of each pending list
    out: list[list[Any] | None] = []
    for sample in samples:
        got = _take_one(sample, pending)
        owners.extend([len(out)] * (len(pending) - len(owners)))
        out.append(got)
    for i in fill(pending):
        out[owners[i]] = None  # a list that is no array after all: the encoder's to write
    for (_, taken), owner in zip(pending, owners, strict=True):
        entry = out[owner]
        if entry is not None:
            entry[1] += taken.nbytes
    return [None if entry is None else (entry[0], entry[1], entry[2]) for entry in out]
