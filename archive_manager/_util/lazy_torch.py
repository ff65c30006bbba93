"""torch, imported only where a tensor is encoded or decoded (docs/architecture/index.md, "Layers").

Importing torch takes three seconds or more, which every CLI verb and every ``import
archive_manager`` paid while torch was imported at module level; none of them needs it unless
a tensor is in play.  A value can only be a tensor if torch was imported by someone (the
caller built it with torch), so `is_tensor` answers without importing torch.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..errors import extra_hint

if TYPE_CHECKING:
    from typing import TypeGuard

    import torch

__all__ = ["TORCH_EXTRA_HINT", "is_tensor", "tensor_class", "torch_installed", "torch_module"]

# torch is an extra (docs/quickstart.md, "Install"): a lean install audits, lists and exports
# pools without it, and whatever needs it names the extra.
TORCH_EXTRA_HINT = extra_hint("torch")


def torch_module() -> ModuleType:
    """The torch module, imported on the first call (later calls find it in `sys.modules`).

    Raises:
        MissingDependencyError: torch is not installed (an ImportError too).
    """
    loaded = sys.modules.get("torch")
    if loaded is not None:
        return loaded
    try:
        import torch
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        from ..errors import MissingDependencyError

        raise MissingDependencyError(
            f"this needs PyTorch, which is not installed; {TORCH_EXTRA_HINT}"
        ) from None
    return torch


def torch_installed() -> bool:
    """Whether torch can be imported here, without importing it."""
    if sys.modules.get("torch") is not None:
        return True
    from importlib.util import find_spec

    return find_spec("torch") is not None


def tensor_class() -> type | None:
    """``torch.Tensor`` if torch was imported, else None: then no value is a tensor."""
    torch = sys.modules.get("torch")
    # NOTE: getattr: another thread may be half-way through torch's own import.
    return None if torch is None else getattr(torch, "Tensor", None)


def is_tensor(value: Any) -> TypeGuard[torch.Tensor]:
    """``isinstance(value, torch.Tensor)``, without importing torch when nobody did."""
    tensor = tensor_class()
    return tensor is not None and isinstance(value, tensor)
