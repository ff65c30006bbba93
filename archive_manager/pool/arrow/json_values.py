"""Values as plain JSON, tagged where JSON would lose them, and back (the JSON columns and JSONL).

(docs/architecture/getting-data-out.md, "Getting data out".)
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._util.lazy_torch import is_tensor, torch_module
from ...codec import StoredNumbers, TensorRef
from ...codec import values as codec_values
from ...codec.tensors import torch_dtypes
from ...errors import UnencodableError, UnsupportedFormatError
from ...samples import enum_to_record, record_to_enum, record_to_value, value_to_record
from .common import _FLOAT_BITS, _JSON_INT_LIMIT, _TAG, _tensor_numpy, _torch_dtype_name

if TYPE_CHECKING:
    pass


def to_json_value(value: Any) -> Any:
    """``value`` as plain JSON, tagged (``{"$t": ...}``) where JSON would lose it: tuples,
    mappings with keys other than text, non-finite floats, ints of more than 4,300 digits
    (Python's default limit on decimal ints), tensors and numpy values.

    One tensor or array held in several places (it loads as one object) is written out at
    each place, so the bytes written again count against the save's own expansion bound
    (docs/architecture/samples-and-values.md, "Samples and values"): what the save bounded stays
    bounded here.

    Raises:
        UnencodableError: a value JSON cannot hold even tagged (a complex number), or one
            whose repeated tensors would write more than the bound again.
    """
    return _to_json(value, _Repeats())


class _Repeats:
    """The tensors and arrays one `to_json_value` call wrote, and the bytes written again."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.extra = 0

    def add(self, value: Any, nbytes: int) -> None:
        if id(value) not in self.seen:
            self.seen.add(id(value))
            return
        self.extra += nbytes
        limit = codec_values._MAX_EXTRA_BYTES
        if self.extra > limit:
            raise UnencodableError(
                f"a tensor held in many places would be written out again past {limit:,} "
                "bytes: a table export writes it at each place (export_pt keeps it once)"
            )


def _to_json(value: Any, repeats: _Repeats) -> Any:
    t = type(value)
    if t is int:
        if -_JSON_INT_LIMIT < value < _JSON_INT_LIMIT:
            return value
        return {_TAG: "int", "v": hex(value)}
    if value is None or t is bool or t is str:
        return value
    if t is float:
        if math.isfinite(value):
            return value
        return {_TAG: "float", "v": _FLOAT_BITS.pack(value).hex()}
    if t is list:
        return [_to_json(v, repeats) for v in value]
    if t is StoredNumbers:
        # nan and +-inf (a -inf log-prob is ordinary) need their tag; finite lists stay fast
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            return [_to_json(v, repeats) for v in value.tolist()]
        return value.tolist()
    if t is dict:
        if _TAG not in value and all(type(k) is str for k in value):
            return {k: _to_json(v, repeats) for k, v in value.items()}
        return {
            _TAG: "map",
            "v": [[_to_json(k, repeats), _to_json(v, repeats)] for k, v in value.items()],
        }
    if t is tuple:
        return {_TAG: "tuple", "v": [_to_json(v, repeats) for v in value]}
    if isinstance(value, TensorRef) or is_tensor(value):
        array = _tensor_numpy(value)
        repeats.add(value, array.nbytes)
        return {
            _TAG: "tensor",
            "d": _torch_dtype_name(value),
            "sh": list(array.shape),
            "v": _to_json(array.reshape(-1).tolist(), repeats),
        }
    if isinstance(value, np.ndarray) and value.dtype.kind in "biufU":
        repeats.add(value, value.nbytes)
        flat = _to_json(value.reshape(-1).tolist(), repeats)
        return {_TAG: "ndarray", "d": value.dtype.str, "sh": list(value.shape), "v": flat}
    if isinstance(value, np.ndarray) and value.dtype.kind == "S":
        repeats.add(value, value.nbytes)
        flat = [base64.b64encode(v).decode("ascii") for v in value.reshape(-1).tolist()]
        return {_TAG: "ndarray", "d": value.dtype.str, "sh": list(value.shape), "v": flat}
    if isinstance(value, np.ndarray) and value.dtype == object:
        items = [_to_json(v, repeats) for v in value.reshape(-1).tolist()]
        return {_TAG: "ndobj", "sh": list(value.shape), "v": items}
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return {_TAG: "npscalar", "d": value.dtype.str, "v": _to_json(value.item(), repeats)}
    if t is np.str_:
        return {_TAG: "npstr", "v": str(value)}
    if t is np.bytes_:
        return {_TAG: "npbytes", "v": base64.b64encode(bytes(value)).decode("ascii")}
    if t is bytes or t is bytearray:
        return {_TAG: t.__name__, "v": base64.b64encode(value).decode("ascii")}
    if t.__module__.startswith("PIL.") and codec_values._pil_image_class(value) is not None:
        return _image_json(value, repeats)
    if isinstance(value, enum.Enum):
        name, raw = enum_to_record(value)
        return {_TAG: "enum", "c": name, "v": _to_json(raw, repeats)}
    if dataclasses.is_dataclass(t):
        name, fields = value_to_record(value)
        return {_TAG: "obj", "c": name, "f": _to_json(fields, repeats)}
    raise UnencodableError(f"a {t.__name__} has no JSON form")


def _image_json(image: Any, repeats: _Repeats) -> dict[str, Any]:
    """A PIL image as the pool stores it (`codec.values`): mode, size, palette, info, pixels."""
    node: dict[str, Any] = {
        _TAG: "image",
        "m": image.mode,
        "sz": list(image.size),
        "v": base64.b64encode(image.tobytes()).decode("ascii"),
    }
    if image.mode in ("P", "PA") and image.getpalette() is not None:
        node["p"] = image.getpalette()
    if image.info:
        node["i"] = _to_json(dict(image.info), repeats)
    return node


def from_json_value(value: Any) -> Any:
    """Inverse of `to_json_value`."""
    t = type(value)
    if t is list:
        return [from_json_value(v) for v in value]
    if t is not dict:
        return value
    tag = value.get(_TAG)
    if tag is None:
        return {k: from_json_value(v) for k, v in value.items()}
    try:
        if tag == "float":
            return _FLOAT_BITS.unpack(bytes.fromhex(value["v"]))[0]
        if tag == "int":
            if type(value["v"]) is not str:
                raise TypeError("its value is not text")
            return int(value["v"], 16)  # linear in its length, unlike decimal
        if tag == "map":
            return {_hashable(from_json_value(k)): from_json_value(v) for k, v in value["v"]}
        if tag == "tuple":
            return tuple(from_json_value(v) for v in value["v"])
        if tag == "tensor":
            dtype = torch_dtypes()[value["d"]]
            flat = torch_module().tensor(from_json_value(value["v"]), dtype=dtype)
            return flat.reshape(value["sh"])
        if tag == "ndarray":
            dtype = np.dtype(value["d"])
            if dtype.kind not in "biufcUS":
                raise TypeError(f"dtype {dtype} is no array the pool stores as values")
            if dtype.kind == "S":
                flat = [base64.b64decode(v, validate=True) for v in value["v"]]
            else:
                flat = from_json_value(value["v"])
            return np.array(flat, dtype=dtype).reshape(value["sh"])
        if tag == "ndobj":
            items = [from_json_value(v) for v in value["v"]]
            out = np.empty(len(items), dtype=object)
            for i, item in enumerate(items):
                out[i] = item  # item by item: nested lists stay items, not dimensions
            return out.reshape(value["sh"])
        if tag == "npstr":
            if type(value["v"]) is not str:
                raise TypeError("its value is not text")
            return np.str_(value["v"])
        if tag == "npbytes":
            return np.bytes_(base64.b64decode(value["v"], validate=True))
        if tag == "npscalar":
            return np.dtype(value["d"]).type(from_json_value(value["v"]))
        if tag in ("bytes", "bytearray"):
            data = base64.b64decode(value["v"], validate=True)
            return data if tag == "bytes" else bytearray(data)
        if tag == "image":
            pixels = memoryview(base64.b64decode(value["v"], validate=True))
            node = {k: v for k, v in value.items() if k not in ("v", "i")}
            image = codec_values._decode_image(node, pixels, from_json_value)
            if "i" in value:
                image.info.update(from_json_value(value["i"]))
            return image
        if tag == "enum" and type(value["c"]) is str:
            return record_to_enum(value["c"], from_json_value(value["v"]))
        if tag == "obj" and type(value["c"]) is str and type(value["f"]) is dict:
            return record_to_value(value["c"], from_json_value(value["f"]))
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise UnsupportedFormatError(f"a malformed {tag!r:.20} value: {exc}") from None
    raise UnsupportedFormatError(f"an unknown tagged value {tag!r:.40}")


def _hashable(key: Any) -> Any:
    if type(key) is list:  # a JSON array stands for nothing hashable we wrote
        raise UnsupportedFormatError("a mapping key is a list")
    return key
