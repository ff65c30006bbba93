"""Samples <-> chunk bytes. No catalog, no file I/O, no pickle (work in progress)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["TensorRef", "materialize_tensor_refs"]


class TensorRef:
    """A tensor stored as its own blob; loaded (and digest-checked) on first use.

    Shape and dtype are known without reading the blob, so metadata and viewers can
    describe it for free.  Torch functions and tensor methods materialize it transparently.
    """

    __slots__ = ("_loader", "_tensor", "digest", "dtype", "nbytes", "shape")

    def __init__(
        self,
        digest: str,
        dtype: torch.dtype,
        shape: tuple[int, ...],
        nbytes: int,
        loader: Callable[[str], torch.Tensor] | None = None,
    ) -> None:
        self.digest = digest
        self.dtype = dtype
        self.shape = torch.Size(shape)
        self.nbytes = nbytes
        self._loader = loader
        self._tensor: torch.Tensor | None = None

    def materialize(self) -> torch.Tensor:
        """Load the tensor (once) and return it."""
        if self._tensor is None:
            if self._loader is None:
                raise RuntimeError(f"tensor blob {self.digest} has no loader attached")
            self._tensor = self._loader(self.digest)
        return self._tensor

    def __repr__(self) -> str:
        return f"TensorRef({self.digest}, dtype={self.dtype}, shape={list(self.shape)})"


def materialize_tensor_refs(obj: Any) -> Any:
    """Return ``obj`` with every `TensorRef` inside (lists, tuples, dicts, samples) loaded."""
    raise NotImplementedError  # filled in with the codec
