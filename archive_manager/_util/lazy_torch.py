"""torch, imported only where a tensor is encoded or decoded (docs/architecture.md, Layers).

Importing torch takes three seconds or more, which every CLI verb and every ``import
archive_manager`` paid while torch was imported at module level; none of them needs it unless
a tensor is in play.  A value can only be a tensor if torch was imported by someone (the
caller built it with torch), so `is_tensor` answers without importing torch.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import TypeGuard

    import torch

__all__ = ["is_tensor", "tensor_class", "torch_module"]


def torch_module() -> ModuleType:
    """The torch module, imported on the first call (later calls find it in `sys.modules`)."""
    import torch

    return torch


def tensor_class() -> type | None:
    """``torch.Tensor`` if torch was imported, else None: then no value is a tensor."""
    torch = sys.modules.get("torch")
    # NOTE: getattr: another thread may be half-way through torch's own import.
    return None if torch is None else getattr(torch, "Tensor", None)


def is_tensor(value: Any) -> TypeGuard[torch.Tensor]:
    """``isinstance(value, torch.Tensor)``, without importing torch when nobody did."""
    tensor = tensor_class()
    return tensor is not None and isinstance(value, tensor)
