"""archive_manager: immutable, indexed, content-addressed archives of RL rollout data.

Save a rollout with one call, load all of it or only the samples of one sample key or task
key, and let garbage collection reclaim exactly what no owner retains.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

# NOTE: the public names are imported on first use (PEP 562): every CLI call and every TAB
# completion imports this package, and the modules behind these names pull in SQLAlchemy,
# numpy and zstandard, which `--help` never needs (docs/architecture/start-up.md, "Start-up").
if TYPE_CHECKING:
    from .codec import TensorRef, materialize_tensor_refs
    from .compat import RolloutArchive
    from .manager import ArchiveManager
    from .metadata import describe_sample, validate_sample_metadata
    from .pool.archive import Archive, ArchiveInfo
    from .pool.writer import ArchiveWriter
    from .samples import Sample, register_sample_class

__version__ = "0.1.0"

#: Each public name and the module (below this package) that defines it.
_LAZY: dict[str, str] = {
    "Archive": "pool.archive",
    "ArchiveInfo": "pool.archive",
    "ArchiveManager": "manager",
    "ArchiveWriter": "pool.writer",
    "RolloutArchive": "compat",
    "Sample": "samples",
    "TensorRef": "codec",
    "describe_sample": "metadata",
    "materialize_tensor_refs": "codec",
    "register_sample_class": "samples",
    "validate_sample_metadata": "metadata",
}

__all__ = [
    "Archive",
    "ArchiveInfo",
    "ArchiveManager",
    "ArchiveWriter",
    "RolloutArchive",
    "Sample",
    "TensorRef",
    "__version__",
    "describe_sample",
    "materialize_tensor_refs",
    "register_sample_class",
    "validate_sample_metadata",
]


# Hidden from type checkers: they see the TYPE_CHECKING imports above, so a misspelt name
# is an error for them rather than an Any.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        """Import a public name's module on first access, then keep the name here.

        A submodule (``archive_manager.errors``) is imported too, as ``import archive_manager``
        made every submodule reachable when this package imported its modules eagerly.
        """
        module = _LAZY.get(name)
        if module is None:
            if name.startswith("__") or not importlib.util.find_spec(f"{__name__}.{name}"):
                raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
            return importlib.import_module(f".{name}", __name__)
        value = getattr(importlib.import_module(f".{module}", __name__), name)
        # Cached: later accesses are plain attribute reads, and __getattr__ is not asked again.
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(__all__))
