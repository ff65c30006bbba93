"""A field-for-field stand-in for ``vime.utils.types.Sample`` (vllm-project/vime 2b83ea20, vime/utils/types.py), written in this
project's own code from the upstream definition, so that tests save and load the class a vime
rollout hands its users, under the module path and qualified names it has there
(``vime.utils.types.Sample``, ``Sample.Status``, ``Sample.SpecInfo``, ``Sample.PrefixCacheInfo``).

tests/frameworks/ is put on ``sys.path`` by the tests that use it (tests/codec/test_frameworks.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # upstream's lazy-tensor types; only named in annotations
    TensorRef = Any
    DiskTensorRef = Any

import numpy as np
import torch

__all__ = ["DECLARED_FIELDS", "DECLARED_NESTED", "Sample"]

_COMMON_HEAD = [
    "group_index",
    "index",
    "rollout_id",
    "prompt",
    "tokens",
    "multimodal_inputs",
    "multimodal_train_inputs",
    "multimodal_train_input_id",
    "apply_chat_template_kwargs",
    "response",
    "response_length",
    "label",
    "reward",
    "loss_mask",
    "weight_versions",
    "rollout_log_probs",
]
_COMMON_TAIL = [
    "remove_sample",
    "teacher_log_probs",
    "status",
    "metadata",
    "generate_function_path",
    "custom_rm_path",
    "train_metadata",
    "session_id",
    "non_generation_time",
    "spec_info",
    "prefix_cache_info",
]

DECLARED_FIELDS: dict[str, list[str]] = {
    "slime": [
        *_COMMON_HEAD,
        "rollout_top_p_token_ids",
        "rollout_top_p_token_offsets",
        "rollout_routed_experts",
        *_COMMON_TAIL,
    ],
    "vime": [
        *_COMMON_HEAD,
        "rollout_topk_token_ids",
        "rollout_topk_log_probs",
        "rollout_top_p_token_ids",
        "rollout_top_p_token_offsets",
        "rollout_top_p_log_probs",
        "rollout_routed_experts",
        *_COMMON_TAIL,
    ],
}

# Nested classes, identical in both frameworks.
DECLARED_NESTED: dict[str, Any] = {
    "Status": {
        "PENDING": "pending",
        "COMPLETED": "completed",
        "TRUNCATED": "truncated",
        "ABORTED": "aborted",
        "FAILED": "failed",
    },
    "SpecInfo": [
        "spec_accept_token_num",
        "spec_draft_token_num",
        "spec_verify_ct",
        "completion_token_num",
    ],
    "PrefixCacheInfo": ["cached_tokens", "total_prompt_tokens"],
}


# ---------------------------------------------------------------------------
# Shared behaviour (kept outside the dataclasses so the field lists stay exact)
# ---------------------------------------------------------------------------


def _sample_to_dict(sample) -> dict[str, Any]:
    """Upstream semantics: a *shallow* copy of ``__dict__`` (dynamic attributes
    included, tensors/lists shared, not copied), with ``status`` replaced by its
    string value and both info objects replaced by plain dicts."""
    out = dict(sample.__dict__)
    out["status"] = sample.status.value
    out["spec_info"] = sample.spec_info.to_dict()
    out["prefix_cache_info"] = sample.prefix_cache_info.to_dict()
    return out


def _sample_from_dict(cls, data: dict[str, Any]):
    """Upstream semantics: ``data["status"]`` is required; infos default to
    zeroed objects; keys that are not dataclass fields become attributes."""
    data = dict(data)
    data["status"] = cls.Status(data["status"])
    data["spec_info"] = cls.SpecInfo.from_dict(data.get("spec_info", {}))
    data["prefix_cache_info"] = cls.PrefixCacheInfo.from_dict(data.get("prefix_cache_info", {}))
    names = set(cls.__dataclass_fields__)
    obj = cls(**{k: v for k, v in data.items() if k in names})
    for key, value in data.items():
        if key not in names:
            setattr(obj, key, value)
    return obj


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


@dataclass
class Sample:
    """Field-for-field stand-in for ``vime.utils.types.Sample``.

    ``TensorRef`` (straw.tensor) and ``DiskTensorRef`` (vime.data.tensor) appear
    only in annotations; with postponed evaluation they are never resolved."""

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_topk_token_ids: (
        np.ndarray | torch.Tensor | list[list[int]] | TensorRef | DiskTensorRef | None
    ) = None
    rollout_topk_log_probs: (
        np.ndarray | torch.Tensor | list[list[float]] | TensorRef | DiskTensorRef | None
    ) = None
    rollout_top_p_token_ids: list[int] | torch.Tensor | TensorRef | None = None
    rollout_top_p_token_offsets: list[int] | torch.Tensor | TensorRef | None = None
    rollout_top_p_log_probs: np.ndarray | torch.Tensor | list[float] | TensorRef | None = None
    rollout_routed_experts: (
        list[list[int]] | list[torch.Tensor] | torch.Tensor | TensorRef | DiskTensorRef | None
    ) = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0

    @dataclass
    class SpecInfo:
        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

        @property
        def spec_accept_rate(self) -> float:
            return _ratio(self.spec_accept_token_num, self.spec_draft_token_num)

        @property
        def spec_accept_length(self) -> float:
            return _ratio(self.completion_token_num, self.spec_verify_ct)

        def add(self, meta_info: dict) -> None:
            self.spec_accept_token_num += meta_info.get("spec_accept_token_num", 0)
            self.spec_draft_token_num += meta_info.get("spec_draft_token_num", 0)
            self.spec_verify_ct += meta_info.get("spec_verify_ct", 0)
            self.completion_token_num += meta_info.get("completion_tokens", 0)

        def to_dict(self) -> dict[str, int]:
            return {name: getattr(self, name) for name in DECLARED_NESTED["SpecInfo"]}

        @staticmethod
        def from_dict(data: dict):
            info = Sample.SpecInfo()
            for name in DECLARED_NESTED["SpecInfo"]:
                setattr(info, name, data.get(name, 0))
            return info

    spec_info: SpecInfo = field(default_factory=SpecInfo)

    @dataclass
    class PrefixCacheInfo:
        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        @property
        def prefix_cache_hit_rate(self) -> float:
            return _ratio(self.cached_tokens, self.total_prompt_tokens)

        def add(self, meta_info: dict) -> None:
            self.cached_tokens += meta_info.get("cached_tokens", 0)
            self.total_prompt_tokens += meta_info.get("prompt_tokens", 0)

        def to_dict(self) -> dict[str, int]:
            return {
                "cached_tokens": self.cached_tokens,
                "total_prompt_tokens": self.total_prompt_tokens,
            }

        @staticmethod
        def from_dict(data: dict):
            info = Sample.PrefixCacheInfo()
            info.cached_tokens = data.get("cached_tokens", 0)
            info.total_prompt_tokens = data.get("total_prompt_tokens", 0)
            return info

    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    def to_dict(self) -> dict[str, Any]:
        return _sample_to_dict(self)

    @staticmethod
    def from_dict(data: dict) -> Sample:
        return _sample_from_dict(Sample, data)

    def get_reward_value(self, args) -> float:
        return self.reward if not args.reward_key else self.reward[args.reward_key]

    @property
    def effective_response_length(self) -> int:
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

    def get_rollout_routed_experts_length(self) -> int:
        """Rows of routed-experts data; handles the list-of-chunks form."""
        value = self.rollout_routed_experts
        if value is None:
            return 0
        if isinstance(value, list) and value and all(torch.is_tensor(v) for v in value):
            return sum(int(v.shape[0]) for v in value)
        if isinstance(value, list) and not value:
            return 0
        return int(torch.as_tensor(value).shape[0])

    def materialize_rollout_routed_experts(self, *, replace: bool = True) -> Any:
        """Upstream's: the routed experts as one contiguous CPU tensor (chunks concatenated,
        a lazy ref loaded), kept in the field unless ``replace`` is False."""
        routes = self.rollout_routed_experts
        if routes is None:
            return None
        if torch.is_tensor(routes):
            tensor = routes
        elif hasattr(routes, "load"):
            tensor = routes.load()
        elif isinstance(routes, list) and routes and all(torch.is_tensor(r) for r in routes):
            tensor = torch.cat(routes, dim=0) if len(routes) > 1 else routes[0]
        else:
            tensor = torch.as_tensor(routes, dtype=torch.int32)
        tensor = tensor.detach().cpu().contiguous()
        if replace:
            self.rollout_routed_experts = tensor
        return tensor
