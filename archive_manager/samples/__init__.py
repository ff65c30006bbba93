"""Samples: the `Sample` class, how sample objects become stored records and back, and keys.

`sample` holds `Sample` (slime's sample as the library's own class), `records` the registry
of storable classes and the adapters between objects and stored fields (what a load may
construct: docs/architecture/safety-rules.md), `keys` the sample and task keys the catalog
stores.  The names below are this package's interface.
"""

from __future__ import annotations

from .keys import (
    check_key_text,
    check_task_key,
    long_task_key,
    sample_key,
    task_key_and_text,
    task_key_of,
)
from .records import (
    FRAMEWORK_SAMPLE_CLASSES,
    enum_to_record,
    fields_to_sample,
    is_queue_key,
    record_to_enum,
    record_to_value,
    register_sample_class,
    registered_class,
    registered_name,
    sample_to_fields,
    sample_to_record,
    value_to_record,
)
from .sample import QUEUE_PREFIX, SAMPLE_CLASS_NAME, Sample

__all__ = [
    "FRAMEWORK_SAMPLE_CLASSES",
    "QUEUE_PREFIX",
    "SAMPLE_CLASS_NAME",
    "Sample",
    "check_key_text",
    "check_task_key",
    "enum_to_record",
    "fields_to_sample",
    "is_queue_key",
    "long_task_key",
    "record_to_enum",
    "record_to_value",
    "register_sample_class",
    "registered_class",
    "registered_name",
    "sample_key",
    "sample_to_fields",
    "sample_to_record",
    "task_key_and_text",
    "task_key_of",
    "value_to_record",
]
