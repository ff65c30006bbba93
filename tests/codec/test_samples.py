"""Tests for archive_manager.samples: Sample, the class registry, adapters, keys."""

from __future__ import annotations

import dataclasses
import enum
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from archive_manager.errors import (
    InvalidNameError,
    UnencodableError,
    UnsupportedFormatError,
)
from archive_manager.samples import (
    SAMPLE_CLASS_NAME,
    Sample,
    fields_to_sample,
    register_sample_class,
    registered_class,
    registered_name,
    sample_key,
    sample_to_fields,
    task_key_of,
)

# Field names of slime's Sample (slime/utils/types.py) that must exist with these defaults.
SLIME_DEFAULTS: dict[str, Any] = {
    "group_index": None,
    "index": None,
    "rollout_id": None,
    "prompt": "",
    "tokens": [],
    "multimodal_inputs": None,
    "multimodal_train_inputs": None,
    "response": "",
    "response_length": 0,
    "label": None,
    "reward": None,
    "loss_mask": None,
    "weight_versions": [],
    "rollout_log_probs": None,
    "rollout_top_p_token_ids": None,
    "rollout_top_p_token_offsets": None,
    "rollout_routed_experts": None,
    "remove_sample": False,
    "teacher_log_probs": None,
    "status": Sample.Status.PENDING,
    "metadata": {},
    "generate_function_path": None,
    "train_metadata": None,
    "session_id": None,
    "non_generation_time": 0.0,
}


def make_sample(**overrides: Any) -> Sample:
    values: dict[str, Any] = {
        "group_index": 3,
        "index": 25,
        "prompt": [{"role": "user", "content": "2+2?"}],
        "tokens": [101, 102, 103, 7, 8],
        "response": "4",
        "response_length": 2,
        "label": "4",
        "reward": 1.0,
        "loss_mask": [1, 1],
        "weight_versions": ["v1"],
        "rollout_log_probs": [-0.25, -0.5],
        "status": Sample.Status.COMPLETED,
        "metadata": {"source": "gsm8k"},
    }
    values.update(overrides)
    return Sample(**values)


# --------------------------------------------------------------------------- Sample


def test_defaults_match_slime() -> None:
    sample = Sample()
    for name, default in SLIME_DEFAULTS.items():
        assert getattr(sample, name) == default, name
    assert sample.spec_info == Sample.SpecInfo()
    assert sample.prefix_cache_info == Sample.PrefixCacheInfo()
    assert not hasattr(Sample, "__slots__")


def test_mutable_defaults_are_not_shared() -> None:
    a, b = Sample(), Sample()
    a.tokens.append(1)
    a.metadata["x"] = 1
    a.spec_info.spec_verify_ct = 3
    assert b.tokens == [] and b.metadata == {} and b.spec_info.spec_verify_ct == 0


def test_status_values() -> None:
    assert [s.value for s in Sample.Status] == [
        "pending",
        "completed",
        "truncated",
        "aborted",
        "failed",
    ]


def test_to_dict_has_every_field_status_string_and_helper_dicts() -> None:
    sample = make_sample()
    sample.spec_info.spec_accept_token_num = 4
    data = sample.to_dict()
    assert {f.name for f in dataclasses.fields(Sample)} <= set(data)
    assert data["status"] == "completed"
    assert data["spec_info"]["spec_accept_token_num"] == 4
    assert data["prefix_cache_info"] == {"cached_tokens": 0, "total_prompt_tokens": 0}
    # to_dict does not change the sample itself
    assert sample.status is Sample.Status.COMPLETED
    assert isinstance(sample.spec_info, Sample.SpecInfo)


def test_round_trip_keeps_extra_attributes() -> None:
    sample: Any = make_sample()
    sample.custom_score = 0.75  # a framework-specific attribute
    sample.prefix_cache_info.cached_tokens = 12
    back: Any = Sample.from_dict(sample.to_dict())
    assert back == sample
    assert back.custom_score == 0.75
    assert back.status is Sample.Status.COMPLETED
    assert back.prefix_cache_info.cached_tokens == 12


