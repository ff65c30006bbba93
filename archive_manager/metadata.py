"""Per-sample metadata: what `describe_sample` records and what a training run accepts.

Pure functions, no I/O.  `describe_sample` runs for every sample on every save and its
result is stored in a SQL JSON column, so it only reads lengths, shapes and dtypes: it
never walks list contents and never loads a lazy `TensorRef`.  `validate_sample_metadata`
checks those descriptions against a training run's settings (slime's argparse namespace)
without reading any payload.
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeGuard

from ._util.lazy_torch import is_tensor, tensor_class, torch_module
from ._util.reward_keys import check_reward_key, reward_component
from .codec import TakenList, TensorRef
from .errors import MetadataError, UnencodableError
from .samples import is_queue_key

if TYPE_CHECKING:
    import torch

__all__ = [
    "CATALOG_FIELDS",
    "MAX_REWARD_PARTS",
    "REPLAY_FIELDS",
    "as_described",
    "check_reward_key",
    "describe_sample",
    "inexact_fields",
    "metadata_problems",
    "rescored",
    "reward_component",
    "validate_sample_metadata",
]

#: Replay fields whose length is recorded under ``"lengths"`` when they hold a plain list
#: (a tensor is described under ``"tensors"`` instead), so validation can still see them.
REPLAY_FIELDS = frozenset(
    {
        "rollout_routed_experts",
        "rollout_top_p_token_ids",
        "rollout_top_p_token_offsets",
        "rollout_top_p_log_probs",
        "rollout_topk_token_ids",
        "rollout_topk_log_probs",
    }
)

#: The sample fields whose stored value a description may record exactly (its type and
#: value, as a load decodes the record): what an Arrow read of those columns answers from
#: the catalog (docs/architecture/getting-data-out.md, "Getting data out", "Columns from the
#: catalog").
CATALOG_FIELDS = ("reward", "status", "response_length", "index", "group_index")

# Types whose values are neither tensors nor containers of them, skipped by exact type.
# Starts with the plain types and learns others (enums, helper objects) as it meets them;
# bounded so that classes created on the fly cannot grow it without limit.
_OPAQUE_TYPES: set[type] = {type(None), bool, int, float, str, bytes}
_MAX_OPAQUE_TYPES = 256
_MAX_FLOAT_INT = int(sys.float_info.max)  # the largest int a float holds
_DTYPE_NAMES: dict[torch.dtype, str] = {}


def _tensor_types() -> tuple[type[Any], ...]:
    """`TensorRef`, and `torch.Tensor` once torch is imported (no value is one before)."""
    tensor = tensor_class()
    return (TensorRef,) if tensor is None else (tensor, TensorRef)


# --------------------------------------------------------------------------- describe


def describe_sample(sample: Any, *, reward_key: str | None = None) -> dict[str, Any]:
    """Describe a sample cheaply, as JSON-serializable data.

    ``sample`` is a `Sample`, another dataclass, or a dict (its keys are the fields);
    ``reward_key`` names the part of a dict reward that is the sample's reward (slime's
    ``--reward-key``; a reward that is a number is the reward whatever the key).
    Returns::

        {
          "index": int | None, "group_index": int | None,   # ints: None past 64 bits
          "status": str | None,              # the status's string value
          "tokens": int | None,              # len(tokens); None when absent
          "response_length": int | None,
          "loss_mask": int | None,           # lengths; None when absent
          "rollout_log_probs": int | None,
          "reward": int | float | None,      # a finite real number within a float's
                                             # range: an int, a float, a bool (0/1), a
                                             # numpy scalar or 0-d array, a 0-d tensor
                                             # (its value), a dict's ``reward_key`` part;
                                             # else None (NaN, inf, a dict without it)
          "tensors": {field: {"shape": [int, ...] | None, "dtype": str | None}},
          "lengths": {field: int},           # list-valued REPLAY_FIELDS
          # only for a reward that is not a number (a dict, a list, a longer tensor):
          "reward_type": str,                # "dict", else its type's name
          "rewards": {key: int | float},     # a dict's parts that are numbers (as "reward"
                                             # reads them), at most 64, keys as text
        }

    With ``"rewards"`` in the catalog, any part can be chosen as the reward later, without
    reading the sample (`ArchiveManager.stats`, ``query`` and ``groups`` with ``reward_key``).

    ``tensors`` covers every top-level field holding a `torch.Tensor` or `TensorRef`, a
    non-empty list/tuple of them (described as one tensor concatenated along dim 0;
    ``shape`` is None when the chunks cannot be concatenated), or a dict of them one level
    deep (key ``"<field>.<key>"``).  dtype is torch's name without ``torch.``.  Fields
    starting with ``_queue_`` are ignored: they are never stored.

    Raises:
        UnencodableError: not a sample, or a status no catalog can store (a lone surrogate).
    """
    fields = sample if type(sample) is dict else _fields_of(sample)
    tensors: dict[str, dict[str, Any]] = {}
    lengths: dict[str, int] = {}
    opaque = _OPAQUE_TYPES
    kinds = _tensor_types()
    # NOTE: this loop runs for ~40 fields of every sample saved (budget: well under 5 us
    # per sample), hence exact-type dispatch before any isinstance against an ABC.
    for key, value in fields.items():
        cls = type(value)
        if cls in opaque:
            continue
        if cls is list or cls is tuple:
            # Only the first item decides whether a list holds tensor chunks, so a
            # 3,000-token list costs one check, not 3,000.
            if value and isinstance(value[0], kinds):
                _add_tensor(tensors, key, value)
            elif key in REPLAY_FIELDS:
                lengths[key] = len(value)
        elif cls is TakenList:
            # a numeric list as `save_async` took it (codec.snapshot): described as the list
            if key in REPLAY_FIELDS:
                lengths[key] = len(value)
        elif cls is dict:
            if value:
                _add_mapping(tensors, key, value)
        elif isinstance(value, kinds):
            if not is_queue_key(key):
                tensors[key if type(key) is str else _key_text(key)] = _describe_tensor(value)
        elif isinstance(value, Mapping):
            _add_mapping(tensors, key, value)
        elif isinstance(value, (list, tuple)):
            if value and isinstance(value[0], kinds):
                _add_tensor(tensors, key, value)
            elif key in REPLAY_FIELDS:
                lengths[key] = len(value)
        elif len(opaque) < _MAX_OPAQUE_TYPES:
            opaque.add(cls)  # e.g. Sample.Status, SpecInfo: never hold a tensor
    get = fields.get
    tokens, loss_mask, log_probs = get("tokens"), get("loss_mask"), get("rollout_log_probs")
    reward = get("reward")
    described = {
        "index": _plain_int(get("index")),
        "group_index": _plain_int(get("group_index")),
        "status": _status(get("status")),
        "tokens": len(tokens) if type(tokens) is list else _length(tokens),
        "response_length": _plain_int(get("response_length")),
        "loss_mask": len(loss_mask) if type(loss_mask) is list else _length(loss_mask),
        "rollout_log_probs": len(log_probs) if type(log_probs) is list else _length(log_probs),
        "reward": _reward(reward),
        "tensors": tensors,
        "lengths": lengths,
    }
    if described["reward"] is None and reward is not None:
        _describe_other_reward(described, reward, reward_key)
    return described


#: Parts of a dict reward the catalog keeps (`describe_sample`'s ``"rewards"``).
MAX_REWARD_PARTS = 64


def _describe_other_reward(described: dict[str, Any], reward: Any, reward_key: str | None) -> None:
    """Add ``reward_type`` and, of a dict, its numeric parts and the chosen one."""
    if isinstance(reward, Mapping):
        parts: dict[str, int | float] = {}
        for key, value in reward.items():
            number = _reward(value)
            text = key if type(key) is str else _key_text(key)
            if number is not None and reward_component(text) is not None:
                parts[text] = number
                if len(parts) >= MAX_REWARD_PARTS:
                    break
        described["reward_type"] = "dict"
        described["rewards"] = parts
        if reward_key is not None:
            described["reward"] = parts.get(reward_key)
        return
    if type(reward) is float or _one_number(reward) is not None:
        return  # a number, NaN or infinite: not a reward of another kind
    described["reward_type"] = "list" if type(reward) is TakenList else type(reward).__name__


def rescored(description: dict[str, Any], reward_key: str | None) -> dict[str, Any]:
    """``description`` with its reward chosen by ``reward_key`` from the parts its dict reward
    recorded (``"rewards"``); itself when it has none (its reward was a number, or it was
    described before the parts were kept)."""
    parts = description.get("rewards")
    if not isinstance(parts, dict):
        return description
    chosen = parts.get(reward_key) if reward_key is not None else None
    return {**description, "reward": chosen if type(chosen) in (int, float) else None}


def as_described(description: Mapping[str, Any]) -> dict[str, Any]:
    """A stored description as `describe_sample` gives it: the writer's note for the Arrow
    reads (``"inexact"``, see `inexact_fields`) left out."""
    return {k: v for k, v in description.items() if k != "inexact"}


def inexact_fields(description: Mapping[str, Any], stored: Mapping[str, Any]) -> list[str]:
    """The `CATALOG_FIELDS` whose value in ``description`` is not the value the record
    stores (``stored``: the sample's stored top-level values of those fields, as
    `codec.encode_sample(keep=...)` hands them back): a field the sample lacks, or whose
    description is a conversion of it (a bool reward recorded as 0/1, a NaN as None, a
    numpy scalar as a number, an enum status as its value where the record keeps the
    member, a dict reward's scalar).  Exact: None, an exact ``int``, ``float`` (to the bit:
    -0.0 is not 0.0) or ``str`` recorded as itself.  The writer keeps this list in the
    description as ``"inexact"``; a description without it (an older save's) is exact
    nowhere."""
    out = []
    for name in CATALOG_FIELDS:
        if name not in stored or not _same_plain(description.get(name), stored[name]):
            out.append(name)
    return out


def _same_plain(recorded: Any, value: Any) -> bool:
    if value is None:
        return recorded is None
    kind = type(value)
    if kind not in (int, float, str) or type(recorded) is not kind or recorded != value:
        return False
    return kind is not float or math.copysign(1.0, recorded) == math.copysign(1.0, value)


def _fields_of(sample: Any) -> Mapping[Any, Any]:
    if isinstance(sample, Mapping):
        return sample
    attrs: Mapping[Any, Any] | None = getattr(sample, "__dict__", None)
    if attrs is not None:
        return attrs
    # slots dataclass: no __dict__, the declared fields are all there is
    names = getattr(sample, "__dataclass_fields__", None)
    if names is None:
        raise UnencodableError(
            f"cannot describe a sample of type {type(sample).__qualname__}: "
            "expected a Sample, a dataclass or a dict"
        )
    return {name: getattr(sample, name) for name in names}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def _add_tensor(tensors: dict[str, dict[str, Any]], key: Any, value: Any) -> None:
    if is_queue_key(key):
        return
    entry = _describe_tensor_value(value)
    if entry is not None:
        tensors[key if isinstance(key, str) else _key_text(key)] = entry


def _add_mapping(tensors: dict[str, dict[str, Any]], key: Any, value: Mapping[Any, Any]) -> None:
    """Describe the tensors a dict field holds one level deep, as ``"<field>.<key>"``."""
    if is_queue_key(key):
        return
    opaque = _OPAQUE_TYPES
    for sub_key, sub_value in value.items():
        if type(sub_value) not in opaque:
            _add_tensor(tensors, f"{_key_text(key)}.{_key_text(sub_key)}", sub_value)


def _key_text(key: Any) -> str:
    if type(key) is str:
        return key
    try:
        return str(key)
    except ValueError:  # an int of over 4,300 digits, alone or in a tuple, has no str
        return f"<{type(key).__name__} too large to print>"


def _describe_tensor(value: torch.Tensor | TensorRef) -> dict[str, Any]:
    dtype = value.dtype
    name = _DTYPE_NAMES.get(dtype) or _dtype_name(dtype)
    if is_tensor(value) and value.is_nested:
        return {"shape": None, "dtype": name}  # its .shape raises: the rows differ in size
    return {"shape": list(value.shape), "dtype": name}


def _describe_tensor_value(value: Any) -> dict[str, Any] | None:
    """Shape and dtype of a tensor, a `TensorRef` or a list of them, else None."""
    kinds = _tensor_types()
    if isinstance(value, kinds):
        return _describe_tensor(value)
    if not isinstance(value, (list, tuple)) or not value:
        return None
    if not isinstance(value[0], kinds):
        return None
    if not all(isinstance(chunk, kinds) for chunk in value):
        return None  # a mixed list is not a tensor; the codec stores it item by item
    dtype: torch.dtype = value[0].dtype
    name: str | None = None
    torch = torch_module()  # imported already: the list holds tensors (or refs to them)
    try:
        for chunk in value[1:]:
            dtype = torch.promote_types(dtype, chunk.dtype)  # what torch.cat would produce
        name = _dtype_name(dtype)
    except RuntimeError:
        # NOTE: torch promotes neither float8 nor uint16/32/64 with other dtypes, so torch.cat
        # would fail too; the codec still stores the chunks one by one.
        pass
    # NOTE: isinstance first: a TensorRef would load its blob to answer is_nested
    if any(is_tensor(chunk) and chunk.is_nested for chunk in value):
        return {"shape": None, "dtype": name}
    first = value[0].shape
    rows = 0
    for chunk in value:
        shape = chunk.shape
        if len(shape) == 0 or shape[1:] != first[1:]:
            return {"shape": None, "dtype": name}
        rows += shape[0]
    return {"shape": [rows, *first[1:]] if name is not None else None, "dtype": name}


def _plain_int(value: Any) -> int | None:
    # NOTE: past 64 bits an int is no index or length anyone can use, and past 4,300 digits
    # it cannot even be written as JSON (ValueError in the middle of a save): None.
    if value is None:
        return None
    if type(value) is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool)):
        value = int(value)
        return value if -(2**63) <= value < 2**63 else None
    return None


def _length(value: Any) -> int | None:
    if value is None:
        return None
    if type(value) is list:
        return len(value)
    if isinstance(value, _tensor_types()):
        shape = value.shape
        return int(shape[0]) if len(shape) else 1
    try:
        return len(value)
    except TypeError:
        return None


def _status(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, Enum):
        value = value.value
    status = value if isinstance(value, str) else _key_text(value)
    try:
        status.encode("utf-8")
    except UnicodeEncodeError:
        # NOTE: the catalog indexes the status as text, which no driver can encode with a
        # lone surrogate in it: the save failed with the driver's UnicodeEncodeError.
        raise UnencodableError(
            f"sample status {status!r:.80} is not valid unicode text (a lone surrogate)"
        ) from None
    return status


def _reward(value: Any) -> int | float | None:
    # NaN/inf are not valid JSON for a strict SQL JSON column (PostgreSQL rejects them), so
    # they are recorded as None.
    if type(value) is float:
        return value if math.isfinite(value) else None
    if not isinstance(value, numbers.Real):
        value = _one_number(value)
        if value is None:
            return None
    if isinstance(value, bool):
        return int(value)  # a pass/fail reward: 0 or 1, as GRPO averages it
    if isinstance(value, numbers.Integral):
        # An int past a float's range would fail the save (an OverflowError binding the
        # index column, or a ValueError writing 4,300+ digits as JSON): not a usable reward.
        return int(value) if abs(int(value)) <= _MAX_FLOAT_INT else None
    number = float(value)
    return number if math.isfinite(number) else None


def _one_number(value: Any) -> numbers.Real | None:
    """The Python number a 0-d torch tensor, a numpy bool or a 0-d numpy array holds, else
    None: rewards as frameworks return them (`torch.tensor(1.0)`, ``np.bool_``).

    NOTE: numpy's other scalars are `numbers.Real` already.  A lazy `TensorRef` is never
    loaded (None), nor is any tensor with more than one element read.  Neither module is
    imported here: a value cannot be one of their objects unless it was imported.
    """
    if is_tensor(value):
        if value.ndim != 0 or value.is_nested or value.is_complex() or value.is_meta:
            return None
        number = value.item()
    else:
        numpy = sys.modules.get("numpy")
        if numpy is None or not isinstance(value, (numpy.generic, numpy.ndarray)):
            return None
        if value.ndim != 0 or value.dtype.kind not in "biuf":
            return None
        number = value.item()
    return number if isinstance(number, numbers.Real) else None


# --------------------------------------------------------------------------- validate


@dataclass(frozen=True)
class _Settings:
    """The parts of a training run's arguments that constrain stored samples."""

    routing_replay: bool
    num_layers: int | None
    moe_router_topk: int | None
    top_p_replay: bool
    topk: int | None

    @classmethod
    def from_args(cls, args: Any) -> _Settings:
        top_p = getattr(args, "rollout_top_p", None)
        # slime asks the engine for top-p replay data whenever top-p is not 1.0.
        top_p_replay = _is_number(top_p) and 0 < top_p < 1
        # NOTE: slime's ``rollout_top_k`` is the *sampling* top-k (-1 = off), not top-k
        # log-prob replay, so it is deliberately not read here.  ``rollout_topk`` names the
        # replay width; the score-centering fork of slime records top-k only when top-p
        # replay is off, with ``score_centering_top_k``.
        topk = getattr(args, "rollout_topk", None)
        if not _is_positive_int(topk):
            topk = None
            if getattr(args, "use_score_centering", False) and not top_p_replay:
                centering = getattr(args, "score_centering_top_k", None)
                topk = centering if _is_positive_int(centering) else None
        return cls(
            routing_replay=bool(getattr(args, "use_rollout_routing_replay", False)),
            num_layers=_positive_or_none(getattr(args, "num_layers", None)),
            moe_router_topk=_positive_or_none(getattr(args, "moe_router_topk", None)),
            top_p_replay=top_p_replay,
            topk=topk,
        )


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_positive_int(value: Any) -> TypeGuard[int]:
    # NOTE: any Integral (numpy's too) counts; int() below makes it a plain int.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) > 0


def _positive_or_none(value: Any) -> int | None:
    return int(value) if _is_positive_int(value) else None


def validate_sample_metadata(
    metadata: Mapping[str, Any] | Iterable[Mapping[str, Any]], args: Any
) -> None:
    """Raise `MetadataError` unless every description fits the run's settings.

    ``metadata`` is one `describe_sample` result or a list of them (position = list
    index); ``args`` is read like slime's argparse namespace (missing attributes mean the
    feature is off).  All violations are collected and reported together, one line each:
    ``position N: field: what is wrong (expected X, got Y)``; the error's ``problems``
    attribute holds the lines.  See `metadata_problems` for the rules.
    """
    problems = metadata_problems(metadata, args)
    if problems:
        error = MetadataError(
            f"{len(problems)} sample metadata problem(s) for this training run:\n  "
            + "\n  ".join(problems)
        )
        error.problems = problems  # type: ignore[attr-defined]
        raise error


def metadata_problems(
    metadata: Mapping[str, Any] | Iterable[Mapping[str, Any]], args: Any
) -> list[str]:
    """Every rule violation as ``position N: field: what (expected X, got Y)``; [] if none.

    Rules (slime's):

    * ``0 <= response_length <= tokens``;
    * ``loss_mask`` and ``rollout_log_probs`` lengths equal ``response_length`` when present;
    * ``use_rollout_routing_replay``: ``rollout_routed_experts`` present, shape
      ``[tokens-1, num_layers, moe_router_topk]``, integer dtype;
    * top-p replay data, required when ``0 < rollout_top_p < 1``, checked whenever present:
      ids and offsets both present; ``rollout_top_p_token_offsets`` shape
      ``[response_length+1]`` and ``rollout_top_p_token_ids`` 1-D, both integer;
      ``rollout_top_p_log_probs`` (optional: upstream slime has none) float, as long as
      the ids;
    * top-k replay, required when ``rollout_topk`` (or the score-centering fork's
      ``score_centering_top_k``) is set, checked whenever present:
      ``rollout_topk_token_ids`` integer and ``rollout_topk_log_probs`` float, both of
      shape ``[response_length, k]``.

    A field stored as a plain list (see ``"lengths"``) has a known length only, so only
    its first dimension is checked.  ``offsets[-1] == len(ids)`` needs the payload and is
    not checked here.
    """
    settings = _Settings.from_args(args)
    items = [metadata] if isinstance(metadata, Mapping) else list(metadata)
    problems: list[str] = []
    for position, description in enumerate(items):
        if not isinstance(description, Mapping):
            problems.append(
                f"position {position}: metadata: not a mapping "
                f"(expected a describe_sample() dict, got {type(description).__name__})"
            )
            continue
        _Checker(position, description, problems).check(settings)
    return problems


def _fmt_shape(shape: Sequence[int | None] | None) -> str:
    if shape is None:
        return "None"
    return "[" + ", ".join("*" if dim is None else str(dim) for dim in shape) + "]"


def _is_integer_dtype(name: str) -> bool:
    return name.startswith(("int", "uint"))


def _is_float_dtype(name: str) -> bool:
    return name.startswith(("float", "bfloat"))


@dataclass
class _Stored:
    """What a description says about one field: shape (or only its length) and dtype."""

    shape: list[int] | None
    dtype: str | None
    length_only: bool = False  # a plain list: only its first dimension is known


class _Checker:
    """Checks one description, appending violations to a shared list."""

    def __init__(self, position: int, description: Mapping[str, Any], out: list[str]) -> None:
        self.position = position
        self.d = description
        self.out = out
        tensors = description.get("tensors")
        self.tensors: Mapping[str, Any] = tensors if isinstance(tensors, Mapping) else {}
        lengths = description.get("lengths")
        self.lengths: Mapping[str, Any] = lengths if isinstance(lengths, Mapping) else {}

    def problem(self, field: str, what: str, expected: object, got: object) -> None:
        self.out.append(
            f"position {self.position}: {field}: {what} (expected {expected}, got {got})"
        )

    def stored(self, field: str) -> _Stored | None:
        entry = self.tensors.get(field)
        if isinstance(entry, Mapping):
            return _Stored(entry.get("shape"), entry.get("dtype"))
        length = self.lengths.get(field)
        if isinstance(length, int):
            return _Stored([length], None, length_only=True)
        return None

    def check(self, s: _Settings) -> None:
        tokens = _plain_int(self.d.get("tokens"))
        response_length = self.check_lengths(tokens)
        if s.routing_replay:
            self.check_routed_experts(tokens, s)
        self.check_top_p(response_length, s.top_p_replay)
        self.check_topk(response_length, s.topk)

    def check_lengths(self, tokens: int | None) -> int | None:
        """Check response_length against tokens; return it when it is usable."""
        raw = self.d.get("response_length")
        response_length = _plain_int(raw)
        if response_length is None:
            self.problem("response_length", "missing or not an integer", "an int >= 0", raw)
            return None
        if response_length < 0:
            self.problem("response_length", "negative", ">= 0", response_length)
            return None
        if tokens is not None and response_length > tokens:
            self.problem("response_length", "longer than tokens", f"<= {tokens}", response_length)
        for field in ("loss_mask", "rollout_log_probs"):
            length = self.d.get(field)
            if length is not None and length != response_length:
                self.problem(field, "length differs from response_length", response_length, length)
        return response_length

    def check_shape(
        self, field: str, stored: _Stored, expected: list[int | None], dtype_kind: str
    ) -> None:
        """Compare a stored field with an expected shape (None = any) and dtype kind."""
        shape = stored.shape
        if shape is None:
            self.problem(
                field,
                "tensor chunks do not concatenate along dim 0",
                f"shape {_fmt_shape(expected)}",
                "chunks of different shapes",
            )
        elif stored.length_only:
            if expected[0] is not None and shape[0] != expected[0]:
                self.problem(field, "wrong length", expected[0], shape[0])
        elif len(shape) != len(expected) or any(
            want is not None and want != got for want, got in zip(expected, shape, strict=False)
        ):
            self.problem(field, "wrong shape", _fmt_shape(expected), _fmt_shape(shape))
        dtype = stored.dtype
        if dtype is None:
            return
        if dtype_kind == "integer" and not _is_integer_dtype(dtype):
            self.problem(field, "not an integer dtype", "an integer dtype", dtype)
        elif dtype_kind == "float" and not _is_float_dtype(dtype):
            self.problem(field, "not a floating-point dtype", "a float dtype", dtype)

    def check_routed_experts(self, tokens: int | None, s: _Settings) -> None:
        field = "rollout_routed_experts"
        rows = None if tokens is None else max(tokens - 1, 0)
        expected = [rows, s.num_layers, s.moe_router_topk]
        stored = self.stored(field)
        if stored is None:
            self.problem(
                field,
                "missing with use_rollout_routing_replay",
                f"shape {_fmt_shape(expected)}",
                "absent",
            )
            return
        self.check_shape(field, stored, expected, "integer")

    def check_top_p(self, response_length: int | None, required: bool) -> None:
        ids_field, offsets_field = "rollout_top_p_token_ids", "rollout_top_p_token_offsets"
        logps_field = "rollout_top_p_log_probs"
        ids, offsets = self.stored(ids_field), self.stored(offsets_field)
        if required or ids is not None or offsets is not None:
            why = "missing with rollout_top_p < 1" if required else "missing beside the other"
            if ids is None:
                self.problem(ids_field, why, "top-p token ids", "absent")
            if offsets is None:
                self.problem(
                    offsets_field,
                    why,
                    f"shape {_fmt_shape([_plus_one(response_length)])}",
                    "absent",
                )
        if offsets is not None:
            self.check_shape(offsets_field, offsets, [_plus_one(response_length)], "integer")
        if ids is not None:
            self.check_shape(ids_field, ids, [None], "integer")
        logps = self.stored(logps_field)
        if logps is not None:
            id_count = ids.shape[0] if ids is not None and ids.shape else None
            self.check_shape(logps_field, logps, [id_count], "float")

    def check_topk(self, response_length: int | None, k: int | None) -> None:
        ids_field, logps_field = "rollout_topk_token_ids", "rollout_topk_log_probs"
        shapes: dict[str, list[int]] = {}
        for field, kind in ((ids_field, "integer"), (logps_field, "float")):
            stored = self.stored(field)
            if stored is None:
                if k is not None:
                    self.problem(
                        field,
                        "missing with top-k replay",
                        f"shape {_fmt_shape([response_length, k])}",
                        "absent",
                    )
                continue
            self.check_shape(field, stored, [response_length, k], kind)
            if stored.shape is not None and not stored.length_only:
                shapes[field] = stored.shape
        if k is None and len(shapes) == 2 and shapes[ids_field] != shapes[logps_field]:
            self.problem(
                logps_field,
                f"shape differs from {ids_field}",
                _fmt_shape(shapes[ids_field]),
                _fmt_shape(shapes[logps_field]),
            )


def _plus_one(value: int | None) -> int | None:
    return None if value is None else value + 1
