"""The lazy tensor proxy: `TensorRef` stands for a tensor stored as its own blob until a use
needs its values, and `materialize_tensor_refs` swaps every proxy in a sample for its tensor.

Shape and dtype come from the chunk's tree, so describing a sample never reads a tensor blob.

Where training code hands a value to torch rather than calling it, a `TensorRef` gives its
tensor (docs/architecture/reading.md, "Lazy tensors"): ``torch.as_tensor`` and ``torch.tensor``
through ``__dlpack__``, ``default_collate`` through torch's collate registry, and pickling
(``pickle``, ``torch.save``, ``copy.deepcopy``, a DataLoader worker sending a sample) as the
tensor itself, so neither the loader nor the pool it reads (an engine, a connection) is ever
pickled and what was pickled loads without this library.  ``isinstance(ref, torch.Tensor)``
stays False: a proxy cannot pass that test, so the loaders take ``materialize=True``.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable, Sequence
from operator import countOf
from typing import TYPE_CHECKING, Any

from .._util.lazy_torch import torch_module
from ..errors import ArchiveError, IntegrityError

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["TensorRef", "materialize_tensor_refs"]


class TensorRef:
    """A tensor stored as its own blob; loaded (and digest-checked) on first use.

    Shape and dtype are known without reading the blob, so metadata and viewers can describe
    it for free.  Torch functions, tensor methods and ``==`` materialize it transparently.
    """

    __slots__ = ("_loader", "_lock", "_tensor", "digest", "dtype", "nbytes", "shape")

    def __init__(
        self,
        digest: str,
        dtype: torch.dtype,
        shape: Sequence[int],
        nbytes: int,
        loader: Callable[[str], torch.Tensor] | None = None,
    ) -> None:
        self.digest = digest
        self.dtype = dtype
        # dtype is a torch.dtype, so torch is imported already: this costs nothing.
        self.shape = torch_module().Size(shape)
        self.nbytes = nbytes
        self._loader = loader
        self._tensor: torch.Tensor | None = None
        self._lock = threading.Lock()
        if not _collate_registered:
            _register_collate()

    def materialize(self) -> torch.Tensor:
        """Load the tensor (once; later calls return the same tensor)."""
        with self._lock:
            if self._tensor is None:
                if self._loader is None:
                    raise ArchiveError(f"tensor blob {self.digest} has no loader attached")
                tensor = self._loader(self.digest)
                if tensor.dtype != self.dtype or tensor.shape != self.shape:
                    raise IntegrityError(
                        f"tensor blob {self.digest} holds {tensor.dtype}{list(tensor.shape)}, "
                        f"its reference says {self.dtype}{list(self.shape)}"
                    )
                self._tensor = tensor
            return self._tensor

    @property
    def loaded(self) -> bool:
        """Whether the blob has been read already."""
        return self._tensor is not None

    def dim(self) -> int:
        """Number of dimensions, without loading."""
        return len(self.shape)

    def numel(self) -> int:
        """Number of elements, without loading."""
        return math.prod(self.shape)

    def size(self, dim: int | None = None) -> Any:
        """Like `torch.Tensor.size`, without loading."""
        return self.shape if dim is None else self.shape[dim]

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        length: int = self.shape[0]
        return length

    def __getattr__(self, name: str) -> Any:
        # Only reached for names TensorRef does not define: behave like the tensor.
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.materialize(), name)

    def __getitem__(self, key: Any) -> Any:
        return self.materialize()[key]

    def __eq__(self, other: object) -> Any:
        return self.materialize() == _materialized(other)

    def __ne__(self, other: object) -> Any:
        return self.materialize() != _materialized(other)

    __hash__ = None  # type: ignore[assignment]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        arr = self.materialize().numpy()
        return arr if dtype is None else arr.astype(dtype)

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        return func(*_materialized(tuple(args)), **_materialized(kwargs or {}))

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        # torch.as_tensor / torch.tensor / torch.asarray look for this before they try a
        # sequence or a number (our delegated __index__ made them take a ref for an int).
        return self.materialize().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self.materialize().__dlpack_device__()

    def __copy__(self) -> TensorRef:
        twin = TensorRef(self.digest, self.dtype, self.shape, self.nbytes, self._loader)
        twin._tensor = self._tensor
        return twin

    def __deepcopy__(self, memo: dict[int, Any]) -> TensorRef:
        # A copy stays lazy (and shares the loader, which is the pool's, not the value's);
        # a tensor already loaded is copied, as deepcopy copies a tensor.
        twin = TensorRef(self.digest, self.dtype, self.shape, self.nbytes, self._loader)
        if self._tensor is not None:
            twin._tensor = self._tensor.clone()
        return twin

    def __reduce_ex__(self, protocol: Any) -> Any:
        # NOTE: pickled as the tensor it stands for, never as a reference: the loader holds
        # the pool (an engine, connections), and a torch.save file must be self-contained
        # and load with weights_only=True.  The blob is read here, in the sending process.
        tensor: Any = self.materialize()
        return tensor.__reduce_ex__(protocol)

    def __repr__(self) -> str:
        return f"TensorRef({self.digest}, dtype={self.dtype}, shape={list(self.shape)})"


def _delegate(name: str) -> Callable[..., Any]:
    def method(self: TensorRef, *args: Any) -> Any:
        return getattr(self.materialize(), name)(*_materialized(args))

    method.__name__ = name
    return method


# Operators are looked up on the type, not through __getattr__: give TensorRef the tensor's.
for _name in (
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
    "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__",
    "__rpow__", "__matmul__", "__rmatmul__", "__and__", "__rand__", "__or__", "__ror__",
    "__xor__", "__rxor__", "__lshift__", "__rshift__", "__lt__", "__le__", "__gt__", "__ge__",
    "__neg__", "__pos__", "__abs__", "__invert__", "__bool__", "__float__", "__int__",
    "__index__", "__iter__", "__contains__",
):  # fmt: skip
    setattr(TensorRef, _name, _delegate(_name))
del _name


_ATOMIC = frozenset({type(None), bool, int, float, str})

_collate_registered = False


def _register_collate() -> None:
    """Teach ``torch.utils.data.default_collate`` to collate refs as their tensors.

    Done on the first ref made (torch is imported then: the ref's dtype is a torch.dtype),
    through the registry torch documents for extending it (``default_collate_fn_map``).
    """
    global _collate_registered
    _collate_registered = True
    try:
        from torch.utils.data._utils.collate import default_collate_fn_map
    except ImportError:  # a torch without the registry (before 1.13): nothing to extend
        return
    default_collate_fn_map.setdefault(TensorRef, _collate_refs)


def _collate_refs(batch: Sequence[Any], *, collate_fn_map: dict[Any, Any] | None = None) -> Any:
    """`default_collate` of a batch whose first item is a ref: its tensors, stacked."""
    from torch.utils.data._utils.collate import collate_tensor_fn

    return collate_tensor_fn([_materialized(x) for x in batch], collate_fn_map=collate_fn_map)


def _materialized(obj: Any) -> Any:
    # NOTE: containers are rebuilt only when a ref inside was replaced, and lists of plain
    # values (token ids, masks, log-probs: millions of items per rollout) are skipped in one
    # C-level pass; rebuilding every list item by item took 2.4 s for a 1024-sample rollout.
    if isinstance(obj, TensorRef):
        return obj.materialize()
    if isinstance(obj, (list, tuple)):
        if obj and type(obj[0]) in _ATOMIC and countOf(map(type, obj), type(obj[0])) == len(obj):
            return obj
        items = [_materialized(v) for v in obj]
        if all(new is old for new, old in zip(items, obj, strict=True)):
            return obj
        return items if isinstance(obj, list) else tuple(items)
    if isinstance(obj, dict):
        values = {k: _materialized(v) for k, v in obj.items()}
        if all(values[k] is v for k, v in obj.items()):
            return obj
        return values
    return obj


def materialize_tensor_refs(obj: Any) -> Any:
    """Return ``obj`` with every `TensorRef` inside replaced by its tensor.

    Lists, tuples and dicts that hold a ref are rebuilt (others are returned as they are);
    dataclass samples are updated in place (their attributes, extras included) and returned.
    """
    if isinstance(obj, (TensorRef, tuple, list, dict)):
        return _materialized(obj)
    attrs = getattr(obj, "__dict__", None)
    if attrs is not None and not isinstance(obj, type):
        for key, value in list(attrs.items()):
            new = _materialized(value)
            if new is not value:
                setattr(obj, key, new)
            elif dataclasses.is_dataclass(value) and not isinstance(value, type):
                # a helper held by the sample (`Sample.spec_info` with an extra tensor)
                materialize_tensor_refs(value)
    return obj