def test_from_dict_sets_unknown_keys_as_attributes() -> None:
    back: Any = Sample.from_dict({"status": "truncated", "index": 1, "verifier": {"ok": True}})
    assert back.status is Sample.Status.TRUNCATED
    assert back.verifier == {"ok": True}
    assert back.spec_info == Sample.SpecInfo()


def test_from_dict_missing_status_is_pending_and_bad_status_raises() -> None:
    assert Sample.from_dict({}).status is Sample.Status.PENDING
    with pytest.raises(ValueError):
        Sample.from_dict({"status": "exploded"})


def test_from_dict_on_subclass_builds_subclass() -> None:
    @dataclasses.dataclass
    class TaggedSample(Sample):
        tag: str = "none"

    back = TaggedSample.from_dict({"tag": "x", "status": "failed"})
    assert type(back) is TaggedSample and back.tag == "x"
    assert back.status is Sample.Status.FAILED


def test_round_trip_with_tensors_keeps_them() -> None:
    experts = torch.arange(4 * 2 * 2, dtype=torch.int32).reshape(4, 2, 2)
    sample = make_sample(rollout_routed_experts=experts)
    back = Sample.from_dict(sample.to_dict())
    assert back.rollout_routed_experts is experts


def test_helpers_accumulate_like_slime() -> None:
    spec = Sample.SpecInfo()
    spec.add({"spec_accept_token_num": 6, "spec_draft_token_num": 8, "spec_verify_ct": 2})
    spec.add({"completion_tokens": 10})
    assert spec.spec_accept_rate == 0.75
    assert spec.spec_accept_length == 5.0
    assert Sample.SpecInfo().spec_accept_rate == 0.0
    prefix = Sample.PrefixCacheInfo()
    prefix.add({"cached_tokens": 3, "prompt_tokens": 4})
    assert prefix.prefix_cache_hit_rate == 0.75
    assert Sample.PrefixCacheInfo.from_dict({"cached_tokens": 1}).total_prompt_tokens == 0


def test_reward_value_and_effective_length() -> None:
    sample = make_sample(reward={"acc": 1.0, "fmt": 0.5}, loss_mask=[1, 0])
    assert sample.get_reward_value(SimpleNamespace(reward_key="fmt")) == 0.5
    assert make_sample().get_reward_value(SimpleNamespace(reward_key=None)) == 1.0
    assert sample.effective_response_length == 1
    assert make_sample(loss_mask=None).effective_response_length == 2


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=10,
)


@given(
    index=st.none() | st.integers(min_value=0),
    tokens=st.lists(st.integers(min_value=0, max_value=151_999), max_size=50),
    status=st.sampled_from(list(Sample.Status)),
    reward=st.none()
    | st.floats(allow_nan=False)
    | st.dictionaries(st.text(), st.floats(allow_nan=False)),
    metadata=st.dictionaries(st.text(), json_values, max_size=4),
    extras=st.dictionaries(st.from_regex(r"x_[a-z]{1,8}", fullmatch=True), json_values, max_size=3),
)
def test_round_trip_property(
    index: int | None,
    tokens: list[int],
    status: Sample.Status,
    reward: Any,
    metadata: dict[str, Any],
    extras: dict[str, Any],
) -> None:
    sample = Sample(index=index, tokens=tokens, status=status, reward=reward, metadata=metadata)
    for key, value in extras.items():
        setattr(sample, key, value)
    data = sample.to_dict()
    assert data["status"] == status.value
    back = Sample.from_dict(data)
    assert back.to_dict() == data
    for key, value in extras.items():
        assert getattr(back, key) == value


# --------------------------------------------------------------------------- registry


