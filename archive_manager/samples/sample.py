"""The `Sample` dataclass: slime's sample, as the library's own class.

`Sample` mirrors slime's ``slime.utils.types.Sample`` (same field names, defaults, nested
``Status`` enum and ``SpecInfo``/``PrefixCacheInfo`` helpers, same ``to_dict``/``from_dict``
behaviour) so that rollouts saved from slime load back as the objects slime expects.

Which classes a load rebuilds, and how a sample becomes stored fields, is `records`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

#: Attributes and keys with this prefix are a rollout queue's live control state: never stored.
QUEUE_PREFIX = "_queue_"

#: The registry name of `Sample`.
SAMPLE_CLASS_NAME = "archive_manager.Sample"

#: The fields of `Sample` that a record stores converted (a `Sample.Status` as its value, a
#: helper as its fields and extra attributes), in a subclass too unless it declares them anew.
_SAMPLE_OWNED = ("status", "spec_info", "prefix_cache_info")

_T = TypeVar("_T")


@dataclass
class Sample:
    """One generated rollout sample, field for field like slime's ``Sample``.

    Every field has a default.  The class has no ``__slots__``, so attributes that other
    frameworks add at run time live in ``__dict__`` and survive `to_dict`/`from_dict`.
    Beyond upstream slime it carries the top-k and top-p log-prob replay fields that
    forks of slime use (``rollout_topk_*``, ``rollout_top_p_log_probs``), all ``None`` by
    default.
    """

    group_index: int | None = None
    index: int | None = None
    # slime falls back to ``index`` when this is None; sibling samples split from one
    # rollout execution share it.
    rollout_id: int | None = None
    # prompt
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # response
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    # top-k replay: ``[response_length, k]`` ids (integer) and log-probs (float)
    rollout_topk_token_ids: Any = None
    rollout_topk_log_probs: Any = None
    # ragged top-p replay: the ids kept for response token i are
    # ``rollout_top_p_token_ids[offsets[i]:offsets[i + 1]]``
    rollout_top_p_token_ids: Any = None
    rollout_top_p_token_offsets: Any = None
    rollout_top_p_log_probs: Any = None
    # routing replay: ``[len(tokens) - 1, num_layers, topk]`` integers, or a list of chunks
    rollout_routed_experts: Any = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None
    mopd_teacher_log_probs: dict[str, list[float]] | None = None

    class Status(enum.Enum):
        """How generation of the sample ended."""

        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        # Recoverable failure (tool call, external API, parsing); partial output may be valid.
        FAILED = "failed"

    status: Status = Status.PENDING

    metadata: dict[str, Any] = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    # used during training, e.g. which loss applies to this sample
    train_metadata: dict[str, Any] | None = None
    # consistent-hashing router key
    session_id: str | None = None
    # seconds spent outside generation
    non_generation_time: float = 0.0

    @dataclass
    class SpecInfo:
        """Speculative-decoding counters accumulated over a sample's generation."""

        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

        @property
        def spec_accept_rate(self) -> float:
            """Accepted over drafted tokens (0.0 when nothing was drafted)."""
            if self.spec_draft_token_num <= 0:
                return 0.0
            return self.spec_accept_token_num / self.spec_draft_token_num

        @property
        def spec_accept_length(self) -> float:
            """Completion tokens per verification step (0.0 before any step)."""
            if self.spec_verify_ct <= 0:
                return 0.0
            return self.completion_token_num / self.spec_verify_ct

        def add(self, meta_info: Mapping[str, Any]) -> None:
            """Accumulate the counters of one engine response's ``meta_info``."""
            self.spec_accept_token_num += meta_info.get("spec_accept_token_num", 0)
            self.spec_draft_token_num += meta_info.get("spec_draft_token_num", 0)
            self.spec_verify_ct += meta_info.get("spec_verify_ct", 0)
            # the engine reports it as "completion_tokens"
            self.completion_token_num += meta_info.get("completion_tokens", 0)

        def to_dict(self) -> dict[str, int]:
            """The counters as a plain dict."""
            return dict(self.__dict__)

        @classmethod
        def from_dict(cls, data: Mapping[str, Any]) -> Sample.SpecInfo:
            """Rebuild from `to_dict` output; missing counters are 0, unknown keys ignored."""
            return cls(**{f.name: data.get(f.name, 0) for f in dataclasses.fields(cls)})

    spec_info: SpecInfo = field(default_factory=SpecInfo)

    @dataclass
    class PrefixCacheInfo:
        """Prefix-cache counters accumulated over a sample's generation."""

        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        @property
        def prefix_cache_hit_rate(self) -> float:
            """Cached over prompt tokens (0.0 when there was no prompt)."""
            if self.total_prompt_tokens <= 0:
                return 0.0
            return self.cached_tokens / self.total_prompt_tokens

        def add(self, meta_info: Mapping[str, Any]) -> None:
            """Accumulate the counters of one engine response's ``meta_info``."""
            self.cached_tokens += meta_info.get("cached_tokens", 0)
            self.total_prompt_tokens += meta_info.get("prompt_tokens", 0)

        def to_dict(self) -> dict[str, int]:
            """The counters as a plain dict."""
            return dict(self.__dict__)

        @classmethod
        def from_dict(cls, data: Mapping[str, Any]) -> Sample.PrefixCacheInfo:
            """Rebuild from `to_dict` output; missing counters are 0, unknown keys ignored."""
            return cls(**{f.name: data.get(f.name, 0) for f in dataclasses.fields(cls)})

    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    def to_dict(self) -> dict[str, Any]:
        """Every field and extra attribute; status as its string, helpers as dicts.

        Values are not copied (like slime): tensors and lists are shared with the sample.
        """
        value = self.__dict__.copy()
        if isinstance(self.status, enum.Enum):
            value["status"] = self.status.value
        if isinstance(self.spec_info, Sample.SpecInfo):
            value["spec_info"] = self.spec_info.to_dict()
        if isinstance(self.prefix_cache_info, Sample.PrefixCacheInfo):
            value["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return value

    @classmethod
    def from_dict(cls: type[_T], data: Mapping[str, Any]) -> _T:
        """Inverse of `to_dict`: status string to enum, unknown keys set as attributes.

        A missing or None status means pending.  Called on a subclass, it builds the
        subclass.

        Raises:
            ValueError: the status string is not one of `Sample.Status`.
        """
        data = _sample_values(dict(data), _sample_owned(cls))  # type: ignore[arg-type]  # a class is hashable
        init_names = _init_names(cls)  # type: ignore[arg-type]  # a class is hashable
        sample = cls(**{k: v for k, v in data.items() if k in init_names})
        for key, value in data.items():
            if key not in init_names:
                setattr(sample, key, value)
        return sample

    def get_reward_value(self, args: Any) -> Any:
        """The scalar reward: ``reward``, or ``reward[args.reward_key]`` when a key is set."""
        reward_key = getattr(args, "reward_key", None)
        if not reward_key:
            return self.reward
        return self.reward[reward_key]  # type: ignore[index]

    @property
    def effective_response_length(self) -> int:
        """Response tokens that count for the loss (all of them without a loss mask)."""
        if self.loss_mask is None:
            return self.response_length
        return int(sum(self.loss_mask))


def _sample_values(
    data: dict[str, Any], owned: frozenset[str] = frozenset(_SAMPLE_OWNED)
) -> dict[str, Any]:
    """`Sample.to_dict` output (a dict the caller owns) with status and helpers as objects.

    Only the ``owned`` fields (those a subclass keeps as `Sample` declares them) are
    converted: a subclass that declares ``status: str`` keeps its string.
    """
    if "status" in owned:
        status = data.get("status")
        data["status"] = Sample.Status.PENDING if status is None else Sample.Status(status)
    if "spec_info" in owned:
        spec_info = data.get("spec_info")
        if spec_info is None or isinstance(spec_info, Mapping):
            data["spec_info"] = Sample.SpecInfo.from_dict(spec_info or {})
    if "prefix_cache_info" in owned:
        prefix = data.get("prefix_cache_info")
        if prefix is None or isinstance(prefix, Mapping):
            data["prefix_cache_info"] = Sample.PrefixCacheInfo.from_dict(prefix or {})
    return data


@functools.cache
def _init_names(cls: type) -> frozenset[str]:
    # Cached: dataclasses.fields() walks the class on every call and from_dict runs per sample.
    return frozenset(f.name for f in dataclasses.fields(cls) if f.init)


@functools.cache
def _sample_owned(cls: type) -> frozenset[str]:
    """The `_SAMPLE_OWNED` fields the `Sample` subclass ``cls`` keeps as `Sample` declares them.

    NOTE: a dataclass subclass reuses its bases' `dataclasses.Field` objects and makes a new
    one for a field it declares again (``status: str``): that field is the subclass's own, a
    plain field of its declared type, never turned into a `Sample.Status`
    (docs/architecture/samples-and-values.md, "Samples and values").
    """
    mine = _dataclass_fields(cls)
    return frozenset(k for k in _SAMPLE_OWNED if mine.get(k) is _dataclass_fields(Sample)[k])


def _dataclass_fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    fields: dict[str, dataclasses.Field[Any]] = {f.name: f for f in dataclasses.fields(cls)}
    return fields
