"""What every part of the Arrow export shares: the key and tail columns, column metadata keys, the
source of an archive's rows, a row, `SchemaDrift`, and pyarrow on first use.

(docs/architecture/getting-data-out.md, "Getting data out".)
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._util.lazy_torch import torch_module
from ...codec import TensorRef
from ...codec.tensors import torch_dtype_names
from ...errors import ArchiveError, MissingDependencyError, UnencodableError, extra_hint
from ..context import PoolContext

if TYPE_CHECKING:
    import pyarrow as pa
    import torch


#: The columns every exported row starts with: where the sample is and what its archive is.
KEY_COLUMNS = ("archive", "position", "sample_key", "task_key", "rollout_id", "evaluation")
#: The columns every exported row ends with: what an import needs to rebuild the sample.
TAIL_COLUMNS = ("archive_attrs", "sample_class", "sample_converted", "sample_shared")
RESERVED = frozenset(KEY_COLUMNS + TAIL_COLUMNS)
#: A sample field whose name is reserved (slime's ``rollout_id``, a ``task_key`` attribute)
#: gets this prefix; so does one that starts with it, so the mapping stays reversible.
FIELD_PREFIX = "field."
SHAPE_SUFFIX = ".shape"

# Arrow field metadata: how a column's values are read back.
_KIND = b"archive_manager.kind"  # json, tensor, ndarray, shape
_DTYPE = b"archive_manager.dtype"  # a tensor column's torch or numpy dtype
_NULL = b"archive_manager.null"  # "absent": a null is a field the sample lacks (not a None)
_TAG = "$t"
_FLOAT_BITS = struct.Struct("<d")
# NOTE: Python refuses to write or read an int of more digits than this in decimal (by
# default; sys.set_int_max_str_digits), so json.dumps raised a bare ValueError on an int the
# codec stores (tagged): past it an int is written as a tagged hex string.
_JSON_INT_LIMIT = 10**sys.int_info.default_max_str_digits
_MISSING: Any = object()
_INT64 = (-(2**63), 2**63 - 1)
# the tail columns holding JSON text (a JSON value in JSONL)
_JSON_TAIL = frozenset(("archive_attrs", "sample_shared"))


def pyarrow_module() -> Any:
    """pyarrow, imported on first use.

    Raises:
        MissingDependencyError: it is not installed (the ``data`` extra).
    """
    try:
        import pyarrow
    except ImportError as exc:
        raise MissingDependencyError(
            "Arrow, Parquet, pandas and dataset exports need pyarrow; " + extra_hint("data")
        ) from exc
    return pyarrow


@dataclass(frozen=True)
class ArchiveSource:
    """What reading an archive's rows needs (`Archive.arrow_source` makes one)."""

    context: PoolContext
    archive_id: int
    name: str
    rollout_id: int | None
    evaluation: bool
    attrs: dict[str, Any] | None
    read_blob: Callable[[str, str], memoryview]
    load_tensor: Callable[[str], torch.Tensor]
    load_array: Callable[[str], np.ndarray]


@dataclass
class Row:
    position: int
    sample_key: str
    task_key: str | None
    cls: str | None
    fields: dict[str, Any]
    converted: list[str] | None


class SchemaDrift(ArchiveError, ValueError):
    """A batch's columns do not fit the schema of the batches before it: ``schema`` holds
    both (`merge_schemas`), ``column`` is the first that did not fit."""

    def __init__(self, message: str, schema: pa.Schema, column: str | None = None) -> None:
        super().__init__(message)
        self.schema = schema
        self.column = column


def _torch_dtype_name(value: Any) -> str:
    return torch_dtype_names()[value.dtype]


def _tensor_numpy(value: Any) -> np.ndarray:
    tensor = value.materialize() if isinstance(value, TensorRef) else value
    torch = torch_module()
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()  # exact: every bfloat16 is a float32
    try:
        return tensor.numpy()
    except TypeError as exc:  # complex32, float8...: no numpy dtype
        raise UnencodableError(f"a {tensor.dtype} tensor has no Arrow type ({exc})") from None