def test_sample_is_registered() -> None:
    assert registered_class(SAMPLE_CLASS_NAME) is Sample
    assert registered_name(Sample) == "archive_manager.Sample"
    assert registered_class("no.such.Class") is None


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@register_sample_class
@dataclasses.dataclass
class Trajectory:
    """A non-slime sample type, registered under its default name."""

    steps: list[int] = dataclasses.field(default_factory=list)
    color: Color = Color.RED
    maybe_color: Color | None = None
    score: float = 0.0


def test_register_default_name_and_decorator() -> None:
    name = f"{Trajectory.__module__}.{Trajectory.__qualname__}"
    assert registered_class(name) is Trajectory
    assert registered_name(Trajectory) == name
    assert register_sample_class(Trajectory) is Trajectory  # idempotent


def test_registered_dataclass_round_trip_with_enums_and_extras() -> None:
    traj: Any = Trajectory(steps=[1, 2], color=Color.BLUE, maybe_color=Color.RED, score=0.5)
    traj.note = "extra"
    name, fields = sample_to_fields(traj)
    assert name == registered_name(Trajectory)
    assert fields == {
        "steps": [1, 2],
        "color": "blue",
        "maybe_color": "red",
        "score": 0.5,
        "note": "extra",
    }
    back: Any = fields_to_sample(name, fields)
    assert type(back) is Trajectory
    assert back == traj and vars(back)["note"] == "extra"
    assert back.color is Color.BLUE and back.maybe_color is Color.RED


def test_registered_slots_dataclass() -> None:
    @dataclasses.dataclass(slots=True)
    class Slotted:
        a: int = 0
        b: str = ""

    register_sample_class(Slotted, "tests.Slotted")
    name, fields = sample_to_fields(Slotted(a=1, b="x"))
    assert (name, fields) == ("tests.Slotted", {"a": 1, "b": "x"})
    assert fields_to_sample(name, fields) == Slotted(a=1, b="x")


def test_register_rejects_non_dataclasses_and_name_clashes() -> None:
    class Plain:
        pass

    with pytest.raises(UnencodableError):
        register_sample_class(Plain)
    with pytest.raises(UnencodableError):
        register_sample_class(Trajectory(), "tests.instance")  # type: ignore[arg-type]

    @dataclasses.dataclass
    class Other:
        x: int = 0

    with pytest.raises(InvalidNameError, match="already registered"):
        register_sample_class(Other, SAMPLE_CLASS_NAME)
    with pytest.raises(InvalidNameError, match="already registered"):
        register_sample_class(Trajectory, "tests.another-name")
    with pytest.raises(InvalidNameError):
        register_sample_class(Other, "")


def test_redefined_class_replaces_its_predecessor() -> None:
    def define() -> type:
        @dataclasses.dataclass
        class Reloaded:
            x: int = 0

        return Reloaded

    first, second = define(), define()
    register_sample_class(first, "tests.Reloaded")
    register_sample_class(second, "tests.Reloaded")
    assert registered_class("tests.Reloaded") is second
    assert registered_name(first) is None


def test_unregistered_dataclass_is_unencodable_with_a_hint() -> None:
    @dataclasses.dataclass
    class Unregistered:
        x: int = 0

    with pytest.raises(UnencodableError, match=r"Unregistered.*register_sample_class"):
        sample_to_fields(Unregistered())


def test_unregistered_sample_subclass_is_unencodable() -> None:
    @dataclasses.dataclass
    class MySample(Sample):
        extra: int = 0

    with pytest.raises(UnencodableError, match="MySample"):
        sample_to_fields(MySample())
    register_sample_class(MySample, "tests.MySample")
    name, fields = sample_to_fields(MySample(extra=5, status=Sample.Status.ABORTED))
    assert name == "tests.MySample" and fields["status"] == "aborted"
    back = fields_to_sample(name, fields)
    assert type(back) is MySample and back.extra == 5
    assert back.status is Sample.Status.ABORTED


@pytest.mark.parametrize("obj", [object(), 42, "text", [1, 2]])
def test_other_objects_are_unencodable(obj: object) -> None:
    with pytest.raises(UnencodableError, match=type(obj).__qualname__):
        sample_to_fields(obj)


