"""archive_manager: immutable, indexed, content-addressed archives of RL rollout data.

Save a rollout with one call, load all of it or only the samples of one sample key or task
key, and let garbage collection reclaim exactly what no owner retains.
"""

from __future__ import annotations

from .archive import Archive, ArchiveInfo
from .codec import TensorRef, materialize_tensor_refs
from .compat import RolloutArchive
from .manager import ArchiveManager
from .metadata import describe_sample, validate_sample_metadata
from .samples import Sample, register_sample_class
from .writer import ArchiveWriter

__version__ = "0.1.0"

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
