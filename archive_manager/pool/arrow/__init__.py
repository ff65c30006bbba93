"""Archives as Arrow record batches, and Arrow tables back into samples
(docs/architecture/getting-data-out.md, "Getting data out").

One row per sample: the keys and facts the catalog knows (`KEY_COLUMNS`), then one column per
sample field.  Numeric list fields become list columns of the narrowest exact type, built
from the arrays the records store (`StoredNumbers`: no Python object per number); lists of
strings become string list columns; a tensor or numpy array field becomes its values,
flattened, with a ``<field>.shape`` column beside; nested and mixed fields become JSON text
(`to_json_value`).  pyarrow is imported by the functions that need it, never at import.

The parts, one module each: `common` (columns, row, source), `reading` (chunks read and
decoded, or answered from the catalog), `columns` (records as columns), `json_values`,
`schemas` (one schema per stream), `imports` (tables back into samples), `sharing` (the
``sample_shared`` column), `tables` (whole tables, JSONL rows, column selection).
"""

from __future__ import annotations

from .columns import build_batch, column_name, field_name
from .common import (
    FIELD_PREFIX,
    KEY_COLUMNS,
    RESERVED,
    SHAPE_SUFFIX,
    TAIL_COLUMNS,
    ArchiveSource,
    Row,
    SchemaDrift,
    pyarrow_module,
)
from .imports import ImportedRow, imported_row, is_export, rows_to_samples
from .json_values import from_json_value, to_json_value
from .reading import (
    EVERYTHING,
    ChunkPlan,
    Needs,
    PiecesDiffer,
    archive_batches,
    catalog_values,
    chunk_plan,
    column_needs,
    decode_chunk_rows,
    fetch_chunk,
    iter_chunk_rows,
)
from .schemas import (
    conform,
    json_columns,
    merge_schemas,
    stream_schema,
    widened,
    with_json_column,
)
from .sharing import _same_data, share_places, shared_places
from .tables import (
    archive_table,
    check_columns,
    conformed_batches,
    empty_batch,
    json_rows,
    key_schema,
    select_columns,
    selected_names,
)

__all__ = [
    "EVERYTHING",
    "FIELD_PREFIX",
    "KEY_COLUMNS",
    "RESERVED",
    "SHAPE_SUFFIX",
    "TAIL_COLUMNS",
    "ArchiveSource",
    "ChunkPlan",
    "ImportedRow",
    "Needs",
    "PiecesDiffer",
    "Row",
    "SchemaDrift",
    "_same_data",
    "archive_batches",
    "archive_table",
    "build_batch",
    "catalog_values",
    "check_columns",
    "chunk_plan",
    "column_name",
    "column_needs",
    "conform",
    "conformed_batches",
    "decode_chunk_rows",
    "empty_batch",
    "fetch_chunk",
    "field_name",
    "from_json_value",
    "imported_row",
    "is_export",
    "iter_chunk_rows",
    "json_columns",
    "json_rows",
    "key_schema",
    "merge_schemas",
    "pyarrow_module",
    "rows_to_samples",
    "select_columns",
    "selected_names",
    "share_places",
    "shared_places",
    "stream_schema",
    "to_json_value",
    "widened",
    "with_json_column",
]