def test_sample_to_fields_for_sample_and_dict() -> None:
    sample = make_sample()
    name, fields = sample_to_fields(sample)
    assert name == SAMPLE_CLASS_NAME
    assert fields == sample.to_dict()
    source = {"index": 1, "tokens": [1, 2]}
    name, fields = sample_to_fields(source)
    assert name is None and fields == source and fields is not source


# The warning is checked in tests/codec/test_frameworks.py (once per name); here the value.
@pytest.mark.filterwarnings("ignore::archive_manager.errors.UnregisteredClassWarning")
def test_unknown_or_missing_name_gives_a_dict_and_imports_nothing() -> None:
    fields = {"index": 1, "status": "completed"}
    for name in (None, "os.system", "archive_manager.samples.Sample", "builtins.eval"):
        back = fields_to_sample(name, fields)
        assert type(back) is dict and back == fields and back is not fields


def test_fields_to_sample_sample() -> None:
    sample = make_sample()
    back = fields_to_sample(*sample_to_fields(sample))
    assert isinstance(back, Sample) and back == sample


def test_fields_that_no_longer_fit_the_class_raise_a_clear_error() -> None:
    with pytest.raises(UnsupportedFormatError, match=r"archive_manager\.Sample"):
        fields_to_sample(SAMPLE_CLASS_NAME, {"status": "not-a-status"})


# --------------------------------------------------------------------------- _queue_*


def test_queue_attributes_are_never_stored() -> None:
    sample: Any = make_sample()
    sample._queue_receipt = {"task_id": "t1"}
    sample._queue_lease = SimpleNamespace(task_id="t1")
    _, fields = sample_to_fields(sample)
    assert not any(k.startswith("_queue_") for k in fields)
    assert hasattr(sample, "_queue_receipt")  # the live sample keeps its control state

    traj: Any = Trajectory(steps=[1])
    traj._queue_lease = {"task_id": 9}
    assert "_queue_lease" not in sample_to_fields(traj)[1]

    record = {"index": 1, "_queue_receipt": {"task_id": "t"}, "_other": 1}
    _, fields = sample_to_fields(record)
    assert fields == {"index": 1, "_other": 1}
    assert "_queue_receipt" in record


def test_queue_keys_are_stripped_on_load() -> None:
    fields = {"index": 1, "_queue_lease": {"task_id": "x"}}
    assert fields_to_sample(None, fields) == {"index": 1}
    back = fields_to_sample(SAMPLE_CLASS_NAME, fields)
    assert not hasattr(back, "_queue_lease")


# --------------------------------------------------------------------------- keys


def test_sample_key() -> None:
    assert sample_key(make_sample(index=0), 5) == "sample:0"
    assert sample_key(make_sample(index=None), 5) == "position:5"
    assert sample_key({"index": 7}, 0) == "sample:7"
    assert sample_key({"tokens": []}, 3) == "position:3"
    assert sample_key({"index": None}, 3) == "position:3"
    assert sample_key(Trajectory(), 2) == "position:2"  # no index attribute at all


def test_duplicate_indices_give_duplicate_keys() -> None:
    samples = [make_sample(index=4), make_sample(index=4), make_sample(index=None)]
    keys = [sample_key(s, i) for i, s in enumerate(samples)]
    assert keys == ["sample:4", "sample:4", "position:2"]


@given(st.lists(st.none() | st.integers(min_value=0, max_value=5), max_size=20))
def test_sample_key_property(indices: list[int | None]) -> None:
    for position, index in enumerate(indices):
        key = sample_key({"index": index}, position)
        expected = f"position:{position}" if index is None else f"sample:{index}"
        assert key == expected == sample_key(Sample(index=index), position)


def test_task_key_of_attribute_and_dict_key() -> None:
    sample: Any = make_sample()
    sample.task_key = "prompt-7"
    assert task_key_of(sample) == "prompt-7"
    assert task_key_of({"task_key": "prompt-8"}) == "prompt-8"


def test_task_key_of_receipt_mapping_and_lease_object() -> None:
    sample: Any = make_sample()
    sample._queue_receipt = {"task_id": "q-1", "attempt": 2}
    assert task_key_of(sample) == "q-1"
    other: Any = make_sample()
    other._queue_lease = SimpleNamespace(task_id="q-2")
    assert task_key_of(other) == "q-2"
    assert task_key_of({"_queue_lease": {"task_id": "q-3"}}) == "q-3"


def test_task_key_of_precedence_and_conversion() -> None:
    both = {"task_key": "explicit", "_queue_receipt": {"task_id": "from-receipt"}}
    assert task_key_of(both) == "explicit"
    unset = {"task_key": None, "_queue_receipt": {"task_id": 12}}
    assert task_key_of(unset) == "12"
    receipt_without_id = {"_queue_receipt": {}, "_queue_lease": SimpleNamespace(task_id=3)}
    assert task_key_of(receipt_without_id) == "3"
    assert task_key_of({"task_key": 42}) == "42"


def test_task_key_of_none() -> None:
    assert task_key_of(make_sample()) is None
    assert task_key_of({}) is None
    assert task_key_of({"_queue_receipt": None}) is None


def test_task_key_must_be_read_before_stripping() -> None:
    sample: Any = make_sample()
    sample._queue_receipt = {"task_id": "q-9"}
    assert task_key_of(sample) == "q-9"
    _, fields = sample_to_fields(sample)
    assert task_key_of(fields) is None


# `_dataclass_state` copies ``__dict__`` whole when the declared fields are its first entries
# in order and attribute access is not overridden; every other case takes the getattr loop.
# Both must give what the loop gives: the declared fields (getattr), then the other attributes.
def _state_by_the_loop(obj: Any) -> dict[str, Any]:
    import dataclasses as dc

    # object.__getattribute__: the loop reads as `_rebuild` writes, past the class's own
    # __getattribute__ (the encoder fast paths: what it made of a field loaded through it again)
    fields = {f.name: object.__getattribute__(obj, f.name) for f in dc.fields(obj)}
    for key, value in vars(obj).items():
        fields.setdefault(key, value)
    return {k: v for k, v in fields.items() if not str(k).startswith("_queue_")}


@dataclasses.dataclass
class _Ordered:
    a: int = 1
    b: str = "x"


@dataclasses.dataclass
class _Reordered:
    a: int = 1
    b: str = "x"

    def __post_init__(self) -> None:
        del self.a  # __dict__ now holds b before a
        self.a = 5


@dataclasses.dataclass
class _Looked:
    a: int = 1
    b: str = "x"

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        return value * 2 if name == "a" else value


def test_dataclass_state_copies_dict_only_when_it_is_the_loop() -> None:
    from archive_manager.samples.records import _dataclass_state

    plain = _Ordered()
    plain.extra = [1]  # type: ignore[attr-defined]
    plain._queue_live = 3  # type: ignore[attr-defined]
    reordered = _Reordered()
    looked = _Looked()
    for obj in (plain, reordered, looked, _Ordered(b="y")):
        state = _dataclass_state(obj)
        assert state == _state_by_the_loop(obj)
        assert list(state) == list(_state_by_the_loop(obj))  # the order too
    # the stored field, not what its __getattribute__ makes of it (which the loaded
    # instance applies again)
    assert _dataclass_state(looked)["a"] == 1
    assert list(_dataclass_state(reordered)) == ["a", "b"]


def test_dataclass_state_still_refuses_an_attribute_a_property_shadows() -> None:
    from archive_manager.errors import UnencodableError
    from archive_manager.samples.records import _dataclass_state

    @dataclasses.dataclass
    class Shadowed:
        a: int = 1

        @property
        def p(self) -> int:
            return 0

    obj = Shadowed()
    obj.__dict__["p"] = 9  # behind the class's back
    with pytest.raises(UnencodableError, match="property or another data descriptor"):
        _dataclass_state(obj)
